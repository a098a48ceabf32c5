"""`python -m trainer.serve` on a tiny Llama with its continuous batching engine (the default),
whose engine thread dies (a fault planted in the model's forward pass once the test says): one
process ends, exit 1, with one line; a worker of `--workers 2` is started again, with one
line, as when a batching loop stops (tests/processes/test_serve_workers_runs.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.chat_models import FAMILIES, save_family_model
from tests.support.helpers import (
    served_url,
    trainer_env,
    wait_until,
    wait_until_healthy,
    with_start_hook,
)

pytestmark = pytest.mark.slow

BROKEN_ENGINE = """
import os
from trainer.tasks.text_generation import continuous_batching

_init = continuous_batching.ContinuousEngine.__init__


def planted(self, model, *rest, **named):
    # Once the test's `break` file is there, the first engine to run a step raises in its
    # model's forward pass (once: the replacement worker's engines run).
    _init(self, model, *rest, **named)
    mlp = model.model.layers[0].mlp
    forward = mlp.forward

    def breaking(*args, **kwargs):
        hold = os.environ["HOLD_DIR"]
        if os.path.exists(os.path.join(hold, "break")):
            try:
                os.close(os.open(os.path.join(hold, "broken"),
                                 os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass
            else:
                raise RuntimeError("a planted fault")
        return forward(*args, **kwargs)

    mlp.forward = breaking


continuous_batching.ContinuousEngine.__init__ = planted
"""
ASK = {"instances": [{"prompt": "Hello"}], "parameters": {"max_tokens": 3, "temperature": 0}}


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return save_family_model(FAMILIES["llama"], tmp_path_factory.mktemp("llama"))


def broken_server(tmp_path: Path, demo_cache: Path, model: Path, *args: str):
    log = tmp_path / "serve.log"
    (tmp_path / "hold").mkdir()
    env = trainer_env(demo_cache, HOLD_DIR=str(tmp_path / "hold"))
    env = with_start_hook(env, tmp_path / "hook", BROKEN_ENGINE)
    with log.open("w") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "trainer.serve", str(model), "--host", "127.0.0.1",
             "--port", "0", *args],
            env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    return server, served_url(server, log), log


def error_lines(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if line.startswith("error:")]


def test_one_process_whose_engine_dies_ends_with_one_line(tmp_path, demo_cache, llama):
    server, url, log = broken_server(tmp_path, demo_cache, llama)
    try:
        wait_until_healthy(server, url + "/health", log)
        assert httpx.post(url + "/predict", json=ASK, timeout=60).status_code == 200
        (tmp_path / "hold" / "break").touch()
        httpx.post(url + "/predict", json=ASK, timeout=60)
        assert server.wait(timeout=60) == 1
    finally:
        if server.poll() is None:
            server.kill()
    assert error_lines(log) == [
        "error: the batching loop stopped: EngineStopped: the continuous batching engine "
        "failed: RuntimeError: a planted fault; the server ends (exit 1), for Vertex AI to "
        "start the container again"
    ], log.read_text()[-3000:]


def test_a_worker_whose_engine_dies_is_started_again(tmp_path, demo_cache, llama):
    server, url, log = broken_server(tmp_path, demo_cache, llama, "--workers", "2")
    try:
        wait_until_healthy(server, url + "/health", log)
        (tmp_path / "hold" / "break").touch()
        httpx.post(url + "/predict", json=ASK, timeout=60)
        wait_until(lambda: "started again" in log.read_text(), 120, "a worker started again")
        wait_until_healthy(server, url + "/health", log)
        assert httpx.post(url + "/predict", json=ASK, timeout=60).status_code == 200
    finally:
        server.terminate()  # SIGTERM, passed on to every worker
        server.wait(timeout=60)
    lines = error_lines(log)
    assert len(lines) == 1 and re.fullmatch(
        r"error: worker \d \(pid \d+\): the batching loop stopped: EngineStopped: the "
        r"continuous batching engine failed: RuntimeError: a planted fault; the worker ends "
        r"and another starts; health answers 503 until it is ready", lines[0]), lines  # fmt: skip
