"""A Secret Manager stand-in on loopback: the one REST call the launcher makes.

`GET /v1/projects/P/secrets/S/versions/V:access` answers as Secret Manager does (REST
reference, projects.secrets.versions.access): `{"name": ..., "payload": {"data": BASE64}}`
for a secret it holds, 403 PERMISSION_DENIED for one listed as denied, 404 NOT_FOUND for any
other. The real client (REST transport) talks to it through SECRET_MANAGER_EMULATOR_HOST,
so the launcher's own code path is what the tests run.
"""

from __future__ import annotations

import base64
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from tests.support.helpers import serving


class FakeSecretManager(ThreadingHTTPServer):
    def __init__(self, secrets: dict[str, str], denied: set[str]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.secrets, self.denied = secrets, denied
        self.accessed: list[str] = []
        """The resource names asked for, in order."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: FakeSecretManager

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        path = urlsplit(self.path).path  # the client adds ?$alt=json;enum-encoding=int
        resource = path.removeprefix("/v1/").removesuffix(":access")
        if not path.startswith("/v1/") or not path.endswith(":access"):
            self._reply(404, _error(404, "NOT_FOUND", f"no method at {path}"))
            return
        self.server.accessed.append(resource)
        if resource in self.server.denied:
            message = f"Permission 'secretmanager.versions.access' denied for '{resource}'"
            self._reply(403, _error(403, "PERMISSION_DENIED", message))
        elif resource in self.server.secrets:
            data = base64.b64encode(self.server.secrets[resource].encode()).decode()
            self._reply(200, {"name": resource, "payload": {"data": data}})
        else:
            self._reply(404, _error(404, "NOT_FOUND", f"Secret [{resource}] not found"))

    def _reply(self, status: int, body: dict) -> None:
        encoded = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(encoded)))
        self.end_headers()
        self.wfile.write(encoded)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - http.server's signature
        """Quiet: the tests read what the launcher prints, not the fake's access log."""


def _error(code: int, status: str, message: str) -> dict:
    """Google's JSON error body, which the client turns into PermissionDenied / NotFound."""
    return {"error": {"code": code, "message": message, "status": status}}


def running_fake(secrets: dict[str, str], denied: set[str] = frozenset()):
    """The fake, serving on a thread for a `with` block."""
    return serving(FakeSecretManager(secrets, set(denied)))
