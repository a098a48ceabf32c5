"""Each test example's id, for the lines of predictions.jsonl (`--do_predict`): the split's own
id column if it has one, else the base name of its audio or image file, else its position in
the split. Taken from the source before any example is dropped (an undecodable clip, say), so
that an id always names the same example of the dataset, as `python -m trainer.predict`'s
ids name its input's files and lines."""

from __future__ import annotations

from pathlib import PurePath
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from datasets import Dataset

EXAMPLE_ID = "example_id"
"""The column the ids travel in beside the task's own (collators read only their columns)."""
ID_COLUMNS = ("id", "idx")
"""Columns that hold a dataset's own example ids (GLUE's: idx), the first found used."""


def with_example_ids(selected: Dataset, source: Dataset, media: str | None = None) -> Dataset:
    """`selected` (the task's columns of `source`, row for row) with each row's id added."""
    return selected.add_column(EXAMPLE_ID, example_ids(source, media))


def example_ids(source: Dataset, media: str | None) -> list:
    """The ids of `source`'s rows; `media` names its audio or image column, if any."""
    named = next((column for column in ID_COLUMNS if column in source.column_names), None)
    if named is not None:
        return list(source[named])
    names = file_names(source, media) if media in source.column_names else None
    return names if names is not None else list(range(len(source)))


def file_names(source: Dataset, media: str) -> list[str] | None:
    """The base names of the files in `source`'s `media` column, read without decoding one;
    None when a row has no path (media stored as bytes) or the column holds no media."""
    from datasets import Audio, Image

    feature = source.features[media]
    if not isinstance(feature, Audio | Image):
        return None
    undecoded = source.select_columns([media]).cast_column(media, type(feature)(decode=False))
    paths = [(value or {}).get("path") for value in undecoded[media]]
    if not all(paths):
        return None
    return [PurePath(path).name for path in paths]
