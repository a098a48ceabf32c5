"""`python -m trainer.serve` as Vertex AI runs it: its own process, the port and routes from
`AIP_*` variables, the model from `AIP_STORAGE_URI` in Cloud Storage (the GCS emulator), the
demo's tiny Whisper; 16 clients at once, good requests and requests with a bad instance
mixed, each good clip answered with what a plain `pipeline()` transcribes, each bad one with
an error in its place;
nothing secret in any response or log line; SIGTERM stops it cleanly."""

from __future__ import annotations

import base64
import os
import shutil
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.support.gcs_emulator import BUCKET
from tests.support.helpers import free_port, trainer_env, wait_until_healthy
from trainer.storage.store import open_store

pytestmark = pytest.mark.slow

SECRET = "hf_serving_secret_never_printed"
PREDICT = "/v1/endpoints/123/deployedModels/456:predict"
HEALTH = "/v1/endpoints/123/deployedModels/456"


def test_the_server_downloads_its_model_batches_16_clients_and_answers_each_right(
    tmp_path, demo_assets, demo_cache, gcs
):
    from transformers import pipeline

    open_store(f"gs://{BUCKET}/serving/model").upload(demo_assets.model_dir)
    clips = sorted((demo_assets.dataset_dir / "test").glob("*.wav"))[:4]
    plain = pipeline("automatic-speech-recognition", model=str(demo_assets.model_dir))
    expected = [plain(str(c), chunk_length_s=30, ignore_warning=True)["text"].strip()
                for c in clips]  # fmt: skip
    port = free_port()
    env = trainer_env(demo_cache, AIP_HTTP_PORT=str(port), AIP_PREDICT_ROUTE=PREDICT,
                      AIP_HEALTH_ROUTE=HEALTH, AIP_STORAGE_URI=f"gs://{BUCKET}/serving/model",
                      STORAGE_EMULATOR_HOST=gcs, HF_TOKEN=SECRET,
                      SERVE_MAX_WAIT_MS="200")  # fmt: skip
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen([sys.executable, "-m", "trainer.serve"], env=env, cwd=tmp_path,
                              stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(server, url + HEALTH, tmp_path / "serve.log")
        encoded = [base64.b64encode(c.read_bytes()).decode() for c in clips]

        def ask(client: int):
            if client % 4 == 3:  # a clip, then bytes that are no audio
                body = {"instances": [{"audio": encoded[0]}, {"audio": {"b64": "bm9pc2U="}}]}
            else:
                body = {"instances": [{"audio": {"b64": encoded[(client + i) % 4]}}
                                      for i in range(client % 3 + 1)]}  # fmt: skip
            answer = httpx.post(url + PREDICT, json=body, timeout=120)
            return client, answer.status_code, answer.text, answer.json()

        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(ask, range(16)))
        for client, code, text, body in answers:
            assert SECRET not in text
            if client % 4 == 3:  # the clip predicted, the bad one's error in its place
                assert code == 200, body
                bad = {"error": "not audio that ffmpeg can decode"}
                assert body["predictions"] == [{"text": expected[0]}, bad]
            else:
                assert code == 200, body
                wanted = [expected[(client + i) % 4] for i in range(client % 3 + 1)]
                assert [p["text"] for p in body["predictions"]] == wanted
        server.send_signal(signal.SIGTERM)  # uvicorn shuts down, then ends by that signal
        assert server.wait(timeout=60) == -signal.SIGTERM
    finally:
        if server.poll() is None:
            server.kill()
        log.close()
    output = (tmp_path / "serve.log").read_text()
    assert SECRET not in output and "Traceback" not in output, output[-3000:]
    batches = [line for line in output.splitlines() if '"prediction batch"' in line]
    assert sum(int(b.split('"batch_size": ')[1].split(",")[0]) for b in batches) >= 24
    assert any('"batch_size": 1,' not in b for b in batches), "no two instances shared a pass"
    assert f"serving gs://{BUCKET}/serving/model on 0.0.0.0:{port}" in output
    assert f"instances may name gs:// objects under: gs://{BUCKET}/;" in output
    assert "model ready: speech-recognition on cpu in torch.float32" in output


def test_a_model_the_server_may_not_read_is_one_error_line_naming_the_file(
    tmp_path, demo_assets, demo_cache
):
    """A model saved by root and served by another user (the training image runs as root, the
    serving image as uid 10001): the weights file unreadable to the server, which ends with
    exit 1 and one line that names the file and why, not transformers' "No such file" under
    four tracebacks (one per model class its pipeline tried). Mode 000, and as root the server
    runs without the capabilities that let root read it (tests/support/unreadable_files.py)."""
    from tests.support.unreadable_files import unprivileged

    model = tmp_path / "model"
    shutil.copytree(demo_assets.model_dir, model)
    os.chmod(model / "model.safetensors", 0)
    server = subprocess.run(
        unprivileged([sys.executable, "-m", "trainer.serve", str(model), "--port",
                      str(free_port())]),
        env=trainer_env(demo_cache), cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert server.returncode == 1, server.stdout + server.stderr
    assert server.stderr.splitlines() == [
        f"error: the model did not load: cannot read {model}/model.safetensors: permission "
        f"denied; this process runs as uid {os.geteuid()}: make the model's files readable to "
        "it (chmod -R a+rX, on the host for a mounted folder)"
    ]
    assert len(server.stderr.splitlines()[0]) <= 300
