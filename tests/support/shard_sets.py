"""Shard sets of the tiny sentiment set, written with `python -m trainer.shards` in this
process: what the streaming, data-fault and image tests read."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from tests.support.helpers import make_shards_in_process
from tests.support.tiny_assets import write_sentiment_csv
from trainer.data.shard_index import read_index
from trainer.storage.store import open_store

COLUMNS = ["--text_column_name", "sentence", "--label_column_name", "sentiment"]
TRAIN_ROWS = 60
"""tiny_assets' sentiment set: 60 training sentences."""


FORMATS = ["parquet", "webdataset"]
"""`trainer.shards --format` values: a test parametrized over them reads both kinds of shards."""


def make_shards(*args) -> None:
    """`python -m trainer.shards ARGS`, in this process (the shards tests run the real
    command line too); it must succeed."""
    errors = io.StringIO()
    with contextlib.redirect_stderr(errors):
        code = make_shards_in_process(*args)
    assert code == 0, errors.getvalue()[-3000:]


def make_sentiment_shards(
    root: Path,
    destination: str,
    shard_size_mb: float,
    source: Path | None = None,
    shard_format: str = "parquet",
):
    if source is None:
        source = root / "sentiment"
        if not source.exists():
            write_sentiment_csv(source)
    make_shards(source, destination, "--task", "text-classification", *COLUMNS,
                "--shard_size_mb", shard_size_mb, "--format", shard_format)  # fmt: skip
    return read_index(open_store(destination))
