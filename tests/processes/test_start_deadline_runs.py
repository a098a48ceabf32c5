"""The start deadline's test of a start: only a child process running the training
program counts (the deadline itself on a fake clock: tests/unit/test_start_deadline.py)."""

from __future__ import annotations

import subprocess
import sys

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
