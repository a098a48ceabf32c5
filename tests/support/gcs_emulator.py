"""A real Cloud Storage emulator for the tests, and a proxy that makes it unreliable.

The emulator (`gcp-storage-emulator`, pure Python) speaks the JSON API that the real
google-cloud-storage client uses; `STORAGE_EMULATOR_HOST` points the client at it. The
flaky proxy sits in between and answers a seeded fraction of requests with 503 or by
dropping the connection, the faults the client's retries and our verification must
survive. Chosen requests can also be refused, delayed or dropped while a run goes
(`FlakyProxy.fault`): "every upload under checkpoint-4 is refused from now on".

The emulator ignores request preconditions; the proxy answers the one the project sends,
a create-only upload (`ifGenerationMatch=0`), as Cloud Storage does: 412 when the object
exists ("Request preconditions" in the Cloud Storage docs), one such upload at a time.
"""

from __future__ import annotations

import http.client
import json
import random
import re
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote, unquote

from tests.support.helpers import free_port

BUCKET = "test-bucket"


@contextmanager
def running_emulator():
    """Start the emulator with an in-memory store and one bucket; yield its base URL."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1",
         "--port", str(port),
         "--in-memory", "--default-bucket", BUCKET, "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _wait_for_port(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.kill()
        process.wait()


def _wait_for_port(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"the storage emulator did not open port {port}")


@dataclass
class Fault:
    """What the proxy does to requests whose method and (URL-decoded) path or body match
    (an upload names its object in the body's metadata part, a download in its path):
    `refuse` answers 403, `drop` closes the connection, `delay` holds it that many
    seconds first, `hold` until that event is set (a test then knows the request is in
    flight for as long as it needs). `hits` counts the requests it applied to."""

    method: str
    path: re.Pattern
    refuse: bool = False
    drop: bool = False
    delay: float = 0.0
    hold: threading.Event | None = None
    hits: int = 0

    def matches(self, method: str, text: str) -> bool:
        return re.fullmatch(self.method, method) is not None and bool(self.path.search(text))


class FlakyProxy:
    """Forwards HTTP to the emulator, failing `failure_rate` of requests (seeded) and
    holding each one `delay_seconds` first (changeable while it runs); `fault` adds a
    targeted rule, `clear` removes them all."""

    def __init__(self, upstream: str, failure_rate: float = 0.0, seed: int = 0) -> None:
        self.upstream = upstream.removeprefix("http://")
        self.failure_rate = failure_rate
        self.delay_seconds = 0.0
        self.random = random.Random(seed)
        self.lock = threading.Lock()
        self.requests = self.failures = 0
        self.in_flight = 0
        self.faults: list[Fault] = []
        self.creating = threading.Lock()  # create-only uploads, one at a time
        self.server = _QuietServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def wait_idle(self, timeout: float) -> None:
        """Until no request is being held or forwarded: a closed proxy's handlers still finish
        (the server's threads are daemons, not joined), so a request the client sent before
        it exited may reach the store seconds later."""
        deadline = time.monotonic() + timeout
        while self.in_flight and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not self.in_flight, f"{self.in_flight} request(s) still in flight after {timeout} s"

    def fault(self, method: str, path: str, **action) -> Fault:
        """From now on, do `action` (refuse=True, drop=True, delay=SECONDS, hold=EVENT) to requests
        whose method fully matches `method` (a regex: "GET", "POST|PUT") and whose decoded
        path and query, or the start of whose body, contain a match of `path` (a regex)."""
        rule = Fault(method, re.compile(path), **action)
        with self.lock:
            self.faults.append(rule)
        return rule

    def clear(self) -> None:
        with self.lock:
            self.faults.clear()

    def _targeted(self, method: str, path: str, body: bytes) -> list[Fault]:
        text = f"{unquote(path)}\n{body[:4096].decode('latin-1')}"
        with self.lock:
            rules = [rule for rule in self.faults if rule.matches(method, text)]
            for rule in rules:
                rule.hits += 1
        return rules

    def _fault(self, method: str, path: str, body: bytes) -> str | None:
        rules = self._targeted(method, path, body)
        time.sleep(sum(rule.delay for rule in rules))
        for rule in rules:
            if rule.hold is not None:
                rule.hold.wait()
        if any(rule.drop for rule in rules):
            return "drop"
        if any(rule.refuse for rule in rules):
            return "403"
        with self.lock:
            self.requests += 1
            if self.random.random() >= self.failure_rate:
                return None
            self.failures += 1
            return self.random.choice(["503", "drop"])

    def _handler(self):
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep test output clean
                pass

            def _forward(self):
                with proxy.lock:
                    proxy.in_flight += 1
                try:
                    self._held_and_forwarded()
                finally:
                    with proxy.lock:
                        proxy.in_flight -= 1

            def _held_and_forwarded(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                time.sleep(proxy.delay_seconds)
                fault = proxy._fault(self.command, self.path, body)
                if fault == "drop":
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if fault in ("503", "403"):
                    self.send_response(int(fault))
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                created = _created_object(self.path, body)
                if created is None:
                    status, response_headers, payload = proxy._upstream(
                        self.command, self.path, body, headers
                    )
                else:
                    with proxy.creating:
                        if proxy._exists(*created):
                            status, response_headers, payload = _precondition_failed()
                        else:
                            status, response_headers, payload = proxy._upstream(
                                self.command, self.path, body, headers
                            )
                self.send_response(status)
                for key, value in response_headers:
                    if key.lower() not in ("transfer-encoding", "content-length", "connection"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _forward

        return Handler

    def _upstream(self, method: str, path: str, body: bytes, headers: dict):
        upstream = http.client.HTTPConnection(self.upstream, timeout=60)
        try:
            upstream.request(method, path, body=body, headers=headers)
            response = upstream.getresponse()
            return response.status, response.getheaders(), response.read()
        finally:
            upstream.close()

    def _exists(self, bucket: str, name: str) -> bool:
        status, _, _ = self._upstream(
            "GET", f"/storage/v1/b/{bucket}/o/{quote(name, safe='')}", b"", {}
        )
        return status == 200


def _created_object(path: str, body: bytes) -> tuple[str, str] | None:
    """(bucket, object) of a create-only upload (`ifGenerationMatch=0`), else None. A
    multipart upload names its object in the body's JSON metadata part."""
    upload = re.match(r"/upload/storage/v1/b/([^/]+)/o\?(.*)", path)
    if upload is None or "ifGenerationMatch=0" not in upload.group(2).split("&"):
        return None
    named = re.search(rb'"name": ?"([^"]+)"', body[:4096])
    return (upload.group(1), named.group(1).decode()) if named else None


def _precondition_failed() -> tuple[int, list, bytes]:
    error = {
        "code": 412,
        "message": "At least one of the pre-conditions you specified did not hold.",
    }
    payload = json.dumps({"error": {**error, "errors": [{"reason": "conditionNotMet"}]}})
    return 412, [("Content-Type", "application/json")], payload.encode()


class _QuietServer(ThreadingHTTPServer):
    """A client that went away mid-request (a process killed or stopped on purpose) is
    expected here: no traceback for it."""

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)
