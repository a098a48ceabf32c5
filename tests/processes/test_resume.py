"""Nothing lost: a node dies, restarts or is preempted, the job restarts, training resumes
from Cloud Storage.

Two simulated nodes (separate processes, directories and CLUSTER_SPECs) write
checkpoints, TensorBoard logs and the model to a real GCS emulator through the real
google-cloud-storage client, with the output locations Vertex AI derives from
`baseOutputDirectory`. The model is the demo's tiny Whisper, the data tone clips
(tests/support/tiny_assets.py): what is compared is weights and steps, not what it learns.
"""

from __future__ import annotations

import json
import re
import shutil
import time
import uuid

import pytest
import torch
from safetensors.torch import load_file
from transformers import WhisperForConditionalGeneration, WhisperProcessor

from tests.support.gcs_emulator import BUCKET, FlakyProxy
from tests.support.helpers import (
    DEMO_SPEECH_FLAGS,
    FAILING_METRICS,
    SLOW_STEPS,
    TEXT_COLUMNS,
    WedgedChief,
    assert_manifest_matches_store,
    complete_from,
    final_weights,
    finish_all,
    free_port,
    run_trainer,
    start_node,
    start_nodes,
    start_trainer,
    trainer_env,
    vertex_outputs,
    wait_while_running,
    with_start_hook,
)
from trainer.common.exit_codes import PREEMPTED_EXIT_CODE
from trainer.launcher.start_deadline import MARGIN_SECONDS
from trainer.storage.checkpoints import (
    checkpoint_names,
    checkpoint_step,
    complete_checkpoints,
)
from trainer.storage.store import open_store
from trainer.training.resume import newest_readable_checkpoint

pytestmark = pytest.mark.slow

MAX_STEPS = 20
INTERRUPT_FROM = 5
"""The tests interrupt a run once a checkpoint of this step or later is complete: a
quarter into it, with most of the run still to go however fast its steps are."""
RUN = [
    *DEMO_SPEECH_FLAGS,
    "--deepspeed", "zero2",
    "--max_steps", str(MAX_STEPS),
    "--save_steps", "5",
    "--save_total_limit", "2",
    "--logging_steps", "1",  # a line per step: the steps lost are counted exactly
    "--eval_strategy", "steps",
    "--eval_steps", "10",
    "--max_eval_samples", "4",
    "--per_device_eval_batch_size", "4",
    "--per_device_train_batch_size", "4",
    "--learning_rate", "1e-3",
    "--seed", "7",
    "--ddp_timeout", "60",
    "--output_dir", "out",
]  # fmt: skip
STEP_LINE = re.compile(rf"^step (\d+)/{MAX_STEPS} ", re.MULTILINE)

PEER_EXIT_BOUND = 120
"""Seconds a node may take to stop once a peer is gone. gloo reports a closed connection
within seconds; a peer that hangs instead is bounded by --ddp_timeout (60 s in RUN), then
the failure report waits 5 s and torchrun up to 30 s for its workers: 95 s at worst."""

START_GIVE_UP_BOUND = 180
"""Seconds a worker facing a wedged chief may take to exit in the test: the launcher's checks
(about 20 s here), --rdzv_timeout (5 s in the test) and the start deadline's margin (30 s),
with room for a busy 2-core machine. Without the deadline it never exits."""

STOP_EXIT_BOUND = 90
"""Seconds from SIGTERM until both nodes have exited: the step in flight, the save, at
most --stop_grace_seconds (25 s in the test, 8 s by default) of uploads and torchrun's 5 s
margin, on a busy 2-core machine. The bound a real stop must meet is 15 s (docs/restarts.md)."""


def tone_speech(demo_assets) -> list[str]:
    """The flags that train the demo's tiny Whisper on the tone clips."""
    return ["--model_name_or_path", str(demo_assets.model_dir),
            "--dataset_name", str(demo_assets.dataset_dir), *DEMO_SPEECH_FLAGS]  # fmt: skip


def steps_logged(log: str) -> list[int]:
    return [int(step) for step in STEP_LINE.findall(log)]


@pytest.fixture(scope="module")
def uninterrupted(gcs_emulator, demo_assets, tmp_path_factory) -> tuple[str, float, float]:
    """The reference: the job of RUN, never interrupted (run once for the tests below).
    Its outputs' base URI, its seconds per training step and its final WER."""
    base = f"gs://{BUCKET}/{uuid.uuid4().hex}/uninterrupted"
    root = tmp_path_factory.mktemp("uninterrupted")
    finish_all(start_nodes(root, demo_assets.model_dir, demo_assets.dataset_dir, RUN,
                           STORAGE_EMULATOR_HOST=gcs_emulator, **vertex_outputs(base)))  # fmt: skip
    runtime = json.loads((root / "node0" / "out" / "train_results.json").read_text())
    evaluation = json.loads((root / "node0" / "out" / "eval_results.json").read_text())
    return base, runtime["train_runtime"] / MAX_STEPS, evaluation["eval_wer"]


def assert_same_weights(reference: str, resumed: str, tmp_path) -> float:
    expected, got = final_weights(reference, tmp_path), final_weights(resumed, tmp_path)
    assert expected.keys() == got.keys()
    worst = max((expected[k] - got[k]).abs().max().item() for k in expected)
    assert worst < 1e-5, f"resumed weights differ from the uninterrupted run by {worst}"
    return worst


def model_files(base: str) -> list[str]:
    """The files in the run's model location, less the write probes of launchers killed in
    their checks (trainer/storage/store.py: a SIGKILL between the probe's write and its
    removal leaves it; it is no model)."""
    return [name for name in open_store(f"{base}/model").list_files()
            if not name.startswith(".write-probe-")]  # fmt: skip


def test_a_worker_restarted_alone_stops_the_others_and_the_job_resumes_as_if_uninterrupted(
    tmp_path, demo_assets, gcs, uninterrupted
):
    """Vertex AI restarts a failed worker with the same hostname, at once, while the other
    nodes are mid-collective; with restartJobOnWorkerRestart it then restarts every node.
    The survivor must stop within a bound, the restarted worker must neither hang nor
    train alone, and the restarted job must resume from the newest complete checkpoint."""
    reference, seconds_per_step, reference_wer = uninterrupted
    base = f"gs://{BUCKET}/{uuid.uuid4().hex}"
    env = {"STORAGE_EMULATOR_HOST": gcs, **vertex_outputs(base)}
    inputs = (demo_assets.model_dir, demo_assets.dataset_dir)
    checkpoints = open_store(f"{base}/checkpoints")
    port = free_port()

    # 1. The job runs; node 1's machine fails once checkpoint-5 is complete.
    nodes = start_nodes(tmp_path / "job", *inputs, RUN, port=port, **env)
    wait_while_running(nodes, lambda: complete_from(checkpoints, INTERRUPT_FROM), 400,
                       f"a complete checkpoint of step {INTERRUPT_FROM} or later")  # fmt: skip
    nodes[1].kill_node()
    killed_at = time.monotonic()
    nodes[1].process.wait()

    # 2. Vertex AI restarts node 1 alone, same CLUSTER_SPEC, on the same machine (its local
    # files are still there), while node 0 is still in a collective with the dead process.
    restarted = start_node(tmp_path / "job", 1, 2, port, *inputs, RUN,
                           log_name="restart.log", **env)  # fmt: skip
    code, chief_log = nodes[0].finish(timeout=PEER_EXIT_BOUND)
    chief_exit_seconds = time.monotonic() - killed_at
    assert code != 0, "the chief must fail when its peer dies, not hang or succeed"
    assert chief_exit_seconds < PEER_EXIT_BOUND
    reached = max(steps_logged(chief_log))
    assert reached < MAX_STEPS, "the kill came after the run finished"
    assert not model_files(base), "no final model from a failed run"
    newest_complete = complete_checkpoints(checkpoints)[-1]

    # 3. restartJobOnWorkerRestart: Vertex AI restarts every node. The restarted worker
    # found no training to join: it is still waiting for a rendezvous, or it met the dying
    # chief's store and failed (after `--ddp_timeout`, so possibly only now: a check made
    # earlier would race it). Either way it is replaced, and the chief comes back on a new
    # machine (no local files): both resume from the newest complete checkpoint.
    waiting = restarted.process.poll() is None
    if waiting:
        restarted.kill_node()
    code, log = restarted.finish()
    assert waiting or code != 0, f"a worker trained without its chief:\n{log[-3000:]}"
    assert not model_files(base), "a restarted worker trained alone"
    worker = start_node(tmp_path / "job", 1, 2, port, *inputs, RUN,
                        log_name="job-restart.log", **env)  # fmt: skip
    chief = start_node(tmp_path / "chief-again", 0, 2, port, *inputs, RUN, **env,
                       CLOUD_ML_HP_METRIC_FILE=str(tmp_path / "hypertune.jsonl"))  # fmt: skip
    chief_log, worker_log = finish_all([chief, worker])
    assert f"resuming from out/{newest_complete}" in chief_log
    resumed_step = int(newest_complete.split("-")[1])
    assert min(steps_logged(chief_log)) == resumed_step + 1, "training restarted from scratch"
    worst = assert_same_weights(reference, base, tmp_path)
    lost = reached - resumed_step
    print(
        f"worker restart: the chief exited {chief_exit_seconds:.1f}s after the kill; the "
        f"restarted worker {'was still waiting' if waiting else 'had failed'}; "
        f"resumed from {newest_complete}; lost work: {lost} steps "
        f"({lost * seconds_per_step:.1f}s); max |weight difference| {worst:.3g}"
    )

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
    # the resumed job ends with the uninterrupted one's weights: it scores as that one did
    assert float(reports[-1]["wer"]) == pytest.approx(reference_wer, abs=1e-6), reports


def test_a_worker_whose_chief_never_answers_gives_up_after_the_rendezvous_timeout(
    tmp_path, demo_assets
):
    """A worker restarted alone (or started) while its chief is wedged must not hold its
    machine for ever: it exits 1 with one line once --rdzv_timeout plus the margin has passed
    without a training process, and Vertex AI restarts it (with restartJobOnWorkerRestart,
    the whole job)."""
    rdzv_timeout = 5
    chief = WedgedChief()
    started = time.monotonic()
    try:
        flags = [*RUN, "--rdzv_timeout", str(rdzv_timeout)]
        inputs = (demo_assets.model_dir, demo_assets.dataset_dir)
        worker = start_node(tmp_path, 1, 2, chief.port, *inputs, flags)
        code, log = worker.finish(timeout=START_GIVE_UP_BOUND)
    finally:
        chief.close()
    seconds = time.monotonic() - started
    assert chief.held, "the worker never reached the chief's address"
    assert code == 1, f"the worker did not give up (exit {code}):\n{log[-3000:]}"
    deadline = rdzv_timeout + MARGIN_SECONDS
    expected = (
        f"error: node 1 started no training process within {deadline} s: "
        f"its rendezvous with the chief at 127.0.0.1:{chief.port} did not complete"
    )
    assert expected in log, log[-3000:]
    assert "step 1/" not in log
    print(
        f"wedged chief: the worker gave up {seconds:.1f}s after it started "
        f"(--rdzv_timeout {rdzv_timeout} + {MARGIN_SECONDS} s margin + launcher checks)"
    )


PREEMPTED_LINE = re.compile(r"^preempted: SIGTERM on node (\d+) .*?: (checkpoint-\d+) ", re.M)


def test_sigterm_to_one_node_saves_the_same_step_on_every_node_and_the_job_resumes_there(
    tmp_path, demo_assets, gcs, uninterrupted
):
    """A Spot preemption notice (SIGTERM to node 1's container): both nodes finish the step
    in flight, save it, upload it and exit with code 75 and one line; the restarted job
    resumes from exactly that step and ends with the uninterrupted run's weights."""
    reference, _, _ = uninterrupted
    base = f"gs://{BUCKET}/{uuid.uuid4().hex}"
    env = {"STORAGE_EMULATOR_HOST": gcs, **vertex_outputs(base)}
    inputs = (demo_assets.model_dir, demo_assets.dataset_dir)
    checkpoints = open_store(f"{base}/checkpoints")

    # A real node's 8 s default is for real storage; on this busy 2-core machine the
    # emulator's uploads may take longer (docs/restarts.md). The stop that overruns its grace
    # is the test after this one.
    stop_run = [*RUN, "--stop_grace_seconds", "25"]
    nodes = start_nodes(tmp_path / "job", *inputs, stop_run, **env)
    wait_while_running(nodes, lambda: complete_from(checkpoints, INTERRUPT_FROM), 400,
                       f"a complete checkpoint of step {INTERRUPT_FROM} or later")  # fmt: skip
    nodes[1].terminate()
    signalled_at = time.monotonic()
    completed_at: dict[str, float] = {}  # when each checkpoint's manifest appeared
    while any(node.process.poll() is None for node in nodes):
        assert time.monotonic() - signalled_at < STOP_EXIT_BOUND, "a node did not stop"
        for name in complete_checkpoints(checkpoints):
            completed_at.setdefault(name, time.monotonic())
        time.sleep(0.1)
    for name in complete_checkpoints(checkpoints):
        completed_at.setdefault(name, time.monotonic())
    logs = [node.finish(0) for node in nodes]

    saved = set()
    for rank, (code, log) in enumerate(logs):
        assert code == PREEMPTED_EXIT_CODE, f"node {rank}:\n{log[-3000:]}"
        lines = PREEMPTED_LINE.findall(log)
        assert len(lines) == 1, f"node {rank}: one 'preempted:' line\n{log[-3000:]}"
        origin, name = lines[0]
        assert origin == "1"
        saved.add(name)
        assert "Traceback" not in log
    (stop_checkpoint,) = saved
    assert stop_checkpoint in complete_checkpoints(checkpoints), "the stop step is complete"
    assert_manifest_matches_store(checkpoints.child(stop_checkpoint))
    markers = checkpoints.child(stop_checkpoint).list_files()
    assert {".nodes/node-0.json", ".nodes/node-1.json"} <= set(markers), "both nodes' parts"
    stop_step = int(stop_checkpoint.split("-")[1])
    reached = max(steps_logged(logs[0][1]))
    assert reached == stop_step, "the chief stopped at the step it saved: nothing lost"
    to_complete = completed_at[stop_checkpoint] - signalled_at

    # Vertex AI restarts the job (new machines): it resumes from exactly that step.
    chief_log, _ = finish_all(start_nodes(tmp_path / "restart", *inputs, RUN, **env))
    assert f"resuming from out/{stop_checkpoint}" in chief_log
    assert min(steps_logged(chief_log)) == stop_step + 1
    worst = assert_same_weights(reference, base, tmp_path)
    print(
        f"preemption: SIGTERM to complete {stop_checkpoint} in {to_complete:.1f}s (polled "
        f"every 0.1 s); lost work: {reached - stop_step} steps; max |weight difference| "
        f"{worst:.3g}"
    )


def test_a_stop_whose_upload_cannot_finish_in_time_leaves_the_previous_checkpoint(
    tmp_path, demo_assets, gcs, capsys
):
    """SIGTERM while storage is too slow for the grace period: the process still exits in
    time, its stop checkpoint has no manifest, and the newest complete one stays the
    resume point (found by the same code a restarted job runs, which says in one plain line,
    not a `warning:`, which incomplete ones it passes over and the steps trained again)."""
    proxy = FlakyProxy(gcs, failure_rate=0.0)
    base = f"gs://{BUCKET}/{uuid.uuid4().hex}"
    checkpoints = open_store(f"{base}/checkpoints")
    try:
        run = start_trainer(
            ["--nproc_per_node", "2", *tone_speech(demo_assets),
             "--per_device_train_batch_size", "2", "--max_steps", "200", "--save_steps", "3",
             "--eval_strategy", "no", "--logging_steps", "1", "--stop_grace_seconds", "2",
             "--output_dir", "out"],  # stopped long before step 200
            cwd=tmp_path,
            env=trainer_env(tmp_path / "cache", STORAGE_EMULATOR_HOST=proxy.url,
                            **vertex_outputs(base)),
        )  # fmt: skip
        wait_while_running([run], lambda: complete_checkpoints(checkpoints), 400,
                           "a complete checkpoint")  # fmt: skip
        proxy.delay_seconds = 5.0  # every request now outlasts the 2 s grace
        run.terminate()
        code, output = run.finish(timeout=STOP_EXIT_BOUND)
    finally:
        proxy.close()
    # what the stopped run sent, held 5 s each, lands now: the store is then as a restart finds it
    proxy.wait_idle(60)

    assert code == PREEMPTED_EXIT_CODE, output[-3000:]
    (line,) = [line for line in output.splitlines() if line.startswith("preempted:")]
    stopped = re.search(r"(checkpoint-\d+) was not uploaded to .* within [\d.]+ s "
                        r"\(--stop_grace_seconds 2\)", line)  # fmt: skip
    assert stopped, line
    name = stopped.group(1)
    complete = complete_checkpoints(checkpoints)
    assert name not in complete, "no manifest without every file"
    assert complete and checkpoint_step(complete[-1]) < checkpoint_step(name)
    assert line.endswith(f"the newest complete checkpoint is {checkpoints.uri}/{complete[-1]}, "
                         "where a restart resumes"), "the line names the resume point"  # fmt: skip
    capsys.readouterr()
    resumable = newest_readable_checkpoint(checkpoints.uri, tmp_path / "restart", say=True)
    assert resumable is not None and resumable.name == complete[-1]
    said = capsys.readouterr().out
    newer = [n for n in checkpoint_names(checkpoints) if n not in complete
             and checkpoint_step(n) > checkpoint_step(complete[-1])]  # fmt: skip
    if newer:  # the stop's files (some of them) are there, without a manifest
        verb = "is" if len(newer) == 1 else "are"
        assert said.startswith(newer[-1]), said
        assert f" in {checkpoints.uri} {verb} incomplete (" in said, said
        assert "no manifest.json: its upload did not finish" in said, said
        assert said.endswith(
            f") and skipped: resuming from {complete[-1]}, so steps "
            f"{checkpoint_step(complete[-1]) + 1}-{checkpoint_step(newer[-1])} are trained "
            "again\n"
        ), said
    else:
        assert said == "", "nothing of the stop's checkpoint reached the store"
    print(f"stop without time to upload: {name} left incomplete, resume point {complete[-1]}; "
          f"the restart said: {said.strip() or '(nothing)'}")  # fmt: skip


def test_training_completes_while_storage_fails_requests(tmp_path, demo_assets, gcs):
    proxy = FlakyProxy(gcs, failure_rate=0.15, seed=3)
    base = f"gs://{BUCKET}/{uuid.uuid4().hex}"
    try:
        code, output = run_trainer(
            ["--nproc_per_node", "2", *tone_speech(demo_assets),
             "--per_device_train_batch_size", "2", "--max_steps", "6", "--save_steps", "2",
             "--save_total_limit", "2", "--eval_strategy", "no", "--logging_steps", "2",
             "--output_dir", "out"],
            cwd=tmp_path,
            env=trainer_env(tmp_path / "cache", STORAGE_EMULATOR_HOST=proxy.url,
                            **vertex_outputs(base)),
        )  # fmt: skip
    finally:
        proxy.close()
    assert code == 0, output[-3000:]
    assert proxy.failures > 0, "no fault was injected: the test proved nothing"
    checkpoints = open_store(f"{base}/checkpoints")
    # --save_total_limit 2 applies in GCS too, to the checkpoints that were uploaded: on a
    # busy machine uploads fall behind the saves and checkpoint-4 is skipped as obsolete
    uploaded = re.findall(r"node 0 uploaded (checkpoint-\d+)", output)
    assert uploaded[-1] == "checkpoint-6", output[-3000:]
    assert complete_checkpoints(checkpoints) == uploaded[-2:]
    assert not set(uploaded[:-2]) & set(checkpoints.list_dirs()), "retention deleted them"
    for name in complete_checkpoints(checkpoints):
        assert_manifest_matches_store(checkpoints.child(name))
        assert any(p.endswith("optim_states.pt") for p in checkpoints.child(name).list_files())
    assert "model.safetensors" in open_store(f"{base}/model").list_files()
    print(f"storage proxy failed {proxy.failures} of {proxy.requests} requests")


def test_a_failing_final_evaluation_keeps_the_trained_model(tmp_path, demo_assets, gcs):
    """Training ends, then the final evaluation fails: the model is already in the bucket,
    the run exits non-zero, and one error line says what failed and where the model is."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    base = f"gs://{BUCKET}/{uuid.uuid4().hex}"
    env = trainer_env(tmp_path / "cache", STORAGE_EMULATOR_HOST=gcs, **vertex_outputs(base))
    env = with_start_hook(env, tmp_path / "hooks", FAILING_METRICS)
    code, output = run_trainer(
        ["--nproc_per_node", "2", *tone_speech(demo_assets), "--max_steps", "2",
         "--per_device_train_batch_size", "2", "--eval_strategy", "no",
         "--do_eval", "true", "--save_strategy", "no", "--max_eval_samples", "2",
         "--generation_max_length", "4",
         "--output_dir", "out"],
        cwd=run_dir,
        env=env,
    )  # fmt: skip

    assert code == 1, output[-3000:]
    assert "training done in" in output, output[-5000:]
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: the final evaluation failed (ValueError: metric backend exploded); there is "
        f"no complete checkpoint in {base}/checkpoints/ (no checkpoint was saved before "
        f"this); the trained model is saved at {base}/model/ (load it with from_pretrained)"
    ], output[-3000:]
    kept = f"{base}/checkpoints/debug/traceback-rank0.txt"
    assert f"the traceback of the error below is in {kept}" in output, output[-3000:]
    traceback = open_store(kept.rsplit("/", 1)[0]).read_text("traceback-rank0.txt")
    assert "Traceback" not in output and "metric backend exploded" in traceback

    local = tmp_path / "model-from-gcs"
    open_store(f"{base}/model").download(local)
    model = WhisperForConditionalGeneration.from_pretrained(local)
    WhisperProcessor.from_pretrained(local)
    initial = WhisperForConditionalGeneration.from_pretrained(demo_assets.model_dir).state_dict()
    trained = model.state_dict()
    changed = [name for name in initial if not torch.equal(initial[name], trained[name])]
    assert len(changed) > len(initial) // 2, "the delivered weights are not the trained ones"


def test_a_restart_after_the_last_step_was_checkpointed_delivers_it_and_trains_no_further(
    tmp_path, text_assets
):
    """A run whose last step (--max_steps 3, not a whole number of epochs) is checkpointed
    but whose model is not delivered (a stop at the last step; here the model is removed):
    the restart resumes from checkpoint-3, trains nothing (the Trainer alone would train a
    step 4 of 3) and delivers the checkpoint's weights."""
    model_dir, dataset_dir = text_assets
    args = ["--task", "text-classification", "--deepspeed", "none", "--nproc_per_node", "1",
            "--model_name_or_path", str(model_dir), "--dataset_name", str(dataset_dir),
            *TEXT_COLUMNS, "--max_seq_length", "16", "--per_device_train_batch_size", "4",
            "--max_steps", "3", "--save_steps", "3", "--eval_strategy", "no",
            "--output_dir", "out"]  # fmt: skip
    env = trainer_env(tmp_path / "cache")
    code, output = run_trainer(args, cwd=tmp_path, env=env)
    assert code == 0, output[-3000:]
    delivered = tmp_path / "out" / "model"
    trained = load_file(delivered / "model.safetensors")
    shutil.rmtree(delivered)

    code, output = run_trainer(args, cwd=tmp_path, env=env)
    assert code == 0, output[-3000:]
    assert "resuming from out/checkpoint-3" in output, output[-3000:]
    assert not re.findall(r"^step \d+/3", output, re.MULTILINE), "trained past --max_steps"
    assert "checkpoint-3 holds the last step (--max_steps 3): nothing left to train" in output
    again = load_file(delivered / "model.safetensors")
    assert again.keys() == trained.keys()
    assert all(torch.equal(again[name], trained[name]) for name in trained)


ACCUMULATING = ["--deepspeed", "zero2", "--nproc_per_node", "2",
                "--per_device_train_batch_size", "1", "--gradient_accumulation_steps", "16",
                "--max_steps", "3", "--save_steps", "1000", "--eval_strategy", "no",
                "--logging_steps", "1", "--learning_rate", "1e-3", "--seed", "7",
                "--output_dir", "out"]  # fmt: skip
"""Steps of 16 micro-batches: slowed to 1 s each (the test's start hook), a step takes 16 s or
more, longer than the stop grace of the test (3 s) and torchrun's shutdown timeout (3 + 5 s)."""


def test_a_stop_during_a_step_longer_than_the_grace_keeps_the_last_completed_step(
    tmp_path, demo_assets
):
    """SIGTERM during step 2 of 3, whose 16 micro-batches cannot finish within the grace: the
    ranks agree on the stop after the micro-batch in flight, abandon the step and save
    step 1 (torchrun would otherwise kill them before anything is saved); the restart
    resumes there and ends with the weights of a run never stopped."""
    env = trainer_env(tmp_path / "cache")
    args = [*tone_speech(demo_assets), *ACCUMULATING]
    reference = tmp_path / "reference"
    reference.mkdir()
    code, output = run_trainer(args, cwd=reference, env=env)
    assert code == 0, output[-3000:]

    stopped = tmp_path / "stopped"
    stopped.mkdir()
    # micro-batches of 1 s or more: step 2 outlasts torchrun's wait (the grace + 5 s) by far,
    # and the grace leaves a loaded machine time to save step 1 after the micro-batch in flight
    hook = SLOW_STEPS.replace("time.sleep(0.5)", "time.sleep(1.0)")
    assert hook != SLOW_STEPS
    slow = with_start_hook(env, tmp_path / "hooks", hook)
    run = start_trainer([*args, "--stop_grace_seconds", "3"], cwd=stopped, env=slow)
    wait_while_running([run], lambda: "step 1/3" in run.log.read_text(), 300, "step 1")
    time.sleep(1)  # into step 2
    run.terminate()
    code, output = run.finish(120)
    assert code == PREEMPTED_EXIT_CODE, output[-3000:]
    lines = [line for line in output.splitlines() if line.startswith("preempted:")]
    assert len(lines) == 1 and re.fullmatch(
        r"preempted: SIGTERM on node 0 \(Spot preemption or a stopped job\): checkpoint-1 is "
        r"complete in out, [\d.]+ s after the stop", lines[0]), output[-3000:]  # fmt: skip
    assert sorted(p.name for p in (stopped / "out").glob("checkpoint-*")) == ["checkpoint-1"]

    code, output = run_trainer(args, cwd=stopped, env=env)
    assert code == 0, output[-3000:]
    assert "resuming from out/checkpoint-1" in output, output[-3000:]
    assert re.findall(r"^step (\d+)/3", output, re.MULTILINE) == ["2", "3"]
    expected = load_file(reference / "out" / "model" / "model.safetensors")
    resumed = load_file(stopped / "out" / "model" / "model.safetensors")
    worst = max((expected[name] - resumed[name]).abs().max().item() for name in expected)
    assert worst < 1e-5, f"the resumed run's weights differ from the reference by {worst}"
