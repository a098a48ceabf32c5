"""This machine's cache: demo assets, compiled DeepSpeed ops, datasets fetched from GCS.

It survives runs (so DeepSpeed's CPU op is compiled once and a dataset is fetched once per
machine) and is never shared between nodes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def cache_dir(env: Mapping[str, str] = os.environ) -> Path:
    if "TRAINER_CACHE_DIR" in env:
        return Path(env["TRAINER_CACHE_DIR"])
    base = env.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "vertex-trainer"


def torch_extensions_dir(env: Mapping[str, str], cache: Path) -> Path:
    """Where DeepSpeed's compiled CPU op lives: `TORCH_EXTENSIONS_DIR` if set, else `cache`'s
    `torch_extensions`. The launcher, `trainer.build_cpu_ops` and the tests use this one rule,
    so the op compiled at install time is the one the first run finds."""
    return Path(env.get("TORCH_EXTENSIONS_DIR") or cache / "torch_extensions")


STALE_LOCK_SECONDS = 600
"""Compiling DeepSpeed's CPU op takes about a minute; a lock this old has no live owner."""


def clear_stale_build_locks(extensions_dir: Path, now: float) -> list[Path]:
    """Delete torch extension build locks left by killed processes; return what was deleted. torch
    waits forever for a build lock to go, so one left by a run killed while compiling would
    silently stall every later run on this machine."""
    stale = [
        lock
        for lock in extensions_dir.glob("*/lock")
        if now - lock.stat().st_mtime > STALE_LOCK_SECONDS
    ]
    for lock in stale:
        lock.unlink(missing_ok=True)
    return stale
