"""WebDataset tar shards: written by `python -m trainer.shards --format webdataset`, read by
`--streaming` (trainer/data/streams.py), and indexed where they lie when another tool made them
(`python -m trainer.shards LOCATION --index_only`).

A tar is read front to back as it arrives (`tarfile` stream mode on the store's reader): no
seeking, no local copy, one member in memory at a time, so users' existing WebDataset sets
train without conversion.

Naming is WebDataset's: a sample is a run of consecutive members `KEY.FIELD`, KEY being a
member's path up to the first dot of its file name and FIELD the rest. `trainer.shards` names a
sample by its `__key__` (`SPLIT/ROW`: members `train/17.wav`, `train/17.json`; the "/" is a
folder inside the tar, and the rule gives the key back unchanged), stores the media column as
the source file's bytes under its own extension, and every other column in `KEY.json`. Members
carry a fixed time, owner and mode, so one source always gives the same bytes.

A sample becomes an example thus: its `json` member's fields are columns; any other member
fills the column named by its field (`flac`, `txt`, `cls`: the names and decoding of the
`datasets` webdataset builder), media as `{"bytes", "path"}`; a media file whose field is no
column of the index (`wav`, written for the column `audio`) fills its one Audio or Image
column.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from trainer.common.errors import UserError
from trainer.data.checks import check_columns
from trainer.data.shard_index import INDEX, KEY_COLUMN, Shard, ShardIndex
from trainer.storage.store import TRANSFER_THREADS

if TYPE_CHECKING:
    from datasets import Dataset, Features

    from trainer.storage.store import Store

TAR_SUFFIX = ".tar"
JSON_FIELD = "json"
FIXED_MEMBER = {"mtime": 0, "mode": 0o644, "uid": 0, "gid": 0, "uname": "", "gname": ""}
"""Member attributes that would otherwise record when and by whom a shard was made."""


def write_tar(dataset: Dataset, path: Path) -> None:
    """The rows of `dataset` (its `__key__` column included) as one tar of samples."""
    media = media_columns(dataset.features)
    if len(media) > 1:
        raise UserError(
            f"The data has {len(media)} media columns ({', '.join(media)}); a WebDataset "
            "sample here holds one: use --format parquet."
        )
    for column in media:
        dataset = dataset.cast_column(column, type(dataset.features[column])(decode=False))
    with tarfile.open(path, "w") as tar:
        for row in dataset:
            key = row.pop(KEY_COLUMN)
            for column in media:
                value = row.pop(column)
                if value is not None:
                    data, extension = _media_file(value, key)
                    _add_member(tar, f"{key}{extension}", data)
            _add_member(tar, f"{key}.{JSON_FIELD}", _json_bytes(row, key))


def media_columns(features: Features) -> list[str]:
    from datasets import Audio, Image

    return [name for name, feature in features.items() if isinstance(feature, Audio | Image)]


def _media_file(value: dict, key: str) -> tuple[bytes, str]:
    """A media value's bytes and the extension of the file they came from, which names
    the member (decoders and the `datasets` builder tell formats by it)."""
    extension = Path(value.get("path") or "").suffix.lower()
    if not extension:
        raise UserError(
            f"Example {key}: its media has no file name to take an extension from, which "
            "a WebDataset member needs: use --format parquet."
        )
    data = value.get("bytes")
    return (Path(value["path"]).read_bytes() if data is None else data), extension


def _json_bytes(row: dict, key: str) -> bytes:
    try:
        return json.dumps(row, ensure_ascii=False).encode()
    except TypeError as error:
        raise UserError(
            f"Example {key} has a column JSON cannot hold ({error}): use --format parquet."
        ) from None


def _add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for attribute, value in FIXED_MEMBER.items():
        setattr(info, attribute, value)
    tar.addfile(info, io.BytesIO(data))


def samples(handle: BinaryIO, where: str) -> Iterator[tuple[str, dict[str, tuple[str, bytes]]]]:
    """(key, {field: (member name, bytes)}) for each run of consecutive members sharing a
    key, read in one pass; members WebDataset's rule names no key for are skipped."""
    from datasets.packaged_modules.webdataset.webdataset import base_plus_ext

    key, fields = None, {}
    with tarfile.open(fileobj=handle, mode="r|*") as tar:
        for member in tar:
            member_key, name = base_plus_ext(member.name) if member.isfile() else (None, None)
            if member_key is None:
                continue
            if member_key != key and fields:
                yield key, fields
                fields = {}
            if name in fields:
                raise UserError(f"{where}: sample {member_key} has two {name} members.")
            key = member_key
            fields[name] = (member.name, tar.extractfile(member).read())
    if fields:
        yield key, fields


def media_feature(name: str):
    """Audio() or Image() for a media field (by its last extension, as `datasets` tells
    them), else None."""
    from datasets import Audio, Image
    from datasets.packaged_modules.webdataset.webdataset import AUDIO_EXTENSIONS, IMAGE_EXTENSIONS

    extension = name.rsplit(".", 1)[-1].lower()
    if extension in AUDIO_EXTENSIONS:
        return Audio()
    return Image() if extension in IMAGE_EXTENSIONS else None


def sample_columns(fields: dict[str, tuple[str, bytes]], where: str) -> dict[str, Any]:
    """A sample's members as columns, named by their fields; a `json` member's fields merged in."""
    from datasets.packaged_modules.webdataset.webdataset import DECODERS

    columns = {}
    for name, (member, data) in fields.items():
        if name == JSON_FIELD:
            columns.update(_json_object(data, f"{where}: {member}"))
        elif media_feature(name) is not None:
            columns[name] = {"bytes": data, "path": member}
        else:
            columns[name] = _decoded(DECODERS, name, data, f"{where}: {member}")
    return columns


def _decoded(decoders: dict, name: str, data: bytes, where: str) -> Any:
    """A member's value as the `datasets` builder decodes its extension (`txt` text, `cls`
    an integer, ...); the bytes as they are for an extension it does not know."""
    decode = decoders.get(name.rsplit(".", 1)[-1].lower())
    try:
        return decode(data) if decode else data
    except ValueError as error:
        raise UserError(f"{where} cannot be read as .{name}: {error}") from None


def _json_object(data: bytes, where: str) -> dict:
    try:
        value = json.loads(data)
    except ValueError as error:
        raise UserError(f"{where} is not JSON: {error}") from None
    if not isinstance(value, dict):
        raise UserError(f"{where} holds a JSON {type(value).__name__}, not an object of fields.")
    return value


def read_tar(handle: BinaryIO, features: dict, where: str) -> Iterator[dict]:
    """The examples of one tar shard, with the index's columns (`features`: its dict form);
    a column a sample lacks is None."""
    from datasets import Features

    media = media_columns(Features.from_dict(features))
    fallback = media[0] if len(media) == 1 else None
    for key, fields in samples(handle, where):
        columns = sample_columns(fields, where)
        example = dict.fromkeys(features)
        for name, value in columns.items():
            if name in example:
                example[name] = value
            elif fallback and name in fields and media_feature(name) is not None:
                example[fallback] = value
        example[KEY_COLUMN] = key
        yield example


@dataclass
class TarSummary:
    """What one read pass over a tar tells the index."""

    file: str
    rows: int = 0
    columns: dict[str, Any] = field(default_factory=dict)
    """Every column a sample has -> its first value that is not None (None if none is)."""
    media: dict[str, Any] = field(default_factory=dict)
    """Media column -> its Audio() or Image() (told by the member's extension)."""
    labels: set = field(default_factory=set)


def index_in_place(
    store: Store, task_name: str, label_column: str | None, column_flags: dict[str, str]
) -> ShardIndex:
    """The index of the WebDataset tars under `store`, each read once through the store (several
    at a time, nothing saved to disk), written there last; checked against the task's
    `column_flags`, with `label_column`'s values recorded for classification."""
    stored = store.list_files()
    files = sorted(name for name in stored if name.endswith(TAR_SUFFIX))
    if not files:
        raise UserError(f"No {TAR_SUFFIX} files under {store.uri}.")
    with ThreadPoolExecutor(TRANSFER_THREADS) as pool:
        summaries = list(pool.map(partial(_summarise_tar, store, label_column), files))
    features = _features(summaries)
    check_columns(features, column_flags, store.uri)
    splits: dict[str, list[Shard]] = {}
    for summary in summaries:
        entry = stored[summary.file]
        shard = Shard(summary.file, summary.rows, entry.size, entry.crc32c)
        splits.setdefault(split_of(summary.file), []).append(shard)
    labels = None
    if label_column is not None:
        train = [s.labels for s in summaries if split_of(s.file) == "train"]
        labels = {label_column: sorted(set().union(*train))}
    index = ShardIndex(task_name, features.to_dict(), splits, labels)
    store.write_text(INDEX, index.to_json())
    return index


def _summarise_tar(store: Store, label_column: str | None, file: str) -> TarSummary:
    summary = TarSummary(file)
    where = f"{store.uri}/{file}"
    try:
        with store.open_read(file) as handle:
            for _, fields in samples(handle, where):
                summary.rows += 1
                columns = sample_columns(fields, where)
                for name, value in columns.items():
                    if summary.columns.get(name) is None:
                        summary.columns[name] = value
                summary.media.update(
                    (name, media_feature(name)) for name in fields if media_feature(name)
                )
                if columns.get(label_column) is not None:
                    summary.labels.add(columns[label_column])
    except tarfile.TarError as error:
        raise UserError(f"{where} is not a readable tar: {error}") from None
    if summary.rows == 0:
        raise UserError(f"{where} holds no WebDataset samples (KEY.EXT members).")
    return summary


def _features(summaries: list[TarSummary]) -> Features:
    """The columns every tar holds, typed by their first values that are not None (tars in
    path order; media by extension); tars that disagree on columns are refused (a stream
    needs one schema)."""
    import pyarrow as pa
    from datasets import Features, Value
    from datasets.features.features import cast_to_python_objects

    first = summaries[0]
    for other in summaries[1:]:
        if set(other.columns) != set(first.columns):
            raise UserError(
                f"{other.file} has columns {', '.join(sorted(other.columns))} but "
                f"{first.file} has {', '.join(sorted(first.columns))}: every tar of a set "
                "must hold the same fields."
            )
    media = first.media
    values = {
        name: next((s.columns[name] for s in summaries if s.columns[name] is not None), None)
        for name in first.columns
        if name not in media
    }
    table = pa.Table.from_pylist(cast_to_python_objects([values], only_1d_for_numpy=True))
    inferred = Features.from_arrow_schema(table.schema)
    features = Features({name: media.get(name) or inferred[name] for name in first.columns})
    features[KEY_COLUMN] = Value("string")
    return features


SPLIT_WORD = re.compile(r"[^-._ 0-9/]+")


def split_of(path: str) -> str:
    """The split of a tar: named by the first word of its path (folders, then file name)
    that `datasets` takes for a split (`train/0.tar`, `wds-valid-003.tar`, `dev_1.tar`,
    `test-000.tar`), as it splits data files; `train` when no word is one."""
    from datasets.data_files import SPLIT_KEYWORDS

    splits = {word: str(split) for split, words in SPLIT_KEYWORDS.items() for word in words}
    for word in SPLIT_WORD.findall(path.lower()):
        if word in splits:
            return splits[word]
    return "train"
