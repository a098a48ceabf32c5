"""`python -m trainer.serve --workers 2` as its own process on the tiny text classifier: one
port, two model workers, each request answered by one of them (named by the `x-serve-worker`
header) with what one process answers; health 503 until both workers are warm, 503 again when
one is killed, 200 once its replacement is warm; a gs:// model downloaded once for both;
SIGTERM ends them all."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.support.gcs_emulator import BUCKET, FlakyProxy
from tests.support.helpers import (
    free_port,
    served_url,
    trainer_env,
    wait_until,
    wait_until_healthy,
    with_start_hook,
)
from tests.support.served_app import serve, wait_ready
from trainer.storage.store import open_store
from trainer.tasks.served_model import load_predictor

pytestmark = pytest.mark.slow

HELD_LOAD = """
import os, time
from trainer.tasks import served_model

_load = served_model.load_predictor


def held(model_dir):
    # The first worker to load waits for the test's `release` file; the other loads at once.
    hold = os.environ["HOLD_DIR"]
    try:
        os.close(os.open(os.path.join(hold, "claimed"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return _load(model_dir)
    while not os.path.exists(os.path.join(hold, "release")):
        time.sleep(0.1)
    return _load(model_dir)


served_model.load_predictor = held
"""
BROKEN_LOOP = """
import os
from trainer.serve import batching

_one_batch = batching.Batcher._one_batch


async def breaking(self):
    # Once the test's `break` file is there, the first worker to start a batch has its
    # batching loop stop (once: the replacement worker's loop runs).
    hold = os.environ["HOLD_DIR"]
    if os.path.exists(os.path.join(hold, "break")):
        try:
            os.close(os.open(os.path.join(hold, "broken"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            pass
        else:
            raise RuntimeError("a planted fault")
    return await _one_batch(self)


batching.Batcher._one_batch = breaking
"""
TEXTS = ["a great film", "awful", "not bad at all", "the plot", "loved it", "dull", "fine"]


def start(args: list[str], env: dict, log: Path) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen([sys.executable, "-m", "trainer.serve", *args], env=env,
                                cwd=log.parent, stdout=out, stderr=subprocess.STDOUT)  # fmt: skip


def alive(server: subprocess.Popen, log: Path) -> bool:
    assert server.poll() is None, log.read_text()[-3000:]
    return True


def ready_pids(log: Path) -> dict[int, int]:
    """Worker index -> pid, of each "worker I (pid P): model ready" line so far."""
    found = re.findall(r"^worker (\d) \(pid (\d+)\): model ready", log.read_text(), re.M)
    return {int(index): int(pid) for index, pid in found}


def health(url: str) -> tuple[int, dict] | None:
    """Health's status and body; None while no worker answers yet (the port is bound
    before the workers start, so a connection waits in its backlog meanwhile)."""
    try:
        answer = httpx.get(url + "/health")
    except httpx.TransportError:
        return None
    return answer.status_code, answer.json()


def test_two_workers_share_the_port_answer_as_one_process_and_health_waits_for_both(
    tmp_path, text_classifier, demo_cache
):
    log = tmp_path / "serve.log"
    (tmp_path / "hold").mkdir()
    env = trainer_env(demo_cache, HOLD_DIR=str(tmp_path / "hold"), OMP_NUM_THREADS="2")
    env = with_start_hook(env, tmp_path / "hook", HELD_LOAD)
    server = start([str(text_classifier), "--port", "0", "--host", "127.0.0.1",
                    "--workers", "2"], env, log)  # fmt: skip
    url = served_url(server, log)
    try:
        wait_until(lambda: alive(server, log) and len(ready_pids(log)) == 1, 120,
                   "one worker ready, the other held")  # fmt: skip
        # One worker is warm, the other still loading: health says 503 on either.
        for _ in range(4):
            code, body = health(url)
            assert code == 503 and body["status"] == "loading", body
            assert sorted(body["workers"]) == ["loading", "ready"]
        (tmp_path / "hold" / "release").touch()
        wait_until_healthy(server, url + "/health", log)

        # Several clients, each request on its own connection: both workers answer.
        def ask(index: int) -> tuple[str, dict]:
            answer = httpx.post(url + "/predict", json={"instances": [TEXTS[index % 7]]})
            assert answer.status_code == 200, answer.text
            return answer.headers["x-serve-worker"], answer.json()["predictions"][0]

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(ask, range(48)))
        assert {worker for worker, _ in answers} == {"0", "1"}
        with serve(load_predictor(text_classifier)) as one:  # what one process answers
            wait_ready(one)
            alone = httpx.post(one + "/predict", json={"instances": TEXTS}).json()["predictions"]
        for index, (_, prediction) in enumerate(answers):
            assert prediction["label"] == alone[index % 7]["label"]
            assert prediction["score"] == pytest.approx(alone[index % 7]["score"], abs=1e-5)

        # A worker killed: health 503 at once, one line says which and how; it is replaced.
        pids = ready_pids(log)
        os.kill(pids[1], signal.SIGKILL)
        wait_until(lambda: (health(url) or (0,))[0] == 503, 30, "health 503 after the kill")
        wait_until_healthy(server, url + "/health", log)
        assert ready_pids(log)[1] != pids[1]
        assert httpx.post(url + "/predict", json={"instances": ["fine"]}).status_code == 200
        workers = [int(pid) for pid in re.findall(r"\(pid (\d+)\)", log.read_text())]
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == -signal.SIGTERM
    finally:
        if server.poll() is None:
            server.kill()
    output = log.read_text()
    assert "Traceback" not in output and "leaked" not in output, output[-3000:]
    assert f"on {url.removeprefix('http://')} with 2 workers of 1 torch threads each" in output
    assert (f"error: worker 1 (pid {pids[1]}) was killed by SIGKILL; health answers 503 until "
            "another has loaded the model") in output.splitlines()  # fmt: skip
    for pid in set(workers):  # every worker, the replacement too, has ended
        wait_until(lambda pid=pid: not Path(f"/proc/{pid}").exists(), 30, f"pid {pid} to end")


def test_a_gs_model_is_downloaded_once_for_every_worker_while_health_says_loading(
    tmp_path, text_classifier, demo_cache, gcs
):
    open_store(f"gs://{BUCKET}/served/model").upload(text_classifier)
    proxy = FlakyProxy(gcs)
    held = threading.Event()
    weights = proxy.fault("GET", r"served/model/model\.safetensors.*alt=media", hold=held)
    port, log = free_port(), tmp_path / "serve.log"
    env = trainer_env(demo_cache, AIP_STORAGE_URI=f"gs://{BUCKET}/served/model",
                      AIP_HTTP_PORT=str(port), STORAGE_EMULATOR_HOST=proxy.url)  # fmt: skip
    server = start(["--workers", "2"], env, log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: alive(server, log) and weights.hits == 1, 60, "the download")
        wait_until(lambda: health(url) is not None, 60, "the workers to answer")
        # The weights are still held: health answers, 503, from both workers.
        for _ in range(4):
            assert health(url) == (503, {"status": "loading", "workers": ["loading"] * 2})
        held.set()
        wait_until_healthy(server, url + "/health", log)
        assert sorted(ready_pids(log)) == [0, 1] and weights.hits == 1
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == -signal.SIGTERM
    finally:
        held.set()
        if server.poll() is None:
            server.kill()
        proxy.close()


def test_a_worker_whose_batching_loop_stops_turns_health_503_and_is_replaced(
    tmp_path, text_classifier, demo_cache
):
    port, log = free_port(), tmp_path / "serve.log"
    (tmp_path / "hold").mkdir()
    env = trainer_env(demo_cache, HOLD_DIR=str(tmp_path / "hold"))
    env = with_start_hook(env, tmp_path / "hook", BROKEN_LOOP)
    server = start([str(text_classifier), "--port", str(port), "--workers", "2"], env, log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(server, url + "/health", log)
        (tmp_path / "hold" / "break").touch()
        answer = httpx.post(url + "/predict", json={"instances": ["fine"]})
        # Its batch was already being gathered: answered; the worker's next batch stops it.
        assert answer.status_code == 200, answer.text
        broken = int(answer.headers["x-serve-worker"])
        wait_until(lambda: "the worker ends" in log.read_text(), 30, "the loop's error line")
        code, body = health(url) or (0, {})
        assert code == 503 and body["status"] in ("failed", "loading"), body
        wait_until_healthy(server, url + "/health", log)
        assert httpx.post(url + "/predict", json={"instances": ["fine"]}).status_code == 200
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == -signal.SIGTERM
    finally:
        if server.poll() is None:
            server.kill()
    lines = [line for line in log.read_text().splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and re.fullmatch(
        rf"error: worker {broken} \(pid \d+\): the batching loop stopped: RuntimeError: a "
        r"planted fault; the worker ends and another starts; health answers 503 until it is "
        r"ready", lines[0]), lines  # fmt: skip
    assert f"worker {broken} started again" in log.read_text()


def test_one_process_whose_batching_loop_stops_ends_for_vertex_to_restart_it(
    tmp_path, text_classifier, demo_cache
):
    """Without --workers there is no supervisor to start another: the server ends, exit 1,
    with one line, so that Vertex AI restarts the container (its health would else stay 503
    behind an open port for good)."""
    port, log = free_port(), tmp_path / "serve.log"
    (tmp_path / "hold").mkdir()
    env = trainer_env(demo_cache, HOLD_DIR=str(tmp_path / "hold"))
    env = with_start_hook(env, tmp_path / "hook", BROKEN_LOOP)
    server = start([str(text_classifier), "--port", str(port)], env, log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(server, url + "/health", log)
        (tmp_path / "hold" / "break").touch()
        answer = httpx.post(url + "/predict", json={"instances": ["fine"]})
        assert answer.status_code == 200, answer.text
        assert server.wait(timeout=60) == 1
    finally:
        if server.poll() is None:
            server.kill()
    lines = [line for line in log.read_text().splitlines() if line.startswith("error:")]
    assert lines == [
        "error: the batching loop stopped: RuntimeError: a planted fault; the "
        "server ends (exit 1), for Vertex AI to start the container again"
    ], lines
