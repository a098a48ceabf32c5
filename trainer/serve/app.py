"""The HTTP side: Vertex AI's two routes (and `GET /` nowhere else), health 503 until the
model is ready, requests checked before any of their instances is queued; for a task that
answers them, OpenAI's `/v1/chat/completions` and `/v1/completions` (openai_routes.py), whose
bodies the prediction route also answers (rawPredict).

A request is `{"instances": [...], "parameters": {...}}`; the answer `{"predictions": [...]}`,
one per instance, in order. An instance that cannot be predicted (not audio, not an image, a
wrong schema, an unreadable gs:// object) gets `{"error": REASON}` in its place and the others
their predictions (200), so that a batch prediction job loses no good instance to a bad
neighbour; a request none of whose instances can be predicted is 400, naming each one's
index. A body over `max_request_bytes` is 413, naming the limit, before it is parsed. A body
sent as the media itself (`Content-Type: audio/*`, `image/*`, `text/plain`: Vertex AI's
rawPredict) is one instance, its parameters in the query string.

A request is dropped before its forward pass (in text generation's continuous batching
engine, at its next step) when its caller has gone or when it has waited past
`request_timeout` (504; callers.py); if the batching loop itself stops, health answers 503
and the log says why in one line.
"""

from __future__ import annotations

import asyncio
import html
import json
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from importlib import resources

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse

from trainer.serve.batching import Batcher, NotServing, QueueFull
from trainer.serve.callers import Dropped, waited_for
from trainer.serve.contract import Contract
from trainer.serve.openai_routes import add_openai_routes, openai_route
from trainer.tasks.instance_media import InstanceError
from trainer.tasks.load_failure import load_failure_line
from trainer.tasks.predictor import Predictor

RAW_MEDIA_FAMILIES = ("audio/", "image/", "video/", "text/plain")
"""Content types that are media, not a JSON request: a task that takes none of them answers
415 (what a task takes is its predictor's `raw_media_types`)."""

PAGE = resources.files("trainer.serve").joinpath("page.html").read_text(encoding="utf-8")
"""`GET /`: a page to try the model from a browser, on a local server (Vertex AI forwards
only the two routes). Plain HTML and a little JavaScript, nothing loaded from elsewhere."""
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; "
    "style-src 'unsafe-inline'; connect-src 'self'; media-src blob:; form-action 'none'; "
    "base-uri 'none'",
}
"""The browser itself refuses anything the page might load from another origin (`blob:` is
the page's own clip, played back)."""


WORKER: dict = {}
"""In a worker of `--workers N` (trainer/serve/workers.py), its `worker` index and `pid`: on
every JSON log line, and naming it at the start of its error lines."""


def log_line(record: dict) -> None:
    """One JSON line on stdout, which Cloud Logging parses into a structured entry."""
    print(json.dumps(record | WORKER), file=sys.stdout, flush=True)


def error_line(message: str) -> None:
    """`error: MESSAGE` on stderr, one line (`error: worker I (pid P): ...` in a worker)."""
    who = f"worker {WORKER['worker']} (pid {WORKER['pid']}): " if WORKER else ""
    print(f"error: {who}{message}", file=sys.stderr, flush=True)


class RequestError(Exception):
    """A request refused as a whole: its status code and the message for its JSON body."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class ModelState:
    """The predictor once loaded (on a thread of its own: the port is open meanwhile), or
    the reason it could not be: one line (trainer/tasks/load_failure.py), which looks into
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
            error_line(f"the model did not load: {self.failure}")


def make_app(
    contract: Contract,
    load: Callable[[], Predictor],
    max_batch_size: int,
    max_wait: float,
    max_request_bytes: int,
    queue_size: int,
    on_load_failure: Callable[[], None] = lambda: None,
    *,
    request_timeout: float | None = None,
    gcs_read_prefixes: tuple[str, ...] = (),
    model_location: str | None = None,
    on_batching_stopped: Callable[[], None] = lambda: None,
    after_batching_stops: str = "health answers 503 from now on",
) -> FastAPI:
    """The app. `request_timeout` (seconds; None: none) bounds how long a request may wait
    for its predictions; `gcs_read_prefixes` are the only gs:// prefixes an instance may name
    (the server reads them with its own credentials); `model_location`, when a local folder,
    is where a load failure's cause is looked for. If the batching loop stops,
    `on_batching_stopped` is called, then its error line ends with `after_batching_stops`."""
    state = ModelState(load, model_location)
    preprocessing = ThreadPoolExecutor(thread_name_prefix="prepare")
    holder: dict = {}
    """The batcher, and the predictor's engine (None: it has none), once it is loaded."""
    description: dict = {}
    """The served model's, for the page (health says it once ready)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        loop = asyncio.get_running_loop()

        async def load_then_batch() -> None:
            await loop.run_in_executor(None, state.load)
            if state.predictor is None:
                on_load_failure()
                return
            predictor = state.predictor
            predictor.gcs_read_prefixes = gcs_read_prefixes
            description.update(predictor.description())
            holder["engine"] = predictor.engine()
            holder["batcher"] = Batcher(predictor.predict, max_batch_size, max_wait, queue_size,
                                        log_line, holder["engine"])  # fmt: skip
            try:
                await holder["batcher"].run()
            except Exception as error:  # noqa: BLE001 - said in the log and by the health route
                del holder["batcher"]
                state.failure = f"the batching loop stopped: {type(error).__name__}: {error}"
                on_batching_stopped()  # first: a worker's health is 503 when the line shows
                error_line(f"{state.failure}; {after_batching_stops}")

        task = asyncio.create_task(load_then_batch())
        yield
        task.cancel()
        if holder.get("engine") is not None:
            holder["engine"].stop()
        preprocessing.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    answer_openai = add_openai_routes(
        app, lambda: (holder.get("batcher"), state.predictor, state.failure), preprocessing,
        max_request_bytes,
    )  # fmt: skip

    @app.get(contract.health_route)
    async def health():
        if "batcher" in holder:
            return {"status": "ready", "task": state.predictor.task,
                    "queued": holder["batcher"].queue.qsize(), "model": description}  # fmt: skip
        status = "failed" if state.failure else "loading"
        return JSONResponse({"status": status}, status_code=503)

    @app.post(contract.predict_route)
    async def predict(request: Request):
        deadline = time.monotonic() + request_timeout if request_timeout else None
        batcher = holder.get("batcher")
        if batcher is None:
            return error_response(503, "the model is not serving (see the server's log)"
                                  if state.failure else "the model is not loaded yet")  # fmt: skip
        predictor = state.predictor
        try:
            body = await read_body(request, max_request_bytes)
            route = openai_body_route(body, request.headers.get("content-type", ""))
            if route and predictor.openai_formats:
                return await answer_openai(json.loads(body), route, request)
            instances, parameters = parsed_request(
                body, request.headers.get("content-type", ""), dict(request.query_params),
                predictor, queue_size,
            )  # fmt: skip
        except RequestError as error:
            return error_response(error.status, error.message)
        loop = asyncio.get_running_loop()
        with batcher.preparing(parameters):
            prepared = await asyncio.gather(
                *(loop.run_in_executor(preprocessing, predictor.prepare, i) for i in instances),
                return_exceptions=True,
            )
        bad = refused_instances(prepared)
        if len(bad) == len(instances):
            return answered(len(instances), bad, [])
        good = [item for index, item in enumerate(prepared) if index not in bad]
        each = [parameters | (item.parameters or {}) for item in good]  # batched by these
        try:
            predictions = await waited_for(request, batcher.predict(good, each), deadline)
        except (QueueFull, NotServing) as error:
            return error_response(503, str(error))
        except Dropped as dropped:
            log_line(
                {
                    "message": "request dropped before its forward pass",
                    "severity": "WARNING",
                    "reason": str(dropped),
                    "instances": len(good),
                }
            )
            return error_response(504, f"dropped: {dropped}")  # fmt: skip
        except Exception as error:  # noqa: BLE001 - the batch's forward pass failed
            return error_response(500, f"the prediction failed: {type(error).__name__}")
        return answered(len(instances), bad, predictions)

    page = PAGE.replace("{{predict_route}}", html.escape(contract.predict_route)).replace(
        "{{health_route}}", html.escape(contract.health_route)
    )

    @app.get("/", response_class=HTMLResponse)
    async def try_page():
        return HTMLResponse(page, headers=PAGE_HEADERS)

    return app


async def read_body(request: Request, limit: int) -> bytes:
    """The body, or RequestError 413 as soon as it is known to be over `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise RequestError(413, too_large_message(limit))
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise RequestError(413, too_large_message(limit))
    return bytes(body)


def parsed_request(
    body: bytes, content_type: str, query: dict[str, str], predictor: Predictor, queue_size: int
) -> tuple[list, dict]:
    """The request's instances and checked parameters, or RequestError: a JSON
    `{"instances": [...], "parameters": {...}}`, or the media itself (rawPredict) as one
    instance with its parameters in the query string."""
    media_type = content_type.partition(";")[0].strip().lower()
    try:
        if predictor.takes_raw(media_type):
            return [body], predictor.checked_parameters(query_parameters(query))
        if media_type.startswith(RAW_MEDIA_FAMILIES):
            takes = ", ".join(predictor.raw_media_types) or "no media type"
            raise RequestError(415, f"this {predictor.task} model takes application/json or "
                               f"the media itself as {takes}, not {media_type}")  # fmt: skip
        instances, parameters = json_request(body, queue_size)
        return instances, predictor.checked_parameters(parameters)
    except InstanceError as error:
        raise RequestError(400, str(error)) from None


def openai_body_route(body: bytes, content_type: str) -> str | None:
    """The OpenAI route a JSON body sent to the prediction route is for (none: a prediction
    request, or no JSON)."""
    if content_type.partition(";")[0].strip().lower() not in ("", "application/json"):
        return None
    try:
        return openai_route(json.loads(body))
    except ValueError:
        return None


def json_request(body: bytes, queue_size: int) -> tuple[list, object]:
    try:
        payload = json.loads(body)
    except ValueError:
        raise RequestError(400, "the body is not JSON") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("instances"), list):
        raise RequestError(400, 'the body must be {"instances": [...]}')
    instances = payload["instances"]
    if not instances:
        raise RequestError(400, "instances is empty")
    if len(instances) > queue_size:  # would never fit the queue: no use trying again
        raise RequestError(400, f"a request holds at most {queue_size} instances "
                           f"(--queue_size); this one holds {len(instances)}")  # fmt: skip
    return instances, payload.get("parameters")


def query_parameters(query: dict[str, str]) -> dict:
    """A raw request's parameters from its query string: each value read as JSON where it is
    JSON (`top_k=2`, `return_timestamps=true`), else as the string (`language=en`)."""
    parameters = {}
    for name, value in query.items():
        try:
            parameters[name] = json.loads(value)
        except ValueError:
            parameters[name] = value
    return parameters


def refused_instances(prepared: list) -> dict[int, str]:
    """Index -> why, for each instance that cannot be predicted; an unexpected error (a bug,
    not the instance) is raised."""
    for result in prepared:
        if isinstance(result, BaseException) and not isinstance(result, InstanceError):
            raise result
    return {index: str(result) for index, result in enumerate(prepared)
            if isinstance(result, InstanceError)}  # fmt: skip


def answered(count: int, bad: dict[int, str], predictions: list) -> JSONResponse | dict:
    """The predictions of a request's `count` instances: those refused before the model
    (`bad`) and those the predictor answered `{"error": ...}` alone (a prompt too long for
    its new tokens) in their places; 400, naming each, when no instance got a prediction."""
    answers = iter(predictions)
    rows = [{"error": bad[index]} if index in bad else next(answers) for index in range(count)]
    failed = {index: row["error"] for index, row in enumerate(rows) if is_error(row)}
    if len(failed) == count:
        return JSONResponse({"error": f"{count} of {count} instances cannot be predicted",
                             "instances": [{"index": i, "error": e} for i, e in failed.items()]},
                            status_code=400)  # fmt: skip
    return {"predictions": rows}


def is_error(row: object) -> bool:
    return isinstance(row, dict) and set(row) == {"error"}


def error_response(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def too_large_message(limit: int) -> str:
    return f"the request is over the server's limit of {limit} bytes"
