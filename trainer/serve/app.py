"""The HTTP side: Vertex AI's two routes (and `GET /` nowhere else), health 503 until the
model is ready, requests checked before any of their instances is queued.

A request is `{"instances": [...], "parameters": {...}}`; the answer `{"predictions": [...]}`,
one per instance, in order. An instance that cannot be predicted (not audio, not an image, a
wrong schema, an unreadable gs:// object) fails its request with 400 and a JSON body naming
each bad instance's index; the server keeps serving. A body over `max_request_bytes` is 413,
naming the limit, before it is parsed.
"""

from __future__ import annotations

import asyncio
import html
import json
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from importlib import resources

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse

from trainer.serve.batching import Batcher, QueueFull
from trainer.serve.contract import Contract
from trainer.serve.load_failure import load_failure_line
from trainer.serve.media import InstanceError
from trainer.serve.predictors import Predictor

PAGE = resources.files("trainer.serve").joinpath("page.html").read_text(encoding="utf-8")
"""`GET /`: a page to try the model from a browser, on a local server (Vertex AI forwards
only the two routes). Plain HTML and a little JavaScript, nothing loaded from elsewhere."""
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; "
    "style-src 'unsafe-inline'; connect-src 'self'; form-action 'none'; base-uri 'none'",
}
"""The browser itself refuses anything the page might load from another origin."""


def log_line(record: dict) -> None:
    """One JSON line on stdout, which Cloud Logging parses into a structured entry."""
    print(json.dumps(record), file=sys.stdout, flush=True)


class ModelState:
    """The predictor once loaded (on a thread of its own: the port is open meanwhile), or
    the reason it could not be: one line (trainer/serve/load_failure.py), which looks into
    the model's folder when `location` is a local one."""

    def __init__(self, load: Callable[[], Predictor], location: str | None = None) -> None:
        self.predictor: Predictor | None = None
        self.failure: str | None = None
        self._load = load
        self._folder = location if location and not location.startswith("gs://") else None

    def load(self) -> None:
        try:
            self.predictor = self._load()
        except Exception as error:  # noqa: BLE001 - said in the log and by the health route
            self.failure = load_failure_line(error, self._folder)
            print(f"error: the model did not load: {self.failure}", file=sys.stderr, flush=True)


def make_app(
    contract: Contract,
    load: Callable[[], Predictor],
    max_batch_size: int,
    max_wait: float,
    max_request_bytes: int,
    queue_size: int,
    on_load_failure: Callable[[], None] = lambda: None,
    model_location: str | None = None,
) -> FastAPI:
    state = ModelState(load, model_location)
    preprocessing = ThreadPoolExecutor(thread_name_prefix="prepare")
    holder: dict[str, Batcher] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        loop = asyncio.get_running_loop()

        async def load_then_batch() -> None:
            await loop.run_in_executor(None, state.load)
            if state.predictor is None:
                on_load_failure()
                return
            predictor = state.predictor
            holder["batcher"] = Batcher(
                predictor.predict, max_batch_size, max_wait, queue_size, log_line
            )
            await holder["batcher"].run()

        task = asyncio.create_task(load_then_batch())
        yield
        task.cancel()
        preprocessing.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    @app.get(contract.health_route)
    async def health():
        if "batcher" in holder:
            return {"status": "ready", "task": state.predictor.task}
        status = "failed" if state.failure else "loading"
        return JSONResponse({"status": status}, status_code=503)

    @app.post(contract.predict_route)
    async def predict(request: Request):
        if "batcher" not in holder:
            return error_response(503, "the model is not loaded yet")
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > max_request_bytes:
            return too_large(max_request_bytes)
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > max_request_bytes:
                return too_large(max_request_bytes)
        try:
            payload = json.loads(bytes(body))
        except ValueError:
            return error_response(400, "the body is not JSON")
        if not isinstance(payload, dict) or not isinstance(payload.get("instances"), list):
            return error_response(400, 'the body must be {"instances": [...]}')
        instances = payload["instances"]
        if not instances:
            return error_response(400, "instances is empty")
        if len(instances) > queue_size:  # would never fit the queue: no use trying again
            return error_response(400, f"a request holds at most {queue_size} instances "
                                  f"(--queue_size); this one holds {len(instances)}")  # fmt: skip
        predictor = state.predictor
        try:
            parameters = predictor.checked_parameters(payload.get("parameters"))
        except InstanceError as error:
            return error_response(400, str(error))
        loop = asyncio.get_running_loop()
        batcher = holder["batcher"]
        with batcher.preparing(parameters):
            prepared = await asyncio.gather(
                *(loop.run_in_executor(preprocessing, predictor.prepare, i) for i in instances),
                return_exceptions=True,
            )
        bad = [
            {"index": index, "error": str(result)}
            for index, result in enumerate(prepared)
            if isinstance(result, BaseException)
        ]
        unexpected = [r for r in prepared if isinstance(r, BaseException)
                      and not isinstance(r, InstanceError)]  # fmt: skip
        if unexpected:
            raise unexpected[0]
        if bad:
            return JSONResponse(
                {"error": f"{len(bad)} of {len(instances)} instances cannot be predicted",
                 "instances": bad}, status_code=400)  # fmt: skip
        try:
            predictions = await batcher.predict(list(prepared), parameters)
        except QueueFull as error:
            return error_response(503, str(error))
        except Exception as error:  # noqa: BLE001 - the batch's forward pass failed
            return error_response(500, f"the prediction failed: {type(error).__name__}")
        return {"predictions": predictions}

    page = PAGE.replace("{{predict_route}}", html.escape(contract.predict_route)).replace(
        "{{health_route}}", html.escape(contract.health_route)
    )

    @app.get("/", response_class=HTMLResponse)
    async def try_page():
        return HTMLResponse(page, headers=PAGE_HEADERS)

    return app


def error_response(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def too_large(limit: int) -> JSONResponse:
    return error_response(413, f"the request is over the server's limit of {limit} bytes")
