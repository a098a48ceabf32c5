"""A loopback Hugging Face Hub serving dataset and model repositories (and `whoami`) to the real
clients.

`load_dataset("org/name", streaming=True)` (datasets 5.x over huggingface_hub's
HfFileSystem) and the launcher's hub check ask a Hub these routes, and nothing else, for a
repository of Parquet files; each is answered the way huggingface.co answers it:

- `GET /api/datasets/ID` and `GET /api/datasets/ID/revision/REV`: the repository's info
  (its commit `sha`, `siblings`): the hub check, and how HfFileSystem learns that a repo
  and revision exist.
- `GET /api/datasets/ID/tree/REV[/PATH]`: a folder listing (with `recursive`), from which
  `datasets` finds the data files and infers the splits from their names.
- `HEAD` and `GET /datasets/ID/resolve/REV/PATH`: a file's bytes, whole or a `Range` of
  them, with the `ETag`, `X-Repo-Commit` and `Content-Length` headers `hf_hub_download`
  checks; a missing file is 404 with `X-Error-Code: EntryNotFound`, which `datasets`
  reads as "no README / no dataset script here".
- `GET /api/models/ID[/revision/REV]` and `HEAD`/`GET /ID/resolve/REV/PATH`: the same for
  a model repository (the launcher's hub check; `hf_hub_download` of a model's
  config.json). One id -> Repository mapping serves both kinds.
- `GET /api/whoami-v2`: who the `Authorization: Bearer TOKEN` belongs to, with the token's
  role (`read` or `write`), for a token in `tokens`; 401 otherwise: the launcher's check
  that `--push_to_hub` can write.

Anything else is answered 404 and recorded in `unknown`, so a test sees what a newer
client asks for. huggingface_hub asks one such route, `/api/agent-harnesses` (a registry
for its user-agent string, fetched best-effort: a 404 means "no agent"). Every request
is recorded in `requests` as (method, path, Range header).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from tests.support.helpers import serving

REPO = r"(?P<repo>[^/]+/[^/]+)"
REVISION = r"(?P<revision>[^/]+)"
ROUTES = [
    ("GET", re.compile(rf"/api/datasets/{REPO}(?:/revision/{REVISION})?"), "info"),
    ("GET", re.compile(rf"/api/datasets/{REPO}/tree/{REVISION}(?:/(?P<path>.*))?"), "tree"),
    ("GET", re.compile(rf"/datasets/{REPO}/resolve/{REVISION}/(?P<path>.+)"), "resolve"),
    ("HEAD", re.compile(rf"/datasets/{REPO}/resolve/{REVISION}/(?P<path>.+)"), "resolve"),
    ("GET", re.compile(rf"/api/models/{REPO}(?:/revision/{REVISION})?"), "info"),
    ("GET", re.compile(rf"/{REPO}/resolve/{REVISION}/(?P<path>.+)"), "resolve"),
    ("HEAD", re.compile(rf"/{REPO}/resolve/{REVISION}/(?P<path>.+)"), "resolve"),
]


class Repository:
    """A dataset or model repository's files at one commit (the Hub's `main`)."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        digest = hashlib.sha1()
        for path in sorted(files):
            digest.update(path.encode() + b"\0" + files[path])
        self.sha = digest.hexdigest()

    @classmethod
    def from_directory(cls, root: Path) -> Repository:
        files = (path for path in root.rglob("*") if path.is_file())
        return cls({str(path.relative_to(root)): path.read_bytes() for path in files})

    def has_revision(self, revision: str) -> bool:
        return unquote(revision) in ("main", self.sha)

    def folders(self) -> set[str]:
        return {str(parent) for path in self.files for parent in Path(path).parents} - {"."}

    def entry(self, path: str) -> dict:
        """A tree / paths-info entry as the Hub writes it (no LFS pointer, no Xet hash: the
        client then reads the file through the plain `resolve` route)."""
        if path in self.files:
            oid = hashlib.sha1(self.files[path]).hexdigest()
            return {"type": "file", "oid": oid, "size": len(self.files[path]), "path": path}
        return {"type": "directory", "oid": hashlib.sha1(path.encode()).hexdigest(), "size": 0,
                "path": path}  # fmt: skip

    def listing(self, folder: str, recursive: bool) -> list[dict]:
        prefix = f"{folder}/" if folder else ""
        paths = sorted(set(self.files) | self.folders())
        inside = [p for p in paths if p.startswith(prefix)]
        if not recursive:
            inside = [p for p in inside if "/" not in p[len(prefix) :]]
        return [self.entry(path) for path in inside]


class LoopbackHub(ThreadingHTTPServer):
    """The Hub at `url`: repository id -> Repository."""

    def __init__(
        self, repositories: dict[str, Repository], tokens: dict[str, str] | None = None
    ) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.repositories = repositories
        self.tokens = tokens or {}
        """Token -> its role (read, write), for whoami."""
        self.requests: list[tuple[str, str, str | None]] = []
        self.unknown: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@contextmanager
def running_hub(
    repositories: dict[str, Repository], tokens: dict[str, str] | None = None
) -> Iterator[LoopbackHub]:
    with serving(LoopbackHub(repositories, tokens)) as hub:
        yield hub


class _Handler(BaseHTTPRequestHandler):
    server: LoopbackHub
    protocol_version = "HTTP/1.1"  # keep-alive, as the Hub's clients expect
    disable_nagle_algorithm = True  # headers and body go out at once, not 40 ms apart

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        self.server.requests.append((method, url.path, self.headers.get("Range")))
        if (method, url.path) == ("GET", "/api/whoami-v2"):
            return self.whoami()
        for route_method, pattern, handler in ROUTES:
            match = pattern.fullmatch(url.path)
            if route_method == method and match:
                repo = self.server.repositories.get(match["repo"])
                if repo is None:
                    return self._json(404, {"error": "Repository not found"}, "RepoNotFound")
                if match["revision"] and not repo.has_revision(match["revision"]):
                    return self._json(404, {"error": "Invalid rev id"}, "RevisionNotFound")
                return getattr(self, handler)(repo, match, parse_qs(url.query))
        self.server.unknown.append(f"{method} {self.path}")
        self._json(404, {"error": "not served by the loopback hub"})

    def info(self, repo: Repository, match, query) -> None:
        siblings = [{"rfilename": path} for path in sorted(repo.files)]
        self._json(200, {"id": match["repo"], "sha": repo.sha, "private": False,
                         "disabled": False, "gated": False, "siblings": siblings})  # fmt: skip

    def whoami(self) -> None:
        token = self.headers.get("Authorization", "").removeprefix("Bearer ")
        role = self.server.tokens.get(token)
        if role is None:
            return self._json(401, {"error": "Invalid credentials in Authorization header"})
        token_info = {"displayName": "test", "role": role}
        auth = {"type": "access_token", "accessToken": token_info}
        self._json(200, {"type": "user", "name": "loopback-user", "auth": auth})

    def tree(self, repo: Repository, match, query) -> None:
        folder = unquote(match["path"] or "").rstrip("/")
        if folder and folder not in repo.folders():
            return self._json(404, {"error": f"{folder} not found"}, "EntryNotFound")
        recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
        self._json(200, repo.listing(folder, recursive))

    def resolve(self, repo: Repository, match, query) -> None:
        path = unquote(match["path"])
        if path not in repo.files:
            return self._json(404, {"error": f"{path} not found"}, "EntryNotFound")
        data = repo.files[path]
        start, end, status = 0, len(data), 200
        ranged = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if ranged:
            start = int(ranged[1])
            end = min(int(ranged[2]) + 1, len(data)) if ranged[2] else len(data)
            if start >= len(data):
                return self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
            status = 206
        headers = {
            "ETag": f'"{repo.entry(path)["oid"]}"',
            "X-Repo-Commit": repo.sha,
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        if status == 206:
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(data)}"
        self._send(status, data[start:end], headers)

    def _json(self, status: int, payload, error_code: str | None = None) -> None:
        headers = {"Content-Type": "application/json"}
        if error_code:
            headers["X-Error-Code"] = error_code
        self._send(status, json.dumps(payload).encode(), headers)

    def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass
