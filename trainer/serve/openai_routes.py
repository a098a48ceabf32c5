"""`POST /v1/chat/completions` and `/v1/completions`: OpenAI's routes, for a task that answers
them (its predictor's `openai_formats`; others answer 404), so that an OpenAI client (the
SDK, LangChain, LiteLLM) is pointed at the server as it is; `GET /v1/models` lists the one
model served, for a client that lists the models before it asks (the SDK's `models.list()`,
chat front ends such as Open WebUI).

A body is one instance of the prediction route (`{"@requestFormat": "chatCompletions",
...the body}`, as Model Garden's containers take it): the same checks, the same batching with
other requests of the same parameters, the same answer written as OpenAI's. With `"stream":
true` the answer is server-sent events, a chunk for each piece of text as it is generated (by
text generation's continuous batching engine, or by `generate()` on the model's thread with the
instance alone in its batch), each naming its choice of the `n`, ending with `data: [DONE]`; with
`stream_options.include_usage`, a last chunk carries the usage. An error is OpenAI's body,
`{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Executor

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from trainer.serve.batching import Batcher, NotServing, QueueFull
from trainer.serve.callers import Dropped, waited_for
from trainer.tasks.instance_media import InstanceError
from trainer.tasks.predictor import Predictor, Prepared

ROUTES = ("chat/completions", "completions")
OWNER = "vertex-hf-trainer"
"""`owned_by` of the model `GET /v1/models` lists (OpenAI's names an organisation; vLLM's
says "vllm")."""
REQUEST_FORMAT = "@requestFormat"


def openai_error(status: int, message: str, kind: str = "invalid_request_error",
                 code: str | None = None) -> JSONResponse:  # fmt: skip
    return JSONResponse({"error": {"message": message, "type": kind, "param": None,
                                   "code": code}}, status_code=status)  # fmt: skip


def add_openai_routes(
    app: FastAPI,
    serving: Callable[[], tuple[Batcher | None, Predictor | None, str | None]],
    preprocessing: Executor,
    max_request_bytes: int,
) -> Callable[[dict, str], Awaitable]:
    """The two routes on `app`; `serving()` is (the batcher, the predictor, why the model is
    not serving) at the time of a request. Returns what answers an OpenAI body already read
    (the prediction route's rawPredict bodies), given its route and its request."""

    async def answer(payload: dict, route: str, request: Request):
        batcher, predictor, failure = serving()
        if batcher is None:
            return openai_error(503, failure or "the model is not loaded yet", "server_error")
        form = predictor.openai_formats.get(route)
        if form is None:
            return openai_error(404, f"this {predictor.task} model answers no /v1/{route}")
        stream = payload.get("stream")
        if stream not in (None, False, True):
            return openai_error(400, "stream must be true or false")
        if payload.get("stream_options") is not None and not stream:
            return openai_error(400, "stream_options needs stream: true")
        if stream and payload.get("logprobs") not in (None, False):
            return openai_error(400, "logprobs are answered whole: ask with stream: false")
        instance = {REQUEST_FORMAT: form} | {
            k: v for k, v in payload.items() if k not in ("stream", "stream_options")}  # fmt: skip
        loop = asyncio.get_running_loop()
        try:
            prepared = await loop.run_in_executor(preprocessing, predictor.prepare, instance)
        except InstanceError as error:
            return openai_error(400, str(error))
        refused = predictor.refusal(prepared, {})
        if refused:  # before any response starts, streamed or not
            return openai_error(400, refused["error"], code="context_length_exceeded")
        if not stream:
            return await whole(batcher, prepared, request)
        usage = bool((payload.get("stream_options") or {}).get("include_usage"))
        chunks = Chunks(route == "chat/completions", payload.get("model"), usage)
        try:
            return streamed(batcher, predictor, prepared, chunks)
        except (QueueFull, NotServing) as error:
            return openai_error(503, str(error), "server_error")

    def handler(route: str):
        async def answered(request: Request):
            body = await request.body()
            if len(body) > max_request_bytes:
                return openai_error(413, f"the request is over the server's limit of "
                                    f"{max_request_bytes} bytes")  # fmt: skip
            try:
                payload = json.loads(body)
            except ValueError:
                payload = None
            if not isinstance(payload, dict):
                return openai_error(400, "the body is not a JSON object")
            return await answer(payload, route, request)

        return answered

    started = int(time.time())

    def served_model() -> dict | JSONResponse:
        """The one model served, as OpenAI's model object (its id the name the page shows:
        where it was loaded from); or the error that answers instead."""
        batcher, predictor, failure = serving()
        if batcher is None:
            return openai_error(503, failure or "the model is not loaded yet", "server_error")
        if not predictor.openai_formats:
            return openai_error(404, f"this {predictor.task} model answers no /v1/ route")
        return {"id": predictor.description()["name"], "object": "model", "created": started,
                "owned_by": OWNER}  # fmt: skip

    async def models():
        model = served_model()
        return model if isinstance(model, JSONResponse) else {"object": "list", "data": [model]}

    async def model(name: str):
        model = served_model()
        if isinstance(model, dict) and model["id"] != name:
            return openai_error(404, f"the model {name!r} is not served here; "
                                f"{model['id']!r} is", code="model_not_found")  # fmt: skip
        return model

    for route in ROUTES:
        app.add_api_route(f"/v1/{route}", handler(route), methods=["POST"])
    app.add_api_route("/v1/models", models, methods=["GET"])
    app.add_api_route("/v1/models/{name:path}", model, methods=["GET"])
    return answer


def openai_route(payload: object) -> str | None:
    """The OpenAI route a body sent to the prediction route is for (Vertex AI's rawPredict
    and streamRawPredict pass OpenAI bodies there): `messages` a chat's, a `prompt` without
    `instances` a completion's; None: a prediction request."""
    if not isinstance(payload, dict) or "instances" in payload:
        return None
    if "messages" in payload:
        return "chat/completions"
    return "completions" if "prompt" in payload else None


async def whole(batcher: Batcher, prepared: Prepared, request: Request):
    """The answer, whole; its generation cancelled if the caller goes first (an OpenAI
    client that timed out and retries would otherwise have it generated twice)."""
    work = batcher.predict([prepared], [prepared.parameters or {}])
    try:
        (result,) = await waited_for(request, work, None)
    except Dropped as dropped:  # nobody reads this
        return openai_error(504, f"dropped: {dropped}", "server_error")
    except (QueueFull, NotServing) as error:
        return openai_error(503, str(error), "server_error")
    except Exception as error:  # noqa: BLE001 - the forward pass failed
        return openai_error(500, f"the prediction failed: {type(error).__name__}", "server_error")
    if "error" in result:
        return openai_error(400, result["error"])
    return result


def streamed(batcher: Batcher, predictor: Predictor, prepared: Prepared, chunk: Chunks):
    """Server-sent events: the text of each of its `n` answers as it is generated, then the
    end; QueueFull (NotServing), before any event, when the queue is full (the loop has
    stopped)."""
    loop = asyncio.get_running_loop()
    pieces: asyncio.Queue[tuple[int, str]] = asyncio.Queue()
    choices = prepared.parameters.get("n", 1)
    prepared.streamer = predictor.streamer(
        lambda index, text: loop.call_soon_threadsafe(pieces.put_nowait, (index, text)), choices
    )
    own = (prepared.parameters or {}) | {"stream": uuid.uuid4().hex}  # alone in its batch
    result = batcher.submit([prepared], [own])  # QueueFull now, before the response starts
    stops = prepared.parameters.get("stop") or []
    events = sse_events(result, pieces, [stops] if isinstance(stops, str) else stops, chunk,
                        choices)  # fmt: skip
    return StreamingResponse(dropped_when_gone(events, result), media_type="text/event-stream")


async def dropped_when_gone(events: AsyncIterator[str], result: asyncio.Future):
    """The events; when the caller goes first (the response stops being read), its
    instance is dropped: out of the queue, or out of the continuous batching engine's batch
    (a `generate()` already running runs on)."""
    try:
        async for event in events:
            yield event
    finally:
        if not result.done():
            result.cancel()  # its end, a CancelledError, is nobody's to read
            result.add_done_callback(lambda done: done.cancelled() or done.exception())


async def generated_pieces(
    result: asyncio.Future, pieces: asyncio.Queue
) -> AsyncIterator[tuple[int, str]]:
    """Each piece of text as it comes, with its answer's index, until the prediction is
    done."""
    while True:
        getter = asyncio.ensure_future(pieces.get())
        try:
            await asyncio.wait({getter, result}, return_when=asyncio.FIRST_COMPLETED)
        finally:  # also when the caller went: the events are closed while it waits
            getter.cancel()
        if getter.done() and not getter.cancelled():
            yield getter.result()
            continue
        while not pieces.empty():
            yield pieces.get_nowait()
        return


def sendable(text: str, stops: list[str]) -> str:
    """The part of the text so far that no stop string can still cut: up to a stop string
    found, else all but the end that may begin one."""
    found = [text.find(stop) for stop in stops if stop in text]
    if found:
        return text[: min(found)]
    held = max((len(stop) - 1 for stop in stops), default=0)
    return text[: len(text) - held]


async def sse_events(result: asyncio.Future, pieces: asyncio.Queue, stops: list[str],
                     chunk: Chunks, choices: int = 1) -> AsyncIterator[str]:  # fmt: skip
    if chunk.chat:
        for index in range(choices):
            yield chunk.first(index)
    texts, sent = [""] * choices, [0] * choices
    async for index, piece in generated_pieces(result, pieces):
        texts[index] += piece
        ready = sendable(texts[index], stops)
        if len(ready) > sent[index]:
            yield chunk.delta(ready[sent[index] :], index=index)
            sent[index] = len(ready)
    try:
        (answer,) = result.result()
    except Exception as error:  # noqa: BLE001 - said in the stream, as OpenAI's servers do
        answer = {"error": f"the prediction failed: {type(error).__name__}"}
    if "error" in answer:
        yield sse({"error": {"message": answer["error"], "type": "server_error", "param": None,
                             "code": None}})  # fmt: skip
        yield "data: [DONE]\n\n"
        return
    for choice in answer["choices"]:
        yield from_answer_end(chunk, choice, sent[choice["index"]])
    if chunk.with_usage:
        yield chunk.usage(answer["usage"])
    yield "data: [DONE]\n\n"


def from_answer_end(chunk: Chunks, choice: dict, sent: int) -> str:
    """The rest of an answer's text (held back for stop strings) and why it ended."""
    full = choice["message"]["content"] if "message" in choice else choice["text"]
    rest = full[sent:] if len(full) > sent else ""
    return chunk.delta(rest, choice["finish_reason"], choice["index"])


class Chunks:
    """OpenAI's chunks of one streamed answer (a chat's; `text` ones for a completion)."""

    def __init__(self, chat: bool, model: object, usage: bool) -> None:
        self.chat, self.with_usage = chat, usage
        self.created = int(time.time())
        prefix = "chatcmpl" if chat else "cmpl"
        self.identity = {"id": f"{prefix}-{uuid.uuid4().hex}",
                         "model": model if isinstance(model, str) else None}  # fmt: skip

    def body(self, choices: list, **more) -> str:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        usage = {"usage": None} if self.with_usage else {}
        return sse({**self.identity, "object": kind, "created": self.created,
                    "choices": choices, **usage, **more})  # fmt: skip

    def first(self, index: int = 0) -> str:
        return self.body([{"index": index, "delta": {"role": "assistant", "content": ""},
                           "logprobs": None, "finish_reason": None}])  # fmt: skip

    def delta(self, text: str, finish: str | None = None, index: int = 0) -> str:
        if not self.chat:
            return self.body([{"index": index, "text": text, "logprobs": None,
                               "finish_reason": finish}])  # fmt: skip
        delta = {"content": text} if text else {}
        return self.body([{"index": index, "delta": delta, "logprobs": None,
                           "finish_reason": finish}])  # fmt: skip

    def usage(self, usage: dict) -> str:
        return self.body([], usage=usage)


def sse(data: dict) -> str:
    return f"data: {json.dumps(data)}\n\n"
