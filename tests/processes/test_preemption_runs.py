"""SIGTERM outside training: in a fresh Python process the default comes back; during the
launcher's checks and the training processes' start-up, one true line (saving by time and on
SIGTERM in a real Trainer: tests/unit/test_preemption.py; in real runs:
tests/processes/test_resume.py)."""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.helpers import (
    DEMO_SPEECH_FLAGS,
    REPO_ROOT,
    start_trainer,
    trainer_env,
    wait_until,
)
from trainer.common.exit_codes import PREEMPTED_EXIT_CODE


def test_outside_training_sigterm_ends_the_process_as_before():
    """A failing or finished process gets the default back (torchrun stops the echoes of a
    failure with SIGTERM), and a SIGTERM that came while training ends it then."""
    script = (
        "import os, signal\n"
        "from trainer.training.preemption import StopRequest\n"
        "stop = StopRequest()\n"
        "stop.install()\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "print('noted, still running', flush=True)\n"
        "stop.uninstall()\n"
        "print('not reached', flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert done.stdout == "noted, still running\n"


def catches_sigterm(pid: int) -> bool:
    """Whether process `pid` has a SIGTERM handler installed (its SigCgt mask, /proc)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


def test_sigterm_during_the_launchers_checks_is_one_line_not_a_silent_death(
    tmp_path, demo_assets, demo_cache
):
    """A stopped job's SIGTERM while the launcher checks the run (about 20 s): nothing has
    started, so the launcher says so and exits 75 (it died by the signal, silent, before)."""
    args = ["--model_name_or_path", str(demo_assets.model_dir),
            "--dataset_name", str(demo_assets.dataset_dir), *DEMO_SPEECH_FLAGS,
            "--output_dir", "out"]  # fmt: skip
    run = start_trainer(args, tmp_path, trainer_env(demo_cache))
    wait_until(lambda: catches_sigterm(run.process.pid), 60, "the launcher's SIGTERM handler")
    run.terminate()
    code, output = run.finish(60)
    assert code == PREEMPTED_EXIT_CODE, output
    assert output.splitlines()[-1] == (
        "preempted: SIGTERM during the launcher's checks, before anything was launched: "
        "nothing was trained, nothing is lost"
    ), output
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_sigterm_before_the_training_processes_can_save_is_said_by_the_node(
    tmp_path, demo_assets, demo_cache
):
    """SIGTERM while the training processes start (they hold no stop yet, so it kills them):
    they print nothing, and the node's agent says that nothing new was saved and where the
    run stands, with exit 1, not 75 ("stopped after saving"), as it did before."""
    import psutil

    args = ["--model_name_or_path", str(demo_assets.model_dir),
            "--dataset_name", str(demo_assets.dataset_dir), *DEMO_SPEECH_FLAGS,
            "--nproc_per_node", "2", "--deepspeed", "zero2", "--output_dir", "out"]  # fmt: skip
    run = start_trainer(args, tmp_path, trainer_env(demo_cache))
    agent = psutil.Process(run.process.pid)

    def training_processes_started() -> bool:
        return any("trainer.training.rank" in " ".join(child.cmdline())
                   for child in agent.children(recursive=True))  # fmt: skip

    wait_until(training_processes_started, 120, "the training processes")
    run.terminate()
    code, output = run.finish(120)
    assert code == 1, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: SIGTERM on node 0: the training processes were stopped before they saved "
        "anything new, the step in flight (or their start-up) outlasting what torchrun waits "
        "(13 s: --stop_grace_seconds + 5); there is no complete checkpoint in out"
    ], output[-3000:]
    assert "preempted:" not in output


def test_sigterm_to_a_one_process_run_without_deepspeed_saves_the_step(
    tmp_path, demo_assets, demo_cache
):
    """One process without DeepSpeed (the CPU default) is started by accelerate itself, not
    by torchrun's agent: a SIGTERM to the launcher (what Vertex AI and `docker stop` send)
    killed the launcher alone, and the training process trained on, orphaned, until the
    container took it down unsaved. The launcher now passes the stop on: the step is saved,
    the line says so, exit 75, and no training process is left behind."""
    import psutil

    args = ["--model_name_or_path", str(demo_assets.model_dir),
            "--dataset_name", str(demo_assets.dataset_dir), *DEMO_SPEECH_FLAGS,
            "--deepspeed", "none", "--nproc_per_node", "1", "--max_steps", "300",
            "--logging_steps", "1", "--save_steps", "1000", "--eval_strategy", "no",
            "--output_dir", "out"]  # fmt: skip
    run = start_trainer(args, tmp_path, trainer_env(demo_cache))
    launcher = psutil.Process(run.process.pid)
    wait_until(lambda: "step 2/300" in run.log.read_text(), 240, "the second step")
    training = launcher.children(recursive=True)
    run.terminate()
    code, output = run.finish(120)
    assert code == PREEMPTED_EXIT_CODE, output[-3000:]
    stopped = re.search(r"preempted: SIGTERM on node 0 \(.*\): (checkpoint-(\d+)) is complete "
                        r"in out", output)  # fmt: skip
    assert stopped, output[-3000:]
    assert int(stopped.group(2)) >= 2 and (tmp_path / "out" / stopped.group(1)).is_dir()
    assert not [
        process
        for process in training
        if process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    ], "a process was left behind"
