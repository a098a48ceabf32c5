"""The upload of a delivered model to the Vertex AI Model Registry, as a new model or as a
new version of the model already named so: the request built from `aiplatform_v1` types and
sent with the GAPIC ModelServiceClient (the SDK's `aiplatform.Model.upload` takes a startup
probe's exec command, period and timeout only: no HTTP action, no failure threshold), the
existing model found with the SDK's `aiplatform.Model.list`.

The container spec is what docker/Dockerfile's `serve` target runs and what trainer/serve's
contract answers: `python -m trainer.serve` (it serves `AIP_STORAGE_URI`, Vertex AI's copy of
`artifactUri`), port 8080, `/predict` and `/health`; Vertex AI hands the routes and port to
the server as `AIP_PREDICT_ROUTE`, `AIP_HEALTH_ROUTE` and `AIP_HTTP_PORT`. Its startupProbe
and healthProbe ask the health route (`probes`).

Both clients talk REST (not gRPC), so the path the tests drive against a capture server on
loopback (tests/support/vertex_capture.py) is the one real runs take. Credentials are
Application Default Credentials, except for an `api_endpoint` on this machine's loopback
(a test's server), which gets anonymous ones: nothing of the user's is ever sent there.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

SERVE_COMMAND = ["python", "-m", "trainer.serve"]
SERVE_PORT = 8080
PREDICT_ROUTE = "/predict"
HEALTH_ROUTE = "/health"
"""trainer/serve/contract.py's defaults (the serving layer sits above this one)."""
PROBE_PERIOD_S = 10
"""How often the probes ask (the API's default period)."""
PROBE_TIMEOUT_S = 15
"""How long one probe may take. `Probe`'s field docs ask for a period less than the timeout
(and a timeout at least the period), unlike Kubernetes: 10 and 15 meet both wordings."""
MAX_DEPLOYMENT_TIMEOUT_S = 2 * 3600
"""`ModelContainerSpec.deployment_timeout`'s limit: 2 hours. Also what the startup probe
allows without --deployment_timeout_s, so that the deployment's own timeout decides."""
HEALTH_FAILURES = 3
"""Failed health probes in a row before a replica leaves routing (the API's default)."""
UPLOAD_WAIT_S = 600
"""How long the upload's long-running operation may take to finish."""

LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}
SDK_LOGGERS = ("google.cloud.aiplatform.models", "google.cloud.aiplatform.base")
"""The SDK's own INFO lines ("Creating Model", a snippet of code to reuse it) on stdout would
bury the one line this project prints."""


@dataclass(frozen=True)
class VertexPlace:
    """Where the registry is: project, region, and (tests, private endpoints) the API's
    address, `host:port` or `http(s)://host:port`."""

    project: str
    region: str
    api_endpoint: str | None = None

    @property
    def on_loopback(self) -> bool:
        if not self.api_endpoint:
            return False
        address = self.api_endpoint if "://" in self.api_endpoint else f"//{self.api_endpoint}"
        return urlsplit(address).hostname in LOOPBACK_HOSTS


@dataclass(frozen=True)
class Uploaded:
    resource_name: str
    """projects/PROJECT/locations/REGION/models/ID, the same for every version."""
    version_id: str
    new_model: bool
    """False when the upload became a new version of a model of the same name."""


def connect(place: VertexPlace) -> None:
    """Point the SDK at `place` for this process (`aiplatform.init` is process-wide)."""
    from google.cloud import aiplatform

    credentials = None
    if place.on_loopback:
        from google.auth.credentials import AnonymousCredentials

        credentials = AnonymousCredentials()
    for name in SDK_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    aiplatform.init(
        project=place.project, location=place.region, api_endpoint=place.api_endpoint,
        credentials=credentials, api_transport="rest",
    )  # fmt: skip


def model_named(name: str) -> str | None:
    """The resource name of the newest model whose display name is `name`, if any (display
    names are not unique in Vertex AI: the newest is the one a person last registered). The
    name is quoted as the list filter's string literal (a `"` or `\\` in it escaped)."""
    import json

    from google.cloud import aiplatform

    literal = json.dumps(name, ensure_ascii=False)
    found = aiplatform.Model.list(filter=f"display_name={literal}", order_by="create_time desc")
    return found[0].resource_name if found else None


def probes(deployment_timeout_s: int | None) -> tuple[object, object]:
    """The container's startupProbe and healthProbe (aiplatform_v1 `Probe`s): HTTP GET on the
    server's health route and port, every PROBE_PERIOD_S. The startup probe fails until the
    model is loaded (health answers 503 until then) and gives up only after the deployment
    timeout (given, else the API's 2-hour limit, so Vertex AI's own default still governs):
    it never ends a load the deployment would allow. The health (readiness) probe takes a
    replica out of routing after 3 failures in a row (its batching loop dead, say)."""
    from google.cloud.aiplatform_v1 import types

    allowed = deployment_timeout_s or MAX_DEPLOYMENT_TIMEOUT_S
    startup = types.Probe(
        http_get=types.Probe.HttpGetAction(path=HEALTH_ROUTE, port=SERVE_PORT),
        period_seconds=PROBE_PERIOD_S, timeout_seconds=PROBE_TIMEOUT_S,
        failure_threshold=-(-allowed // PROBE_PERIOD_S),
    )  # fmt: skip
    health = types.Probe(
        http_get=types.Probe.HttpGetAction(path=HEALTH_ROUTE, port=SERVE_PORT),
        period_seconds=PROBE_PERIOD_S, timeout_seconds=PROBE_TIMEOUT_S,
        failure_threshold=HEALTH_FAILURES,
    )  # fmt: skip
    return startup, health


def upload_request(
    name: str,
    artifact_uri: str,
    serving_image: str,
    serving_env: Mapping[str, str],
    labels: Mapping[str, str],
    version_aliases: tuple[str, ...] = (),
    deployment_timeout_s: int | None = None,
    parent: str | None = None,
    invoke_routes: bool = False,
):
    """The `UploadModelRequest` (aiplatform_v1 types, as the REST body goes) for the model at
    `artifact_uri` as `name`, made the default version (alias `default`, as the SDK adds it);
    `parent`: the model it is a new version of; `invoke_routes`: invokeRoutePrefix `/*` (every
    route through `invoke`). The request's own `parent` (the location) is the caller's."""
    from google.cloud.aiplatform_v1 import types
    from google.protobuf import duration_pb2

    startup, health = probes(deployment_timeout_s)
    spec = types.ModelContainerSpec(
        image_uri=serving_image,
        command=SERVE_COMMAND,
        ports=[types.Port(container_port=SERVE_PORT)],
        predict_route=PREDICT_ROUTE,
        health_route=HEALTH_ROUTE,
        env=[types.EnvVar(name=key, value=value) for key, value in serving_env.items()],
        startup_probe=startup,
        health_probe=health,
        invoke_route_prefix="/*" if invoke_routes else "",
    )
    if deployment_timeout_s is not None:
        spec.deployment_timeout = duration_pb2.Duration(seconds=deployment_timeout_s)
    aliases = [*version_aliases, *(["default"] if "default" not in version_aliases else [])]
    model = types.Model(display_name=name, artifact_uri=artifact_uri, container_spec=spec,
                        labels=dict(labels), version_aliases=aliases)  # fmt: skip
    return types.UploadModelRequest(model=model, parent_model=parent or "")


def model_client(place: VertexPlace):
    """The GAPIC ModelServiceClient over REST for `place` (the SDK's `Model.upload` cannot send
    a probe's HTTP action or failure threshold, so the request is built and sent here)."""
    from google.api_core.client_options import ClientOptions
    from google.cloud import aiplatform_v1

    credentials = None
    if place.on_loopback:
        from google.auth.credentials import AnonymousCredentials

        credentials = AnonymousCredentials()
    address = place.api_endpoint or f"{place.region}-aiplatform.googleapis.com"
    return aiplatform_v1.ModelServiceClient(
        credentials=credentials, transport="rest",
        client_options=ClientOptions(api_endpoint=address),
    )  # fmt: skip


def upload_model(
    place: VertexPlace,
    name: str,
    artifact_uri: str,
    serving_image: str,
    serving_env: Mapping[str, str],
    labels: Mapping[str, str],
    version_aliases: tuple[str, ...] = (),
    deployment_timeout_s: int | None = None,
    invoke_routes: bool = False,
) -> Uploaded:
    """Upload the model at `artifact_uri` (gs://) as `name`: a new version, made the default,
    of the model already named so, else a new model. Raises the client's errors
    (google.api_core.exceptions.GoogleAPICallError) as they come."""
    parent = model_named(name)
    request = upload_request(name, artifact_uri, serving_image, serving_env, labels,
                             version_aliases, deployment_timeout_s, parent,
                             invoke_routes)  # fmt: skip
    request.parent = f"projects/{place.project}/locations/{place.region}"
    response = model_client(place).upload_model(request=request).result(timeout=UPLOAD_WAIT_S)
    return Uploaded(response.model, response.model_version_id, new_model=parent is None)
