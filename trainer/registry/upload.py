"""The Vertex AI SDK's upload of a delivered model (`aiplatform.Model.upload`), as a new model
or as a new version of the model already named so.

The container spec is what docker/Dockerfile's `serve` target runs and what trainer/serve's
contract answers: `python -m trainer.serve` (it serves `AIP_STORAGE_URI`, Vertex AI's copy of
`artifactUri`), port 8080, `/predict` and `/health`; Vertex AI hands the routes and port to
the server as `AIP_PREDICT_ROUTE`, `AIP_HEALTH_ROUTE` and `AIP_HTTP_PORT`.

The SDK talks REST (not gRPC) everywhere, so the path the tests drive against a capture
server on loopback (tests/support/vertex_capture.py) is the one real runs take. Credentials
are Application Default Credentials, except for an `api_endpoint` on this machine's loopback
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


def upload_model(
    name: str,
    artifact_uri: str,
    serving_image: str,
    serving_env: Mapping[str, str],
    labels: Mapping[str, str],
    version_aliases: tuple[str, ...] = (),
    deployment_timeout_s: int | None = None,
) -> Uploaded:
    """Upload the model at `artifact_uri` (gs://) as `name`: a new version, made the default,
    of the model already named so, else a new model. Raises the SDK's errors
    (google.api_core.exceptions.GoogleAPICallError) as they come."""
    from google.cloud import aiplatform

    parent = model_named(name)
    model = aiplatform.Model.upload(
        display_name=name,
        artifact_uri=artifact_uri,
        parent_model=parent,
        is_default_version=True,
        serving_container_image_uri=serving_image,
        serving_container_command=SERVE_COMMAND,
        serving_container_ports=[SERVE_PORT],
        serving_container_predict_route=PREDICT_ROUTE,
        serving_container_health_route=HEALTH_ROUTE,
        serving_container_environment_variables=dict(serving_env) or None,
        serving_container_deployment_timeout=deployment_timeout_s,
        version_aliases=list(version_aliases) or None,
        labels=dict(labels),
    )
    return Uploaded(model.resource_name, model.version_id, new_model=parent is None)
