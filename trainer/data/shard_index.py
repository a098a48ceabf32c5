"""The index of a shard set (`index.json`): which shards each split has, their row
counts, the features and the label values, written last by `python -m trainer.shards`
(trainer/shards.py) and read at launch and by the streams (trainer/data/streams.py)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

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
