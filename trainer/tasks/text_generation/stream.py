"""Text generation's training split as a stream (`--streaming true`): the rows tokenised as they
are read, by the same `encode_row` and loss mask as a split read whole (training.py),
in `datasets`' batched map over the stream (in the DataLoader's workers).

A stream cannot be counted before training, so what a whole split reports in one line before
training is counted as the stream is read:
- A bad row (no chat, pair or text) leaves the map as an undecodable example, named by its shard
  key where it has one and why it is bad; trainer/data/streams.py drops it and the training
  process counts it under `--max_bad_examples` (`StreamSkips`), as the other tasks count their
  undecodable media in a stream.
- The rows cut to `--max_seq_length`, and those the cut left with nothing to learn (dropped),
  ride along in the batches (`CUTS`) to the training process, which counts them
  (trainer.py): one line when training ends, or, with
  `--refuse_long_examples`, a UserError at the first one.

With `--packing`, each batch of rows (`BATCH_ROWS`, the batch TRL's own packing maps over) is
packed by TRL's best-fit-decreasing packing, as TRL packs a split read whole (`pack_dataset`);
TRL does not prepare the stream again (`ChatTrainer._prepare_dataset`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainer.data.bad_examples import UNDECODABLE
from trainer.data.shard_index import KEY_COLUMN
from trainer.tasks.text_generation.loss_mask import (
    IGNORED,
    BadRow,
    Encoded,
    TemplateNotSplittable,
    encode_row,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from datasets import IterableDataset

CUTS = "chat_cuts"
"""Stream column and batch key: [rows cut to --max_seq_length, rows read, rows the cut left with
nothing to learn], the counts of a map batch on its first example (zeros on the others)."""
BATCH_ROWS = 1000
"""Rows tokenised (and packed) together: `datasets`' default map batch, which TRL packs by."""


def tokenised_stream(stream: IterableDataset, encoder: StreamEncoder) -> IterableDataset:
    """`stream` (rows of one format) as tokenised examples, bad rows marked (see the module)."""
    columns = stream.column_names
    if columns is None:  # a stream whose features are unknown until read
        columns = list(next(iter(stream)).keys())
    return stream.map(encoder, batched=True, batch_size=BATCH_ROWS, remove_columns=columns)


@dataclass
class StreamEncoder:
    """The batched map function of `tokenised_stream` (picklable: the loader's workers run it)."""

    tokenizer: Any
    found: str
    options: Any
    """The task's ChatArguments."""
    marked: str | None
    packing: bool

    def __call__(self, batch: dict[str, list]) -> dict[str, list]:
        rows = [
            dict(zip(batch, values, strict=True)) for values in zip(*batch.values(), strict=True)
        ]
        encoded, bad = self.encoded(rows)
        kept = [row for row in encoded if _learns(row)]
        ids, labels = [row.input_ids for row in kept], [row.labels for row in kept]
        out = self.packed(ids, labels) if self.packing else {"input_ids": ids, "labels": labels}
        # a row cut until nothing was left to learn is dropped, as in a split read whole
        counts = [sum(row.truncated for row in encoded), len(rows) - len(bad),
                  sum(row.truncated for row in encoded if not _learns(row))]  # fmt: skip
        return self.with_counts_and_bad_rows(out, counts, bad)

    def with_counts_and_bad_rows(self, out: dict, counts: list[int], bad: list[str]) -> dict:
        """The batch's counts (cut, good, emptied) on its first example, and an empty example
        per bad row carrying its line, for the training process to count."""
        good = len(out["input_ids"])
        out[CUTS] = [counts] + [[0, 0, 0]] * (good - 1) if good else []
        out[UNDECODABLE] = [None] * good + bad
        for column in ("input_ids", "labels", *(("seq_lengths",) if self.packing else ())):
            out[column] = list(out[column]) + [[] for _ in bad]
        out[CUTS] += [[0, 0, 0] for _ in bad]
        return out

    def encoded(self, rows: list[dict]) -> tuple[list[Encoded], list[str]]:
        """The rows encoded, and a line for each bad one (its key where the stream has one)."""
        encoded, bad = [], []
        for row in rows:
            try:
                encoded.append(
                    encode_row(self.tokenizer, row, self.found, self.options, self.marked)
                )
            except (BadRow, TemplateNotSplittable) as error:
                key = row.get(KEY_COLUMN)
                bad.append(f"{'row ' + str(key) if key is not None else 'a row'} ({error})")
        return encoded, bad

    def packed(self, ids: list[list[int]], labels: list[list[int]]) -> dict[str, list]:
        """TRL's best-fit-decreasing packing of one batch: the function its `pack_dataset`
        maps over each batch of a split read whole (tests/unit/test_chat_stream.py compares
        the two), called on the batch's table here, where a stream is being read."""
        import pyarrow as pa
        from trl.data_utils import _pack_bfd

        if not ids:
            return {"input_ids": [], "labels": [], "seq_lengths": []}
        table = pa.table({"input_ids": ids, "labels": labels})
        return _pack_bfd(table, self.options.max_seq_length, "truncate").to_pydict()


def _learns(row: Encoded) -> bool:
    return any(label != IGNORED for label in row.labels)


@dataclass
class CountedCuts:
    """The collator of a training stream: the task's (TRL's) collator, the examples' `CUTS`
    summed into the batch for the training process (a loader worker is another process)."""

    collate: Callable[[list[dict]], dict]

    def __call__(self, examples: list[dict]) -> dict:
        counts = [example.pop(CUTS) for example in examples if CUTS in example]
        batch = self.collate(examples)
        if counts:
            batch[CUTS] = [sum(column) for column in zip(*counts, strict=True)]
        return batch
