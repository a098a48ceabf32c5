"""A Vertex AI Model Registry on loopback for the registration tests: it answers the REST
calls the real SDK (`aiplatform.Model.list` with `api_transport="rest"`) and the GAPIC
`ModelServiceClient.upload_model` over REST make, and keeps every request it got.

- `GET .../models?filter=display_name="NAME"`: the models of that display name;
- `POST .../models:upload`: the body parsed strictly into `aiplatform_v1.UploadModelRequest`
  (an unknown field is a 400 and lands in `errors`), kept in `uploads`; the answer is a
  long-running Operation, not yet done;
- `GET .../operations/N`: that Operation, done, its response an `UploadModelResponse`: a new
  model (version 1) or, with `parentModel`, the next version of it (or a
  `DeployModelResponse`);
- `POST .../endpoints/E:deployModel` (gcloud's `ai endpoints deploy-model`): the body parsed
  strictly into `aiplatform_v1.DeployModelRequest`, kept in `deploys`; a long-running
  Operation whose response is the deployed model with an id;
- `GET .../models/ID@VERSION`: the model as uploaded (`.../models/ID`: its newest version);
- `POST /v1/projects/P:testIamPermissions` (Cloud Resource Manager's, asked of the same
  address by the launcher's check): the permissions asked, but those `deny` names.

`refuse_uploads(code, status, message)` makes uploads fail as the service does (403
PERMISSION_DENIED, 429 RESOURCE_EXHAUSTED, ...), with Google's JSON error body. Anything else
asked is a 404 and lands in `errors`.
"""

from __future__ import annotations

import json
import os
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

from google.cloud.aiplatform_v1 import types

RESPONSE_TYPE = "type.googleapis.com/google.cloud.aiplatform.v1.{}"
LOCATION = r"/v1/(projects/[^/]+/locations/[^/]+)"
ENDPOINT = r"/v1/(projects/[^/]+/locations/[^/]+/endpoints/[^/:]+)"


@dataclass
class StoredModel:
    resource_name: str
    display_name: str
    versions: list[types.Model] = field(default_factory=list)


class VertexCapture:
    """The registry; `endpoint` is what `--api_endpoint` takes."""

    def __init__(self, project: str = "test-project", region: str = "us-central1") -> None:
        self.parent = f"projects/{project}/locations/{region}"
        self.models: dict[str, StoredModel] = {}
        self.uploads: list[tuple[str, types.UploadModelRequest]] = []
        """(the URL's parent, the request) of every upload, refused ones too."""
        self.requests: list[str] = []
        self.deploys: list[tuple[str, types.DeployModelRequest]] = []
        """(the endpoint's resource name, the request) of every deployModel."""
        self.errors: list[str] = []
        self.operations: dict[str, types.UploadModelResponse | types.DeployModelResponse] = {}
        self.refusal: tuple[int, str, str] | None = None
        self.denied: set[str] = set()
        """Permissions testIamPermissions says the caller lacks."""
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def add_model(self, display_name: str) -> str:
        """A model registered earlier (version 1); returns its resource name."""
        name = f"{self.parent}/models/{1000 + len(self.models)}"
        model = types.Model(name=name, display_name=display_name, version_id="1")
        self.models[name] = StoredModel(name, display_name, [model])
        return name

    def refuse_uploads(self, code: int, status: str, message: str) -> None:
        self.refusal = (code, status, message)

    def deny(self, *permissions: str) -> None:
        self.denied = set(permissions)

    def _tested(self, body: bytes) -> dict:
        asked = json.loads(body)["permissions"]
        return {"permissions": [name for name in asked if name not in self.denied]}

    def _listed(self, query: str) -> dict:
        # the filter's string literal: double-quoted, `"` and `\\` escaped (AIP-160)
        wanted = re.fullmatch(r'display_name=(".*")', parse_qs(query).get("filter", [""])[0])
        name = json.loads(wanted.group(1)) if wanted else None
        found = [m.versions[-1] for m in self.models.values() if m.display_name == name]
        return {"models": [json.loads(types.Model.to_json(model)) for model in found]}

    def _upload(self, parent: str, body: bytes) -> tuple[int, dict]:
        request = types.UploadModelRequest.from_json(body.decode(), ignore_unknown_fields=False)
        self.uploads.append((parent, request))
        if self.refusal is not None:
            code, status, message = self.refusal
            return code, {"error": {"code": code, "status": status, "message": message}}
        stored = self.models.get(request.parent_model)
        if stored is None:
            name = f"{parent}/models/{2000 + len(self.models)}"
            stored = self.models[name] = StoredModel(name, request.model.display_name)
        version = types.Model(request.model)
        version.name, version.version_id = stored.resource_name, str(len(stored.versions) + 1)
        # output only, as the service fills it in for a custom container (gcloud reads it)
        version.supported_deployment_resources_types = [
            types.Model.DeploymentResourcesType.DEDICATED_RESOURCES
        ]
        stored.versions.append(version)
        operation = f"{stored.resource_name}/operations/{len(self.operations) + 1}"
        self.operations[operation] = types.UploadModelResponse(
            model=stored.resource_name, model_version_id=version.version_id
        )
        return 200, {"name": operation, "done": False}

    def _deploy(self, endpoint: str, body: bytes) -> tuple[int, dict]:
        request = types.DeployModelRequest.from_json(body.decode(), ignore_unknown_fields=False)
        self.deploys.append((endpoint, request))
        deployed = types.DeployedModel(request.deployed_model)
        deployed.id = str(len(self.deploys))
        operation = f"{endpoint}/operations/{len(self.operations) + 1}"
        self.operations[operation] = types.DeployModelResponse(deployed_model=deployed)
        return 200, {"name": operation, "done": False}

    def _operation(self, name: str) -> dict:
        response = self.operations[name]
        kind = type(response)
        fields = json.loads(kind.to_json(response))
        return {"name": name, "done": True,
                "response": {"@type": RESPONSE_TYPE.format(kind.__name__), **fields}}  # fmt: skip

    def _model(self, name: str, version: str) -> dict:
        return json.loads(types.Model.to_json(self.models[name].versions[int(version) - 1]))

    def answer(self, method: str, target: str, body: bytes) -> tuple[int, dict]:
        url = urlsplit(target)
        path = unquote(url.path)
        with self.lock:
            self.requests.append(f"{method} {path}")
            if method == "GET" and (found := re.fullmatch(rf"{LOCATION}/models", path)):
                return 200, self._listed(url.query)
            if method == "POST" and (found := re.fullmatch(rf"{LOCATION}/models:upload", path)):
                return self._upload(found.group(1), body)
            if method == "POST" and (found := re.fullmatch(rf"{ENDPOINT}:deployModel", path)):
                return self._deploy(found.group(1), body)
            if method == "GET" and (found := re.search(r"(projects/.*/operations/\d+)$", path)):
                return 200, self._operation(found.group(1))
            if method == "GET" and (found := re.fullmatch(r"/v1/(.*/models/\d+)@(\d+)", path)):
                return 200, self._model(found.group(1), found.group(2))
            if method == "GET" and path.removeprefix("/v1/") in self.models:  # the newest
                name = path.removeprefix("/v1/")
                return 200, self._model(name, str(len(self.models[name].versions)))
            if method == "POST" and re.fullmatch(r"/v1/projects/[^/]+:testIamPermissions", path):
                return 200, self._tested(body)
            self.errors.append(f"unexpected {method} {target}")
            return 404, {"error": {"code": 404, "status": "NOT_FOUND", "message": path}}

    def _handler(self):
        capture = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep test output clean
                pass

            def _reply(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    status, answer = capture.answer(self.command, self.path, body)
                except Exception as error:  # a request our types reject: the test fails on it
                    capture.errors.append(f"{self.command} {self.path}: {error!r}")
                    status, answer = 400, {"error": {"code": 400, "message": repr(error)}}
                payload = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = _reply

        return Handler


def gcloud_env(home: str, endpoint: str) -> dict[str, str]:
    """The environment that points the real gcloud CLI's `ai` commands at `endpoint` (a
    VertexCapture's), in project `p`, with nothing of the user's configuration or
    credentials (`home`: an empty folder of the test's)."""
    return {
        "PATH": os.environ["PATH"],
        "HOME": home,
        "CLOUDSDK_CONFIG": f"{home}/gcloud-config",
        "CLOUDSDK_AUTH_DISABLE_CREDENTIALS": "true",
        "CLOUDSDK_CORE_PROJECT": "p",
        "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
        "CLOUDSDK_CORE_DISABLE_USAGE_REPORTING": "true",
        "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "true",
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_AIPLATFORM": f"{endpoint}/",  # gcloud needs the slash
    }
