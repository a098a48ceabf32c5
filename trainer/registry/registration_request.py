"""What to register, and the checks that need no request: `Registration` (the model, its
display name, the serving image, where, what its labels say) and `check_before_requests`.
Cheap to import (no SDK, no transformers): `python -m trainer.register` refuses bad input
with it before loading anything heavy, and the training chief can check at launch."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

from trainer.common.errors import UserError
from trainer.common.secrets import looks_secret
from trainer.registry.labels import check_name_and_labels, check_version_aliases
from trainer.registry.upload import MAX_DEPLOYMENT_TIMEOUT_S, VertexPlace
from trainer.storage.store import bucket_uri


@dataclass(frozen=True)
class Registration:
    """What to register: the delivered model (gs://), under which display name, served by which
    image, where; and what its labels say beyond its task (the base checkpoint, the final
    metric's name and value)."""

    model_uri: str
    name: str
    serving_image: str
    place: VertexPlace
    base_model: str | None = None
    metric: tuple[str, str] | None = None
    serving_env: Mapping[str, str] = field(default_factory=dict)
    version_aliases: tuple[str, ...] = ()
    deployment_timeout_s: int | None = None
    """The container's deploymentTimeout: how long a deployment may wait for health (a large
    model's download and load); None: Vertex AI's default."""
    invoke_routes: bool = False
    """Upload with invokeRoutePrefix `/*`: every route (the OpenAI ones) reached through
    `invoke` on a dedicated endpoint, which then refuses `:predict` and `:rawPredict`."""

    def retry_command(self) -> str:
        """The `python -m trainer.register` command line that registers this model."""
        words = ["python", "-m", "trainer.register", self.model_uri, "--name", self.name,
                 "--serving_image", self.serving_image, "--project", self.place.project,
                 "--region", self.place.region]  # fmt: skip
        if self.place.api_endpoint:
            words += ["--api_endpoint", self.place.api_endpoint]
        if self.base_model:
            words += ["--base_model", self.base_model]
        if self.metric:
            words += ["--metric", "=".join(self.metric)]
        for key, value in self.serving_env.items():
            words += ["--serving_env", f"{key}={value}"]
        for alias in self.version_aliases:
            words += ["--version_alias", alias]
        if self.deployment_timeout_s is not None:
            words += ["--deployment_timeout_s", str(self.deployment_timeout_s)]
        if self.invoke_routes:
            words.append("--invoke_routes")
        return shlex.join(words)


def image_tag(image: str) -> str | None:
    """The tag of an image reference (`...:TAG`), or its digest (`...@sha256:HEX`); None for
    an untagged one."""
    if "@" in image:
        return image.rpartition("@")[2]
    last = image.rpartition("/")[2]
    return last.rpartition(":")[2] if ":" in last else None


def registry_labels(
    task: str, base_model: str | None, metric: tuple[str, str] | None, serving_image: str
) -> dict[str, str]:
    """The model's labels, before `check_name_and_labels` makes their values fit: the task, the
    base checkpoint, the final metric and its value, the serving image's tag (each one only
    when known)."""
    labels = {"task": task, "base_model": base_model, "image_tag": image_tag(serving_image)}
    if metric:
        labels |= {"metric": metric[0], "metric_value": metric[1]}
    return {key: value for key, value in labels.items() if value}


MULTI_REGIONS = ("us", "europe", "asia")
"""Artifact Registry's multi-regional locations (`us-docker.pkg.dev`)."""


def check_serving_image(image: str, place: VertexPlace) -> None:
    """UserError unless `image` is in Artifact Registry in the registry's own region
    (`REGION-docker.pkg.dev/...`): the upload otherwise fails, after training."""
    host = image.split("/", 1)[0]
    location = host.removesuffix("-docker.pkg.dev") if host.endswith("-docker.pkg.dev") else None
    if location in MULTI_REGIONS:
        raise UserError(
            f"the serving image {image} is in a multi-regional Artifact Registry ({location}); "
            f"Vertex AI serves from a repository in the model's region: push it to "
            f"{place.region}-docker.pkg.dev (cloudbuild.yaml's _REGION)"
        )
    if location != place.region:
        where = f"in {location}" if location else "not in Artifact Registry"
        raise UserError(
            f"the serving image {image} is {where}; the model is registered in {place.region}, "
            f"so Vertex AI needs the image in {place.region}-docker.pkg.dev (cloudbuild.yaml's "
            "_REGION)"
        )


def check_before_requests(registration: Registration, region_known: bool = True) -> str:
    """The model's gs:// URI (a /gcs/ path as the gs:// URI it mirrors), or UserError for a
    URI, name, version alias, serving image or environment the registry would refuse or
    should not see. The image's region is checked when the registry's is known (a job spec
    written off the node may not know the job's region yet)."""
    check_name_and_labels(registration.name, {})
    check_version_aliases(registration.version_aliases)
    timeout = registration.deployment_timeout_s
    if timeout is not None and not 0 < timeout <= MAX_DEPLOYMENT_TIMEOUT_S:
        raise UserError(f"--deployment_timeout_s {timeout}: 1 to {MAX_DEPLOYMENT_TIMEOUT_S} "
                        "(2 hours, Vertex AI's limit)")  # fmt: skip
    uri = bucket_uri(registration.model_uri).rstrip("/")
    if not uri.startswith("gs://") or "/" not in uri.removeprefix("gs://"):
        raise UserError(
            f"{registration.model_uri} is not in Cloud Storage: Vertex AI serves a model from "
            "its gs://BUCKET/PATH folder (upload the folder there first)"
        )
    if region_known:
        check_serving_image(registration.serving_image, registration.place)
    secret = [key for key in registration.serving_env if looks_secret(key)]
    if secret:
        raise UserError(
            f"--serving_env {secret[0]} looks secret: the registry shows a container's "
            "environment in the clear to anyone who can read the model"
        )
    return uri
