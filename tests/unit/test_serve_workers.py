"""`--workers N`'s pieces in this process (tests/processes/test_serve_workers_runs.py runs the
workers themselves): health shared across the workers on a real uvicorn server on loopback,
the CPU's threads split among them, and the refusal of copies that cannot fit a GPU."""

from __future__ import annotations

import httpx
from safetensors.torch import load_file

from tests.support.served_app import LOCAL, READABLE, running
from trainer.serve.app import make_app
from trainer.serve.workers import (
    LOADING,
    READY,
    STOPPED,
    SharedHealth,
    copies_refusal,
    threads_per_worker,
    weight_count,
)


def test_health_is_503_until_every_worker_is_ready_and_each_answer_names_its_worker(
    text_predictor,
):
    states = [READY, LOADING, READY]  # this app is worker 2; worker 1 still loads
    app = make_app(LOCAL, lambda: text_predictor, 8, 0.01, 2**20, 64,
                   gcs_read_prefixes=READABLE)  # fmt: skip
    with running(SharedHealth(app, LOCAL.health_route, states, 2)) as url:
        answer = httpx.post(url + "/predict", json={"instances": ["fine"]})
        assert answer.status_code == 200 and answer.headers["x-serve-worker"] == "2"
        loading = httpx.get(url + "/health")
        assert (loading.status_code, loading.json()) == (
            503, {"status": "loading", "workers": ["ready", "loading", "ready"]})  # fmt: skip
        assert loading.headers["x-serve-worker"] == "2"
        states[1] = READY
        ready = httpx.get(url + "/health")
        assert ready.status_code == 200 and ready.json()["status"] == "ready"
        states[0] = STOPPED  # another worker died, or its batching loop stopped
        failed = httpx.get(url + "/health")
        assert (failed.status_code, failed.json()["status"]) == (503, "failed")


def test_the_cpus_threads_are_split_among_the_workers():
    assert threads_per_worker(2, {"OMP_NUM_THREADS": "8"}) == 4
    assert threads_per_worker(3, {"OMP_NUM_THREADS": "8"}) == 2
    assert threads_per_worker(4, {"OMP_NUM_THREADS": "2"}) == 1


def test_copies_that_plainly_cannot_fit_the_gpu_are_refused_in_one_line(text_classifier):
    weights = weight_count(text_classifier)  # from the safetensors header, no tensor read
    tensors = load_file(text_classifier / "model.safetensors")
    assert weights == sum(tensor.numel() for tensor in tensors.values()) > 0
    bert_base = 110_000_000  # 0.22 GB in bf16, plus a CUDA context each
    assert copies_refusal(4, bert_base, 80 * 10**9) is None
    assert copies_refusal(4, bert_base, None) is None and copies_refusal(4, None, 10**9) is None
    refusal = copies_refusal(8, 7_000_000_000, 80 * 10**9)  # eight 7B models on an 80 GB GPU
    assert refusal == (
        "--workers 8: 8 copies of the model (14.0 GB of bf16 weights and a CUDA context of "
        "about 0.5 GB each) do not fit the GPU's 80.0 GB free; at most 5 would, before any "
        "batch's activations")  # fmt: skip
