"""This machine's cache: demo assets, compiled DeepSpeed ops, datasets fetched from GCS.

It survives runs (so DeepSpeed's CPU op is compiled once and a dataset is fetched once per
machine) and is never shared between nodes.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    if "TRAINER_CACHE_DIR" in os.environ:
        return Path(os.environ["TRAINER_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "vertex-trainer"
