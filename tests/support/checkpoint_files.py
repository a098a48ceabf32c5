"""What a checkpoint holds, as the process-count tests compare it: every file's SHA-256 (a
checkpoint left unchanged by a conversion that hard-links its files), and the process count
of a stored ZeRO checkpoint read from its optimizer shards' names."""

from __future__ import annotations

import hashlib
from pathlib import Path

from trainer.training.world_size import ZERO_SHARD


def contents(folder: Path) -> dict[str, str]:
    """Every file under `folder`, relative path -> SHA-256."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def saved_world_size_of_store(checkpoint) -> int:
    """The process count of a stored checkpoint, from its optimizer shards' names."""
    return len([path for path in checkpoint.list_files() if ZERO_SHARD.match(path.split("/")[-1])])
