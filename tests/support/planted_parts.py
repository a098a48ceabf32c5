"""Parts planted in bench/gpu_check.py's runner by tests/processes/test_gpu_check_runs.py: one
that measures, one that fails, one that skips, one that sleeps past its limit."""

from __future__ import annotations

import time

from gpu_check import Context, Skip  # the runner's own module, as its child loaded it


def measures(context: Context) -> dict:
    return {"measured": f"42 widgets/s on {context.device}"}


def breaks(context: Context) -> dict:
    raise RuntimeError("a planted failure")


def skips(context: Context) -> dict:
    raise Skip("a planted library is not installed")


def sleeps_past_its_limit(context: Context) -> dict:
    context.note("3 widgets/s so far")
    time.sleep(600)
    return {"measured": "never"}
