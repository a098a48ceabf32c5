"""SIGTERM outside training: in a fresh Python process the default comes back; during the
launcher's checks, the agent's start and rendezvous, and the training processes' start-up,
one true line (saving by time and on SIGTERM in a real Trainer: tests/unit/test_preemption.py;
in real runs: tests/processes/test_resume.py)."""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.gcs_emulator import FlakyProxy
from tests.support.helpers import (
    DEMO_SPEECH_FLAGS,
    REPO_ROOT,
    WedgedChief,
    start_node,
    start_trainer,
    trainer_env,
    vertex_outputs,
    wait_until,
    with_start_hook,
    zygotes_of,
)
from trainer.common.exit_codes import PREEMPTED_EXIT_CODE
from trainer.storage.checkpoints import write_manifest
from trainer.storage.store import open_store


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


ZYGOTE_IMPORTS_SLOWLY = """
# sitecustomize: the zygote (the process the training processes are forked from) takes two
# minutes to start, so a test can stop the node while its agent waits for it.
import time
from pathlib import Path

if "multiprocessing.forkserver" in Path("/proc/self/cmdline").read_text():
    time.sleep(120)
"""


@pytest.mark.slow
def test_sigterm_while_the_agent_waits_for_the_zygote_is_the_nodes_one_line(
    tmp_path, demo_assets, demo_cache
):
    """SIGTERM once the launcher has handed over to `accelerate launch` (in its own process),
    which waits for the zygote to finish its imports before it forks the training processes:
    the agent says that nothing of this attempt was trained, exit 75, and the zygote ends
    with it (it would have imported for seconds more, for nothing)."""
    import psutil

    args = ["--model_name_or_path", str(demo_assets.model_dir),
            "--dataset_name", str(demo_assets.dataset_dir), *DEMO_SPEECH_FLAGS,
            "--nproc_per_node", "2", "--deepspeed", "zero2", "--output_dir", "out"]  # fmt: skip
    env = with_start_hook(trainer_env(demo_cache), tmp_path / "hooks", ZYGOTE_IMPORTS_SLOWLY)
    run = start_trainer(args, tmp_path, env)
    launcher = psutil.Process(run.process.pid)
    zygote = None

    def handed_over() -> bool:
        nonlocal zygote
        zygote = next(iter(zygotes_of(launcher)), None)
        return zygote is not None and "launcher checks took" in run.log.read_text()

    wait_until(handed_over, 120, "the launcher's hand-over to the agent")
    run.terminate()
    code, output = run.finish(120)
    assert code == PREEMPTED_EXIT_CODE, output[-3000:]
    assert output.splitlines()[-1] == (
        "preempted: SIGTERM on node 0 before its training processes began training: nothing "
        "new was trained; there is no complete checkpoint in out"
    ), output[-3000:]
    wait_until(lambda: not zygote.is_running() or zygote.status() == psutil.STATUS_ZOMBIE, 10,
               "the zygote's end")  # fmt: skip


@pytest.mark.slow
def test_sigterm_during_the_rendezvous_is_the_nodes_one_line_with_what_is_kept(
    tmp_path, demo_assets, gcs
):
    """SIGTERM to a worker waiting at the rendezvous (its chief's address accepts and never
    answers): the agent's main thread is inside torch's store client, which retried through
    the signal, and the node went on waiting until its start deadline. Now it ends at once
    with one `preempted:` line naming the complete checkpoint in the store, exit 75."""
    base = f"gs://test-bucket/{tmp_path.name}"
    kept = open_store(f"{base}/checkpoints").child("checkpoint-3")
    kept.write_text("trainer_state.json", "{}")
    write_manifest(kept, {"files": []})
    chief, proxy = WedgedChief(), FlakyProxy(gcs)
    try:
        worker = start_node(tmp_path, 1, 2, chief.port, demo_assets.model_dir,
                            demo_assets.dataset_dir, [*DEMO_SPEECH_FLAGS, "--output_dir", "out"],
                            STORAGE_EMULATOR_HOST=proxy.url, **vertex_outputs(base))  # fmt: skip
        wait_until(lambda: chief.held or worker.process.poll() is not None, 120,
                   "the worker's rendezvous")  # fmt: skip
        worker.terminate()
        code, output = worker.finish(120)
    finally:
        chief.close()
        proxy.close()
    assert code == PREEMPTED_EXIT_CODE, output[-3000:]
    assert output.splitlines()[-1] == (
        "preempted: SIGTERM on node 1 before its training processes began training: nothing "
        f"new was trained; the newest complete checkpoint is {base}/checkpoints/checkpoint-3, "
        "where a restart resumes"
    ), output[-3000:]


@pytest.mark.slow
def test_sigterm_in_the_training_processes_start_up_is_said_by_the_node(
    tmp_path, demo_assets, demo_cache
):
    """SIGTERM while the training processes start (they hold no stop yet, so it ends them at
    once): they print nothing, and the node's agent says that nothing of this attempt was
    trained and where the run stands, exit 75. (It said that torchrun had killed them after
    its wait, 13 s, which it had not, and exited 1.)"""
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
    assert code == PREEMPTED_EXIT_CODE, output[-3000:]
    assert output.splitlines()[-1] == (
        "preempted: SIGTERM on node 0 before its training processes began training: nothing "
        "new was trained; there is no complete checkpoint in out"
    ), output[-3000:]
    assert "error:" not in output


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
    training = [process for process in launcher.children(recursive=True)
                if "trainer.training.rank" in " ".join(process.cmdline())]  # fmt: skip
    assert training, [process.cmdline() for process in launcher.children(recursive=True)]
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
