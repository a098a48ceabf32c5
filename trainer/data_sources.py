"""Where a dataset comes from: the Hugging Face hub, or a local directory in a known layout.

`--dataset_name` names either. A value that looks like a path (absolute, relative with
./ or ../, or an existing directory) is a local dataset and must exist; anything else is
a hub id. Split specs such as `train+validation` work for both, because both end up in
`datasets.load_dataset(..., split=spec)`.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from trainer.errors import UserError


@dataclass(frozen=True)
class LocalLayout:
    """A recognised local dataset directory and how to hand it to `load_dataset`."""

    builder: str
    """The `datasets` builder: "audiofolder", "csv", ..."""
    splits: dict[str, list[Path]]
    """Split name -> files or folders that hold it."""
    columns: frozenset[str]
    """The columns an example will have (read from headers, not from the data)."""
    load_kwargs: dict = field(default_factory=dict)


def looks_like_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~", "gs://")) or Path(name).is_dir()


def local_directory(name: str) -> Path:
    """The dataset directory named by `--dataset_name`, which must exist."""
    if name.startswith("gs://"):
        raise UserError(
            f"{name}: read gs:// datasets through Cloud Storage FUSE on Vertex AI "
            "(/gcs/BUCKET/...); direct gs:// reads are not supported yet."
        )
    path = Path(name).expanduser()
    if not path.is_dir():
        raise UserError(f"Dataset directory {name} not found.")
    return path


def split_names(spec: str) -> list[str]:
    return [part.strip() for part in spec.split("+") if part.strip()]


def check_splits(layout: LocalLayout, spec: str, directory: Path) -> None:
    for name in split_names(spec):
        if name not in layout.splits:
            available = ", ".join(sorted(layout.splits))
            raise UserError(f'Split "{name}" not found in {directory}: it has {available}.')


def check_columns(available: Iterable[str], wanted: dict[str, str], where: str) -> None:
    """`wanted` maps flag name -> column name; each must be among `available`."""
    available = sorted(available)
    for flag, column in wanted.items():
        if column not in available:
            raise UserError(
                f'Column "{column}" (--{flag}) not found in {where}; '
                f"its columns are: {', '.join(available)}."
            )


def table_header(path: Path) -> list[str]:
    """Column names of a CSV, TSV or JSON Lines file, read from its first line only."""
    with path.open(newline="", encoding="utf-8") as handle:
        first_line = handle.readline()
    if path.suffix == ".jsonl":
        return list(json.loads(first_line)) if first_line.strip() else []
    delimiter = "\t" if path.suffix == ".tsv" else ","
    return next(csv.reader([first_line], delimiter=delimiter), [])
