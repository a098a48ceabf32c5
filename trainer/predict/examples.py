"""Where offline predictions read their examples: a folder of media files, a `.jsonl` file of
serving instances, or a dataset saved with `datasets`' `save_to_disk`. Each example becomes
the serving instance the server would get for it (a file as `{"b64": ...}`, as Vertex AI's
batch prediction sends each file of a `file-list`), so the server's own `prepare` decodes and
checks it; its id names it in predictions.jsonl, and its reference, where the input has one,
is what the prediction is scored against.

Folders follow `datasets`' audiofolder and imagefolder: the media files are those with the
task's extensions (the builders'; `.txt` for a text model), references come from a
`metadata.csv` or `metadata.jsonl` beside them (a `file_name` column, the reference in the
first of the task's reference columns it has: the transcript in `text`, `sentence` or
`transcription`, the class in `label`), and for a task that says so (images) media in one
folder per class (`DIR/CLASS/x.png`) are labelled by their folder, as imagefolder labels them.
What a task's test set looks like is its predictor's to say (trainer/tasks/predictor.py).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.common.errors import UserError
from trainer.data.sources import FOLDER_METADATA
from trainer.tasks.instance_media import failing_instance, file_instance
from trainer.tasks.task_spec import TaskSpec

DATASET_FILES = ("dataset_dict.json", "state.json")
"""What `save_to_disk` writes at the top of a DatasetDict's or a Dataset's folder."""
JSONL_REFERENCE_FIELDS = ("reference", "label")
"""A .jsonl line's fields that hold its reference, removed before it is predicted."""


@dataclass(frozen=True)
class Example:
    id: str | int
    reference: Any
    """None where the input holds none."""
    instance: Callable[[], object]
    """The serving instance, read when it is prepared (on the pre-processing threads);
    InstanceError when it cannot be read."""


@dataclass(frozen=True)
class Examples:
    total: int
    examples: Iterator[Example]


def input_kind(path: Path) -> str:
    """`dataset`, `folder` or `jsonl`; ValueError for anything else."""
    if path.is_dir():
        return "dataset" if any((path / name).is_file() for name in DATASET_FILES) else "folder"
    if not path.exists():
        raise ValueError(f"{path} does not exist")
    if path.suffix == ".jsonl":
        return "jsonl"
    raise ValueError(f"{path} is neither a folder of media files, a .jsonl file of instances "
                     "nor a dataset saved with save_to_disk")  # fmt: skip


def read_examples(path: Path, kind: str, task: TaskSpec, split: str) -> Examples:
    """The examples of the input, for a model of `task`; UserError when it holds none."""
    if kind == "jsonl":
        found = Examples(_count_lines(path), _jsonl_examples(path))
    elif kind == "dataset":
        found = _dataset_examples(path, task, split)
    else:
        found = _folder_examples(path, task)
    if found.total == 0:
        raise UserError(f"{path} holds no examples for a {task.name} model")
    return found


def _folder_examples(folder: Path, task: TaskSpec) -> Examples:
    extensions = task.predictor.media_extensions()
    files = sorted(
        path.relative_to(folder).as_posix()
        for path in folder.rglob("*")
        if path.is_file() and path.suffix.lower() in extensions and not path.name.startswith(".")
    )
    references = _metadata_references(folder, task) or _class_folders(files, task)
    examples = (Example(name, references.get(name), file_instance(folder / name)) for name in files)
    return Examples(len(files), examples)


def _metadata_references(folder: Path, task: TaskSpec) -> dict[str, Any]:
    """file_name -> reference, from the folder's metadata.csv or metadata.jsonl (if any)."""
    for name in FOLDER_METADATA:
        path = folder / name
        if path.is_file():
            rows = _table_rows(path)
            column = _reference_column(rows[0] if rows else {}, task)
            if column is None:
                return {}
            return {row["file_name"]: row[column] for row in rows if "file_name" in row}
    return {}


def _table_rows(path: Path) -> list[dict]:
    with path.open(encoding="utf-8", newline="") as handle:
        if path.suffix == ".csv":
            return list(csv.DictReader(handle))
        return [json.loads(line) for line in handle if line.strip()]


def _reference_column(columns, task: TaskSpec) -> str | None:
    return next((name for name in task.predictor.reference_columns if name in columns), None)


def _class_folders(files: list[str], task: TaskSpec) -> dict[str, str]:
    """Media in one folder per class (every file one folder deep) are labelled by it, for a
    task whose predictor says so (images)."""
    parts = [name.split("/") for name in files]
    if not task.predictor.labelled_by_folder or not parts or any(len(p) != 2 for p in parts):
        return {}
    return {name: part[0] for name, part in zip(files, parts, strict=True)}


def _count_lines(path: Path) -> int:
    with path.open("rb") as handle:
        return sum(1 for line in handle if line.strip())


def _jsonl_examples(path: Path) -> Iterator[Example]:
    with path.open(encoding="utf-8", errors="replace") as lines:
        for number, line in enumerate(lines, 1):
            if line.strip():
                yield _line_example(number, line)


def _line_example(number: int, line: str) -> Example:
    """A line's instance, its `id` (else its line number) and its `reference` or `label`."""
    try:
        instance = json.loads(line)
    except ValueError:
        return Example(number, None, failing_instance("the line is not JSON"))
    if not isinstance(instance, dict):
        return Example(number, None, lambda: instance)
    instance = dict(instance)
    example_id = instance.pop("id", number)
    found = [instance.pop(name) for name in JSONL_REFERENCE_FIELDS if name in instance]
    return Example(example_id, found[0] if found else None, lambda: instance)


def _dataset_examples(path: Path, task: TaskSpec, split: str) -> Examples:
    from datasets import DatasetDict, load_from_disk

    dataset = load_from_disk(str(path))
    if isinstance(dataset, DatasetDict):
        if split not in dataset:
            raise UserError(f"{path} has no split {split} (it has {', '.join(dataset)}): "
                            "name one with --split")  # fmt: skip
        dataset = dataset[split]
    media = task.predictor.media_key
    if media not in dataset.column_names:
        raise UserError(f"{path} has no {media} column for a {task.name} model (its columns: "
                        f"{', '.join(dataset.column_names)})")  # fmt: skip
    feature = dataset.features[media]
    if hasattr(feature, "decode"):  # audio and images: their bytes, as a request sends them
        dataset = dataset.cast_column(media, type(feature)(decode=False))
    reference = _reference_column(dataset.column_names, task)
    names = getattr(dataset.features.get(reference), "int2str", None)
    rows = (
        Example(
            row.get("id", index),
            _row_reference(row, reference, names),
            task.predictor.row_instance(row),
        )
        for index, row in enumerate(dataset)
    )
    return Examples(len(dataset), rows)


def _row_reference(row: dict, column: str | None, names: Callable | None) -> Any:
    if column is None:
        return None
    return names(row[column]) if names is not None else row[column]
