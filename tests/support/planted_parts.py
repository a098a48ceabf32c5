"""Parts planted in bench/gpu_check.py's runner by tests/processes/test_gpu_check_runs.py: one
that measures, one that fails, one that skips, one that sleeps past its limit."""

from __future__ import annotations

import subprocess
import time

from gpu_check import Context, Skip  # the runner's own module, as its child loaded it


def measures(context: Context) -> dict:
    return {"measured": f"42 widgets/s on {context.device}"}


def breaks(context: Context) -> dict:
    raise RuntimeError("a planted failure")


def skips(context: Context) -> dict:
    raise Skip("a planted library is not installed")


def sleeps_past_its_limit(context: Context) -> dict:
    """It notes a figure, starts a process in a session of its own (as ninja starts a
    compile's jobs in process groups of their own), and sleeps."""
    context.note("3 widgets/s so far")
    grandchild = subprocess.Popen(["sleep", "600"], start_new_session=True)
    (context.scratch / "grandchild.pid").write_text(str(grandchild.pid))
    time.sleep(600)
    return {"measured": "never"}
