"""Vertex AI's custom-container serving contract, read from the environment once.

Vertex AI sets the port (`AIP_HTTP_PORT`, the first `containerSpec.ports` entry), the two
routes it forwards (`AIP_PREDICT_ROUTE`, `AIP_HEALTH_ROUTE`: their defaults hold the endpoint
and deployed model ids, so they are never hard-coded) and `AIP_STORAGE_URI`, the copy of the
model's `artifactUri` this container downloads itself. Without them (a local run, `docker
run`) the server listens on 8080 at /predict and /health.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_PORT = 8080
DEFAULT_PREDICT_ROUTE = "/predict"
DEFAULT_HEALTH_ROUTE = "/health"


@dataclass(frozen=True)
class Contract:
    port: int
    predict_route: str
    health_route: str
    storage_uri: str | None
    """Where the model is when no model is named on the command line; None if unset."""

    @classmethod
    def from_environment(cls, env: Mapping[str, str]) -> Contract:
        return cls(
            port=int(env.get("AIP_HTTP_PORT") or DEFAULT_PORT),
            predict_route=env.get("AIP_PREDICT_ROUTE") or DEFAULT_PREDICT_ROUTE,
            health_route=env.get("AIP_HEALTH_ROUTE") or DEFAULT_HEALTH_ROUTE,
            storage_uri=env.get("AIP_STORAGE_URI") or None,
        )
