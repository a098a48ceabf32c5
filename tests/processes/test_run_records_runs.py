"""One output directory, one job, through real restarts of two simulated Vertex AI nodes: a
job that delivered its model, and one that failed in a way that would repeat, restarted as
Vertex AI restarts them, train nothing again (trainer/storage/run_records.py; the records
and the launcher's answers in-process: tests/unit/test_run_records.py)."""

from __future__ import annotations

import re
import uuid

import pytest

from tests.support.gcs_emulator import BUCKET
from tests.support.helpers import (
    DEMO_SPEECH_FLAGS,
    FAILING_METRICS,
    REPO_ROOT,
    assert_manifest_matches_store,
    start_nodes,
    vertex_outputs,
    with_start_hook,
)
from trainer.storage.checkpoints import complete_checkpoints
from trainer.storage.store import open_store

pytestmark = pytest.mark.slow

STEPS = 4
NODE_RUN = [
    *DEMO_SPEECH_FLAGS,
    "--max_steps", str(STEPS),
    "--save_steps", "2",
    "--eval_strategy", "steps",
    "--max_eval_samples", "2",
    "--per_device_eval_batch_size", "2",
    "--per_device_train_batch_size", "2",
    "--generation_max_length", "4",
    "--logging_steps", "1",
    "--ddp_timeout", "60",
    "--stop_grace_seconds", "25",  # a failing node's uploads finish first, on a busy machine
    "--output_dir", "out",
]  # fmt: skip
STEP_LINE = re.compile(rf"^step \d+/{STEPS} ", re.MULTILINE)
"""The chief's progress line for each step it trains."""
NODE_TIMEOUT = 420
"""No run may hang: each node is killed (and the test fails) after this many seconds."""


def error_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if line.startswith("error:")]


def vertex_job(root, demo_assets, gcs: str, eval_steps: int) -> tuple[str, list[tuple]]:
    """A two-node Vertex AI job (one CLOUD_ML_JOB_ID) whose metric raises at every
    evaluation, run once and then restarted on the same machines, as Vertex AI restarts
    replicas that exit non-zero: its base URI and each attempt's (exit code, log) per node."""
    base = f"gs://{BUCKET}/{uuid.uuid4().hex}"
    env = {"STORAGE_EMULATOR_HOST": gcs, "CLOUD_ML_JOB_ID": "4242", **vertex_outputs(base),
           "PYTHONPATH": str(REPO_ROOT)}  # fmt: skip
    env = with_start_hook(env, root / "hooks", FAILING_METRICS)
    args = [*NODE_RUN, "--eval_steps", str(eval_steps)]
    attempts = []
    for log_name in ("trainer.log", "restart.log"):
        nodes = start_nodes(root / "job", demo_assets.model_dir, demo_assets.dataset_dir,
                            args, log_name=log_name, **env)  # fmt: skip
        attempts.append([node.finish(NODE_TIMEOUT) for node in nodes])
    return base, attempts


def test_a_restarted_job_that_delivered_its_model_exits_0_at_once(tmp_path, demo_assets, gcs):
    """The evaluation at the last step fails (its metric, on every rank) after the model is
    delivered: the step is still saved and uploaded, the model delivered with its manifest,
    every node exits 1 and the chief's one line says so, which Vertex AI answers with a
    restart. The restart trains nothing: every node exits 0 before launch with one line
    saying where the model is."""
    base, (first, restart) = vertex_job(tmp_path, demo_assets, gcs, eval_steps=STEPS)
    for code, log in first:
        assert code == 1, log[-3000:]
        assert "the evaluation at step 4 failed (ValueError: metric backend exploded)" in log
    assert len(STEP_LINE.findall(first[0][1])) == STEPS, "the chief logs every step it trains"
    assert error_lines(first[0][1]) == [
        f"error: the evaluation at step {STEPS} failed (ValueError: metric backend exploded); "
        f"the newest complete checkpoint is {base}/checkpoints/checkpoint-{STEPS}, where a "
        f"restart resumes; the trained model is saved at {base}/model/ (load it with "
        "from_pretrained)"
    ], first[0][1][-3000:]
    checkpoints = open_store(f"{base}/checkpoints")
    assert complete_checkpoints(checkpoints) == ["checkpoint-2", f"checkpoint-{STEPS}"]
    assert_manifest_matches_store(checkpoints.child(f"checkpoint-{STEPS}"))
    assert open_store(f"{base}/model").read_text("manifest.json"), "the model is complete"
    assert_manifest_matches_store(open_store(f"{base}/model"))

    for rank, (code, log) in enumerate(restart):
        assert code == 0, f"node {rank}:\n{log[-3000:]}"
        assert (
            "model delivered: an earlier attempt of this job (job 4242, trial 1) delivered "
            f"the trained model to {base}/model/ (its manifest.json lists every file) after "
            "step 4; nothing is trained again"
        ) in log.splitlines(), log[-3000:]
        assert not STEP_LINE.search(log) and "resuming from" not in log, "it trained again"
        assert f"node {rank} of 2" not in log, "it launched the training processes"


def test_a_restarted_job_whose_failure_would_repeat_stops_at_once_with_its_line(
    tmp_path, demo_assets, gcs
):
    """The metric raises at the evaluation of step 2: the step is saved, every node exits 1,
    and the chief records the failure with checkpoint-2 as the newest complete checkpoint.
    The restart, finding nothing newer, stops every node before launch with that line and
    exit code 1 instead of training steps 1-2 again (or resuming and failing the same way)."""
    base, (first, restart) = vertex_job(tmp_path, demo_assets, gcs, eval_steps=2)
    (chief_line,) = error_lines(first[0][1])
    assert chief_line.startswith(
        "error: the evaluation at step 2 failed (ValueError: metric backend exploded); the "
        f"newest complete checkpoint is {base}/checkpoints/checkpoint-2"
    ), first[0][1][-3000:]
    assert complete_checkpoints(open_store(f"{base}/checkpoints")) == ["checkpoint-2"]

    for rank, (code, log) in enumerate(restart):
        assert code == 1, f"node {rank}:\n{log[-3000:]}"
        assert error_lines(log) == [
            f"{chief_line.split('; the newest complete checkpoint is ')[0]} [so ended an "
            "earlier attempt of this job (job 4242, trial 1), with checkpoint-2, still the "
            "newest complete one: nothing was started; fix the cause in a new job "
            "(--resume_from_output_dir continues this run)]"
        ], log[-3000:]
        assert not STEP_LINE.search(log) and "resuming from" not in log, "it trained again"
