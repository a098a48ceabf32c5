"""SIGTERM outside training, in a fresh Python process: the default comes back (saving by
time and on SIGTERM in a real Trainer: tests/unit/test_preemption.py)."""

from __future__ import annotations

import signal
import subprocess
import sys

from tests.support.helpers import REPO_ROOT


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
