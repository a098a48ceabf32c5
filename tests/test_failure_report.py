"""A training process fails: one `error:` line naming its rank, node and exception, and
its traceback once; not a traceback per rank plus torchrun's ChildFailedError box."""

from __future__ import annotations

import os
import re

import pytest

from tests.support.helpers import (
    DEMO_SPEECH_FLAGS,
    REPO_ROOT,
    SLOW_STEPS,
    TEXT_COLUMNS,
    complete_from,
    run_trainer,
    start_nodes,
    start_trainer,
    trainer_env,
    wait_while_running,
    with_start_hook,
)
from trainer.common.exit_codes import CONFIG_ERROR_IN_TRAINING_EXIT_CODE
from trainer.common.handoff import RUN_CONFIG_VARIABLE
from trainer.config.resolve import resolve_run
from trainer.launcher import accelerate_launch
from trainer.settings.run_config import Hardware
from trainer.storage.checkpoints import complete_checkpoints, write_manifest
from trainer.storage.store import open_store
from trainer.training.failures import is_peer_failure, report_failure

RANK_ONE_FAILS = """
import os

from trainer.tasks import speech

_collator = speech.SpeechRecognitionTask.data_collator


def _failing_collator(self, processor):
    collate = _collator(self, processor)

    def collate_or_fail(examples):
        if os.environ.get("RANK") == "1":
            raise ValueError("a corrupt clip on rank one")
        return collate(examples)

    return collate_or_fail


speech.SpeechRecognitionTask.data_collator = _failing_collator
"""


@pytest.mark.slow
def test_a_failing_rank_is_reported_once(tmp_path, spoken_assets):
    hooks, run_dir = tmp_path / "hooks", tmp_path / "run"
    hooks.mkdir(), run_dir.mkdir()
    (hooks / "sitecustomize.py").write_text(RANK_ONE_FAILS)
    env = trainer_env(tmp_path / "cache")
    env["PYTHONPATH"] = f"{hooks}{os.pathsep}{env['PYTHONPATH']}"
    code, output = run_trainer(
        ["--nproc_per_node", "2", "--model_name_or_path", str(spoken_assets.model_dir),
         "--dataset_name", str(spoken_assets.dataset_dir), *DEMO_SPEECH_FLAGS,
         "--max_steps", "2", "--per_device_train_batch_size", "2", "--eval_strategy", "no",
         "--save_strategy", "no", "--output_dir", "out"],
        cwd=run_dir,
        env=env,
        timeout=300,
    )  # fmt: skip

    assert code == 1, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: rank 1 of 2 (node 0, local rank 1) failed: ValueError: a corrupt clip on rank "
        "one; there is no complete checkpoint in out"
    ], output[-4000:]
    assert output.count("Traceback (most recent call last)") == 1, output[-4000:]
    assert "ChildFailedError" not in output and "closing signal" not in output, output[-4000:]


class Failure:
    def __init__(self, exitcode: int, local_rank: int = 1) -> None:
        self.exitcode, self.local_rank = exitcode, local_rank

    def signal_name(self) -> str:
        return "SIGKILL"


class ChildFailed:
    def __init__(self, failure: Failure) -> None:
        self.failure = failure

    def get_first_failure(self):
        return 3, self.failure


@pytest.mark.parametrize("exitcode", [1, CONFIG_ERROR_IN_TRAINING_EXIT_CODE])
def test_a_process_that_reported_itself_gets_no_second_line(exitcode, capsys):
    assert accelerate_launch.report(ChildFailed(Failure(exitcode)), node_rank=1) == exitcode
    assert capsys.readouterr().err == ""


def test_a_killed_process_gets_one_line_naming_rank_node_and_signal(capsys):
    assert accelerate_launch.report(ChildFailed(Failure(-9)), node_rank=1) == 1
    assert capsys.readouterr().err == (
        "error: training process rank 3 (node 1, local rank 1) was killed by SIGKILL "
        "(out of memory? the kernel's OOM killer sends SIGKILL)\n"
    )


def test_a_killed_process_s_line_says_where_the_newest_complete_checkpoint_is(
    tmp_path, capsys, monkeypatch
):
    """A process killed by a signal (the OOM killer) cannot say what is kept: its node's
    launcher does, from the configuration handed over to the run and the store itself
    (checkpoint-4 has no manifest: not complete)."""
    checkpoints = open_store(str(tmp_path / "checkpoints"))
    for name in ("checkpoint-2", "checkpoint-4"):
        checkpoints.child(name).write_text("trainer_state.json", "{}")
    write_manifest(checkpoints.child("checkpoint-2"), {"files": []})
    hardware = Hardware(gpu_count=0, gpu_name=None, compute_capability=None, cpu_count=2)
    argv = ["--model_name_or_path", "org/model", "--dataset_name", "org/data",
            "--checkpoint_dir", str(tmp_path / "checkpoints")]  # fmt: skip
    config = resolve_run(argv, {}, hardware)
    monkeypatch.setenv(RUN_CONFIG_VARIABLE, config.to_json())

    assert accelerate_launch.report(ChildFailed(Failure(-9)), node_rank=1) == 1
    assert capsys.readouterr().err == (
        "error: training process rank 3 (node 1, local rank 1) was killed by SIGKILL "
        "(out of memory? the kernel's OOM killer sends SIGKILL); the newest complete "
        f"checkpoint is {tmp_path / 'checkpoints' / 'checkpoint-2'}, where a restart resumes\n"
    )


def test_a_broken_collective_waits_for_torchrun_before_reporting(capsys, monkeypatch):
    """An echo of another process's failure waits (torchrun stops it if the cause was on
    its node), then its node's local rank 0 alone says so, without a traceback; a cause
    reports at once, with its traceback."""
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("GROUP_RANK", "1")
    waits = []
    echo = RuntimeError("[gloo] Connection closed by peer [127.0.0.1]:1234")
    assert is_peer_failure(echo)
    monkeypatch.setenv("LOCAL_RANK", "1")
    report_failure(echo, sleep=waits.append)
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("LOCAL_RANK", "0")
    report_failure(echo, sleep=waits.append)
    assert capsys.readouterr().err.startswith(
        "error: rank 2 of 4 (node 1, local rank 0) stopped: a process on another node failed"
    )
    assert len(waits) == 2

    try:
        raise ValueError("bad\nclip")
    except ValueError as raised:
        cause = raised
    assert not is_peer_failure(cause)
    report_failure(cause, sleep=waits.append)
    assert len(waits) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "Traceback" in err
    assert err.endswith("error: rank 2 of 4 (node 1, local rank 0) failed: ValueError: bad clip\n")


def test_a_failure_in_training_ends_its_line_with_what_is_kept(capsys, monkeypatch):
    """Training notes on the exception where the newest complete checkpoint is (a dead
    node or a crash on one rank, like every other failure, says where a restart resumes);
    the line ends with it, secrets masked."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("HF_TOKEN", "hf_secretvalue123")
    kept = (
        "the newest complete checkpoint is gs://b/checkpoints/checkpoint-8, where a restart resumes"
    )
    echo = RuntimeError("[gloo] Connection closed by peer [127.0.0.1]:1234")
    echo.add_note(kept)
    line = report_failure(echo, sleep=lambda seconds: None)
    assert line.endswith(f"the cause is in that node's log; {kept}"), line
    assert capsys.readouterr().err == f"error: {line}\n"

    crash = ValueError("a NaN on this rank")
    crash.add_note("there is no complete checkpoint in gs://b/hf_secretvalue123/checkpoints")
    line = report_failure(crash)
    assert line == ("rank 0 of 2 (node 0, local rank 0) failed: ValueError: a NaN on this rank; "
                    "there is no complete checkpoint in gs://b/***/checkpoints"), line  # fmt: skip
    assert "hf_secretvalue123" not in capsys.readouterr().err


@pytest.mark.slow
def test_the_other_node_says_where_the_cause_is(tmp_path, spoken_assets):
    """Node 1's process fails; node 0's process only sees its collective break: node 1's
    log has the cause, node 0's one line pointing there, and no traceback."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(RANK_ONE_FAILS)
    nodes = start_nodes(tmp_path / "nodes", spoken_assets.model_dir, spoken_assets.dataset_dir,
                        [*DEMO_SPEECH_FLAGS, "--max_steps", "2", "--eval_strategy", "no",
                         "--save_strategy", "no", "--per_device_train_batch_size", "2",
                         "--output_dir", "out"],
                        PYTHONPATH=f"{hooks}{os.pathsep}{REPO_ROOT}")  # fmt: skip
    (code0, log0), (code1, log1) = (node.finish(timeout=300) for node in nodes)

    assert code1 == 1 and code0 == 1, (log0[-2000:], log1[-2000:])
    errors1 = [line for line in log1.splitlines() if line.startswith("error:")]
    assert errors1 == [
        "error: rank 1 of 2 (node 1, local rank 0) failed: ValueError: a corrupt clip on rank "
        "one; there is no complete checkpoint in out"
    ], log1[-3000:]
    errors0 = [line for line in log0.splitlines() if line.startswith("error:")]
    assert len(errors0) == 1 and errors0[0].startswith(
        "error: rank 0 of 2 (node 0, local rank 0) stopped: a process on another node failed"
    ), log0[-3000:]
    assert errors0[0].endswith("the cause is in that node's log; there is no complete "
                               "checkpoint in out"), errors0  # fmt: skip
    assert "Traceback" not in log0 and "ChildFailedError" not in log0 + log1


@pytest.mark.slow
def test_a_training_process_killed_by_the_oom_killer_leaves_a_line_naming_the_checkpoint(
    tmp_path, text_assets
):
    """SIGKILL to one training process (as the kernel's OOM killer sends it) once a
    checkpoint is complete: the node's one line names the process and the checkpoint a
    restart resumes from."""
    import psutil

    model_dir, dataset_dir = text_assets
    checkpoints = open_store(str(tmp_path / "checkpoints"))
    run = start_trainer(
        ["--task", "text-classification", "--model_name_or_path", str(model_dir),
         "--dataset_name", str(dataset_dir), *TEXT_COLUMNS, "--max_seq_length", "16",
         "--nproc_per_node", "2", "--max_steps", "200", "--save_steps", "2",
         "--eval_strategy", "no", "--output_dir", "out",
         "--checkpoint_dir", str(tmp_path / "checkpoints")],
        cwd=tmp_path,
        env=with_start_hook(trainer_env(tmp_path / "cache"), tmp_path / "hooks", SLOW_STEPS),
    )  # fmt: skip
    wait_while_running([run], lambda: complete_from(checkpoints, 2), 300,
                       "a complete checkpoint")  # fmt: skip
    launcher = psutil.Process(run.process.pid)
    training = [p for p in launcher.children(recursive=True)
                if "trainer.training.rank" in " ".join(p.cmdline())]  # fmt: skip
    assert len(training) == 2, [p.cmdline() for p in launcher.children(recursive=True)]
    training[1].kill()
    code, output = run.finish(timeout=300)

    assert code == 1, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, output[-3000:]
    line = re.fullmatch(
        r"error: training process rank (\d) \(node 0, local rank \d\) was killed by SIGKILL "
        r"\(out of memory\? the kernel's OOM killer sends SIGKILL\); the newest complete "
        rf"checkpoint is {re.escape(str(tmp_path / 'checkpoints'))}/(checkpoint-\d+), where a "
        r"restart resumes",
        errors[0],
    )  # fmt: skip
    assert line, errors[0]
    assert line[2] in complete_checkpoints(checkpoints), "the line names a complete checkpoint"
