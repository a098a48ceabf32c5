"""The index of a shard set (`index.json`): each split's shards, with each shard's example count,
size and CRC32C, the features and the label values; written last by `python -m trainer.shards`
(trainer/shards.py), read at launch and by the streams (trainer/data/streams.py).

A shard's entry is checked twice: at launch against a listing (`check_listing`: sizes, and the
CRC32C Cloud Storage reports with each object), and while the shard is read
(trainer/data/shard_verify.py: CRC32C over the bytes as they stream by, the example count at
its end). Indexes from before sizes and checksums were recorded (no `crc32c`) are still read,
their shards checked by size and count only."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from trainer.common.errors import UserError
from trainer.storage.store import LocalStore

if TYPE_CHECKING:
    from datasets import Features

    from trainer.storage.store import Store

INDEX = "index.json"
KEY_COLUMN = "__key__"
"""A stable id per example (`SPLIT/ROW`), as WebDataset names its samples: what a stream
consumed can be named and checked (`--stream_audit_dir`)."""


@dataclass(frozen=True)
class Shard:
    file: str
    rows: int
    bytes: int
    crc32c: str | None = None
    """Base64 of the big-endian CRC32C, as Cloud Storage reports it; None in old indexes."""


@dataclass(frozen=True)
class ShardIndex:
    """What `index.json` says about a shard set."""

    task: str
    features: dict
    """`datasets.Features.to_dict()` of every shard."""
    splits: dict[str, list[Shard]]
    labels: dict[str, list] | None = None
    """Classification: label column -> its distinct values (when they are not a ClassLabel)."""

    @property
    def columns(self) -> list[str]:
        return list(self.features)

    def rows(self, split: str) -> int:
        return sum(shard.rows for shard in self.splits[split])

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> ShardIndex:
        data = json.loads(text)
        splits = {name: [Shard(**s) for s in shards] for name, shards in data["splits"].items()}
        return cls(data["task"], data["features"], splits, data.get("labels"))

    def datasets_features(self) -> Features:
        from datasets import Features

        return Features.from_dict(self.features)


def read_index(store: Store) -> ShardIndex | None:
    """The shard set's index, or None if `store` holds none."""
    text = store.read_text(INDEX)
    return None if text is None else ShardIndex.from_json(text)


def stored_shards(store: Store, shards: list) -> tuple[dict[str, int], dict[str, str | None]]:
    """(file -> size, file -> CRC32C where the store reports it) of the shards stored."""
    if not isinstance(store, LocalStore):
        listing = store.list_files()
        return ({name: entry.size for name, entry in listing.items()},
                {name: entry.crc32c for name, entry in listing.items()})  # fmt: skip
    paths = {shard.file: store.root / shard.file for shard in shards}
    return {file: path.stat().st_size for file, path in paths.items() if path.is_file()}, {}


def check_listing(index: ShardIndex, store: Store, splits: list[str]) -> None:
    """The shards of `splits` are where the index says, with its sizes (and CRC32C, where the
    store reports it without reading: Cloud Storage): one listing or stat per shard at launch,
    so a truncated, replaced or missing shard stops the job, not silently shortens an epoch."""
    shards = [shard for split in splits for shard in index.splits[split]]
    stored, checksums = stored_shards(store, shards)
    for shard in shards:
        where = f"{store.uri}/{shard.file}"
        if shard.file not in stored:
            raise UserError(f"Shard {where} is listed in {INDEX} but missing.")
        if stored[shard.file] != shard.bytes:
            raise UserError(
                f"Shard {where} holds {stored[shard.file]} bytes but {INDEX} says "
                f"{shard.bytes}: it was truncated or replaced after indexing; write or index "
                "the shard set again (python -m trainer.shards)."
            )
        found = checksums.get(shard.file)
        if shard.crc32c and found and found != shard.crc32c:
            raise UserError(
                f"Shard {where} has CRC32C {found} but {INDEX} says {shard.crc32c}: its "
                "bytes changed after indexing; write or index the shard set again "
                "(python -m trainer.shards)."
            )
