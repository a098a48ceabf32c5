"""The start deadline's test of a start: only a child process running the training
program counts (the deadline itself on a fake clock: tests/unit/test_start_deadline.py)."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from trainer.launcher.start_deadline import training_process_started


def test_only_a_child_running_the_training_program_counts():
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    assert not training_process_started()
    other = subprocess.Popen([*sleeper, "ninja"])
    try:
        assert not training_process_started()
        training = subprocess.Popen([*sleeper, "-m", "trainer.training.rank"])
        try:
            assert training_process_started()
        finally:
            training.kill()
            training.wait()
    finally:
        other.kill()
        other.wait()


def test_a_grandchild_named_as_the_training_program_counts():
    """A training process forked from the zygote is the zygote's child, and names itself
    (setproctitle: one string in place of the command line)."""
    title = "python -m trainer.training.rank"
    forked = f"import setproctitle, time; setproctitle.setproctitle({title!r}); time.sleep(60)"
    zygote = subprocess.Popen(
        [sys.executable, "-c",
         f"import subprocess, sys; subprocess.run([sys.executable, '-c', {forked!r}])"]
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not training_process_started():
            assert time.monotonic() < deadline, "the named grandchild was not found"
            time.sleep(0.1)
    finally:
        for process in psutil.Process(zygote.pid).children(recursive=True):
            process.kill()
        zygote.kill()
        zygote.wait()
