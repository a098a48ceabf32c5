"""The server's app (trainer/serve/app.py) run by uvicorn on a loopback port, in the test's
process: for the tests that send it real HTTP requests."""

from __future__ import annotations

import contextlib
import threading

import httpx
import uvicorn

from tests.support.helpers import free_port, wait_until
from trainer.serve.app import make_app
from trainer.serve.contract import Contract

LOCAL = Contract.from_environment({})


@contextlib.contextmanager
def running(app, contract: Contract = LOCAL):
    """`app` served by uvicorn on a free loopback port for the block; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, 30, "the server to start")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


READABLE = ("gs://test-bucket/",)
"""The gs:// prefix the served instances may name (the tests' emulated bucket)."""


def serve(predictor, contract: Contract = LOCAL, **limits):
    """`predictor` behind the server's routes, with small limits unless `limits` say."""
    settings = {"max_batch_size": 8, "max_wait": 0.01, "max_request_bytes": 2**20,
                "queue_size": 64, "gcs_read_prefixes": READABLE} | limits  # fmt: skip
    return running(make_app(contract, lambda: predictor, **settings), contract)


def wait_ready(url: str, route: str = "/health") -> None:
    wait_until(lambda: httpx.get(url + route).status_code == 200, 60, "health 200")


def streamed_choices(chunks: list, choices: int) -> tuple[list[str], list[str | None]]:
    """A streamed chat completion's chunks (the OpenAI SDK's) put together: each choice's
    text and why it ended, by the `index` each chunk names."""
    texts, ends = [""] * choices, [None] * choices
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            ends[choice.index] = choice.finish_reason or ends[choice.index]
    return texts, ends
