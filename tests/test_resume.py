"""Nothing lost: a node dies, the job restarts, training resumes from Cloud Storage.

Two simulated nodes (separate processes, directories and CLUSTER_SPECs) write
checkpoints, TensorBoard logs and the model to a real GCS emulator through the real
google-cloud-storage client, with the output locations Vertex AI derives from
`baseOutputDirectory`.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid

import pytest
import torch
from safetensors.torch import load_file
from transformers import WhisperForConditionalGeneration, WhisperProcessor

from tests.conftest import (
    DEMO_SPEECH_FLAGS,
    assert_manifest_matches_store,
    run_trainer,
    start_nodes,
    trainer_env,
)
from tests.gcs_emulator import BUCKET, FlakyProxy
from trainer.checkpoints import complete_checkpoints
from trainer.storage import open_store

pytestmark = pytest.mark.slow

MAX_STEPS = 40
RUN = [
    *DEMO_SPEECH_FLAGS,
    "--deepspeed", "zero2",
    "--max_steps", str(MAX_STEPS),
    "--save_steps", "5",
    "--save_total_limit", "2",
    "--logging_steps", "5",
    "--eval_strategy", "steps",
    "--eval_steps", "20",
    "--max_eval_samples", "4",
    "--per_device_eval_batch_size", "4",
    "--per_device_train_batch_size", "4",
    "--learning_rate", "1e-3",
    "--seed", "7",
    "--ddp_timeout", "60",
    "--output_dir", "out",
]  # fmt: skip


def vertex_outputs(base: str) -> dict[str, str]:
    """The variables Vertex AI sets from a job's baseOutputDirectory."""
    return {
        "AIP_CHECKPOINT_DIR": f"{base}/checkpoints/",
        "AIP_MODEL_DIR": f"{base}/model/",
        "AIP_TENSORBOARD_LOG_DIR": f"{base}/logs/",
    }


def finish_all(nodes, timeout=600) -> list[str]:
    outputs = []
    for rank, node in enumerate(nodes):
        code, output = node.finish(timeout)
        assert code == 0, f"node {rank} failed:\n{output[-3000:]}"
        outputs.append(output)
    return outputs


def final_weights(base: str, tmp_path) -> dict[str, torch.Tensor]:
    local = tmp_path / f"model-{uuid.uuid4().hex}"
    open_store(f"{base}/model").download(local)
    return load_file(local / "model.safetensors")


def wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_killed_node_restart_resumes_and_matches_an_uninterrupted_run(tmp_path, demo_assets, gcs):
    job = f"gs://{BUCKET}/{uuid.uuid4().hex}"
    env = {"STORAGE_EMULATOR_HOST": gcs}
    inputs = (demo_assets.model_dir, demo_assets.dataset_dir)

    # 1. The reference: the same job, never interrupted.
    uninterrupted = f"{job}/uninterrupted"
    finish_all(start_nodes(tmp_path / "a", *inputs, RUN, **env,
                           **vertex_outputs(uninterrupted)))  # fmt: skip

    # 2. The same job; the worker node is killed once checkpoint-10 is complete.
    base = f"{job}/interrupted"
    checkpoints = open_store(f"{base}/checkpoints")
    nodes = start_nodes(tmp_path / "b", *inputs, RUN, **env, **vertex_outputs(base))
    wait_until(lambda: "checkpoint-10" in complete_checkpoints(checkpoints), 400,
               "checkpoint-10 in the store")  # fmt: skip
    nodes[1].kill_node()
    killed_at = time.monotonic()
    code, chief_log = nodes[0].finish(timeout=300)
    chief_exit_seconds = time.monotonic() - killed_at
    assert code != 0, "the chief must fail when its peer dies, not hang or succeed"
    steps_logged = [int(s) for s in re.findall(rf"step (\d+)/{MAX_STEPS}", chief_log)]
    assert max(steps_logged, default=0) < MAX_STEPS, "the kill came after the run finished"
    assert not open_store(f"{base}/model").list_files(), "no final model from a failed run"
    newest_complete = complete_checkpoints(checkpoints)[-1]

    # 3. Vertex restarts the job: fresh machines (no local files), same outputs.
    restart = start_nodes(tmp_path / "c", *inputs, RUN, **env, **vertex_outputs(base),
                          CLOUD_ML_HP_METRIC_FILE=str(tmp_path / "hypertune.jsonl"))  # fmt: skip
    chief_log, _ = finish_all(restart)
    assert f"resuming from out/{newest_complete}" in chief_log
    resumed_step = int(newest_complete.split("-")[1])
    first_step_after = min(int(s) for s in re.findall(rf"step (\d+)/{MAX_STEPS}", chief_log))
    assert first_step_after == resumed_step + 5, "training restarted from scratch"

    reference, resumed = final_weights(uninterrupted, tmp_path), final_weights(base, tmp_path)
    assert reference.keys() == resumed.keys()
    worst = max((reference[k] - resumed[k]).abs().max().item() for k in reference)
    print(
        f"chief exited {chief_exit_seconds:.1f}s after the kill; resumed from "
        f"{newest_complete}; max |weight difference| vs uninterrupted: {worst:.3g}"
    )
    assert worst < 1e-5, f"resumed weights differ from the uninterrupted run by {worst}"

    # Retention in GCS: at most save_total_limit complete checkpoints, plus the best one.
    complete = complete_checkpoints(checkpoints)
    assert len(complete) <= 2 + 1, complete
    for name in complete:
        assert_manifest_matches_store(checkpoints.child(name))

    # TensorBoard logs reached their store; hypertune saw one report per evaluation.
    assert any("tfevents" in p for p in open_store(f"{base}/logs").list_files())
    reports = [json.loads(line) for line in (tmp_path / "hypertune.jsonl").read_text().split("\n")
               if line]  # fmt: skip
    steps = [int(r["global_step"]) for r in reports]
    assert steps == sorted(set(steps)) and steps[-1] == MAX_STEPS, reports
    assert all(float(r["wer"]) >= 0 for r in reports)


def test_training_completes_while_storage_fails_requests(tmp_path, demo_cache, gcs):
    proxy = FlakyProxy(gcs, failure_rate=0.15, seed=3)
    base = f"gs://{BUCKET}/{uuid.uuid4().hex}"
    try:
        code, output = run_trainer(
            ["--nproc_per_node", "2", "--max_steps", "6", "--save_steps", "2",
             "--eval_strategy", "no", "--logging_steps", "2", "--output_dir", "out"],
            cwd=tmp_path,
            env=trainer_env(demo_cache, STORAGE_EMULATOR_HOST=proxy.url, **vertex_outputs(base)),
        )  # fmt: skip
    finally:
        proxy.close()
    assert code == 0, output[-3000:]
    assert proxy.failures > 0, "no fault was injected: the test proved nothing"
    checkpoints = open_store(f"{base}/checkpoints")
    # the demo recipe's save_total_limit (2) applies in GCS too
    assert complete_checkpoints(checkpoints) == ["checkpoint-4", "checkpoint-6"]
    assert "checkpoint-2" not in checkpoints.list_dirs()
    for name in complete_checkpoints(checkpoints):
        assert_manifest_matches_store(checkpoints.child(name))
        assert any(p.endswith("optim_states.pt") for p in checkpoints.child(name).list_files())
    assert "model.safetensors" in open_store(f"{base}/model").list_files()
    print(f"storage proxy failed {proxy.failures} of {proxy.requests} requests")


FAILING_METRICS = """
# sitecustomize: every Python process of the run loads it at start-up. It makes the speech
# task's metric raise, as a broken metric library or a bad reference text would.
import trainer.tasks.speech as speech


def _failing_metrics(self, processor):
    def compute(prediction):
        raise ValueError("metric backend exploded")

    return compute


speech.SpeechRecognitionTask.compute_metrics = _failing_metrics
"""


def test_a_failing_final_evaluation_keeps_the_trained_model(tmp_path, demo_assets, gcs):
    """Training ends, then the final evaluation fails: the model is already in the bucket,
    the run exits non-zero, and one error line says what failed and where the model is."""
    hooks, run_dir = tmp_path / "hooks", tmp_path / "run"
    hooks.mkdir(), run_dir.mkdir()
    (hooks / "sitecustomize.py").write_text(FAILING_METRICS)
    base = f"gs://{BUCKET}/{uuid.uuid4().hex}"
    env = trainer_env(tmp_path / "cache", STORAGE_EMULATOR_HOST=gcs, **vertex_outputs(base))
    env["PYTHONPATH"] = f"{hooks}{os.pathsep}{env['PYTHONPATH']}"
    code, output = run_trainer(
        ["--nproc_per_node", "2", "--model_name_or_path", str(demo_assets.model_dir),
         "--dataset_name", str(demo_assets.dataset_dir), *DEMO_SPEECH_FLAGS,
         "--max_steps", "2", "--per_device_train_batch_size", "2", "--eval_strategy", "no",
         "--save_strategy", "no", "--max_eval_samples", "2", "--generation_max_length", "4",
         "--output_dir", "out"],
        cwd=run_dir,
        env=env,
    )  # fmt: skip

    assert code == 1, output[-3000:]
    assert "training done in" in output, output[-5000:]
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: the final evaluation failed after training (ValueError: metric backend "
        f"exploded); the trained model is saved at {base}/model/ (load it with from_pretrained)"
    ], output[-3000:]
    assert "Traceback" in output and "metric backend exploded" in output

    local = tmp_path / "model-from-gcs"
    open_store(f"{base}/model").download(local)
    model = WhisperForConditionalGeneration.from_pretrained(local)
    WhisperProcessor.from_pretrained(local)
    initial = WhisperForConditionalGeneration.from_pretrained(demo_assets.model_dir).state_dict()
    trained = model.state_dict()
    changed = [name for name in initial if not torch.equal(initial[name], trained[name])]
    assert len(changed) > len(initial) // 2, "the delivered weights are not the trained ones"
