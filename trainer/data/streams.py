"""Training data as a stream: read from shards or the Hub, divided among all processes, shuffled
reproducibly, and resumable at the exact example where a checkpoint was taken.

With `--streaming true` nothing is copied whole to a node. A shard set (made or indexed by
`python -m trainer.shards`) is read through trainer/storage/store.py from a local directory,
gs:// or /gcs/: Parquet shards a row group (a ranged read) at a time, WebDataset tars front to
back (trainer/data/tar_shards.py); a Hub dataset through `load_dataset(..., streaming=True)`.
The pipeline is `datasets`' own: `shuffle(seed, buffer_size)` (shard order and a buffer of
examples, reseeded each epoch with `set_epoch`), then `split_dataset_by_node` with the global
rank and world size (whole shards per process when they divide evenly, else every world-size-th
example); `datasets` divides a process's shards among its DataLoader workers.

Undecodable examples (trainer/data/bad_examples.py): a task marks them as the stream is read,
and `ResumableStream` drops them in the loader worker, carrying their names in the next example
it yields (the last one of its part, for those after it) to the training process, which counts
them (`StreamSkips`).

Resuming: the shuffle is deterministic, so a position is (epoch, examples consumed) per
DataLoader worker of each process. The training loop records the positions of the batches it
trained on (the loader runs ahead), each checkpoint stores them per rank
(`stream-state/rank-R.json`, under its manifest), and a resumed process replays its stream up
to there, reading but not training on what it skips: no example is repeated or lost, even
mid-shard with a full shuffle buffer (which `IterableDataset.state_dict()` does not keep).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from trainer.common.errors import UserError
from trainer.data.bad_examples import UNDECODABLE
from trainer.data.checks import split_names
from trainer.data.damaged_data import DataFault
from trainer.data.shard_index import KEY_COLUMN
from trainer.data.sources import shard_index_of

if TYPE_CHECKING:
    from datasets import Dataset, IterableDataset

POSITION = "stream_position"
"""Batch key of the positions of a batch's examples, removed before the model sees it."""
SKIPPED = "stream_skipped"
"""Example and batch key of the undecodable examples dropped before them (their names),
removed before the model sees it."""
STATE_DIRNAME = "stream-state"


@dataclass
class StreamStart:
    """Where each DataLoader worker of one process resumes its stream."""

    epoch: int = 0
    consumed: dict[int, int] = field(default_factory=dict)
    """Worker id -> examples of `epoch` already trained on."""
    skipped: dict = field(default_factory=dict)
    """The undecodable examples counted so far (`StreamSkips.state()`)."""


class ResumableStream(torch.utils.data.IterableDataset):
    """One process's part of the stream, each example tagged with its position; it adds the epoch
    it resumed in to the Trainer's `set_epoch(n)`, which restarts at 0, so shuffling goes on."""

    def __init__(self, stream: IterableDataset, start: StreamStart | None = None) -> None:
        self.stream = stream
        self.start = start or StreamStart()
        self.epoch = self.start.epoch

    def set_epoch(self, trainer_epoch: int) -> None:
        self.epoch = self.start.epoch + trainer_epoch

    def __iter__(self) -> Iterator[dict]:
        info = torch.utils.data.get_worker_info()
        worker = info.id if info is not None else 0
        self.stream.set_epoch(self.epoch)
        skip = self.start.consumed.get(worker, 0) if self.epoch == self.start.epoch else 0
        examples = islice(iter(self.stream), skip, None)
        held, skipped = None, []  # one example held back: it carries the names after it
        for index, example in enumerate(examples, start=skip):
            name = example.pop(UNDECODABLE, None)
            if name is not None:
                (held[SKIPPED] if held is not None else skipped).append(name)
                continue
            example[POSITION] = (worker, self.epoch, index, example.get(KEY_COLUMN))
            example[SKIPPED], skipped = skipped, []
            if held is not None:
                yield held
            held = example
        if held is not None:
            yield held
        elif skipped:
            raise DataFault(
                f"none of the {len(skipped)} examples loader worker {worker} read from the "
                f"training stream in epoch {self.epoch} decodes (first: {', '.join(skipped[:3])})"
            )


def prepare_stream(
    stream: IterableDataset, seed: int, buffer_size: int, start: StreamStart | None
) -> ResumableStream:
    """This process's shuffled part of the training stream."""
    from datasets.distributed import split_dataset_by_node

    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    shuffled = stream.shuffle(seed=seed, buffer_size=buffer_size)
    mine = split_dataset_by_node(shuffled, rank=rank, world_size=world)
    return ResumableStream(mine, past_finished_epoch(mine, start or StreamStart()))


def past_finished_epoch(stream: IterableDataset, start: StreamStart) -> StreamStart:
    """`start`, or the next epoch's beginning when `start` is the end of its epoch: a checkpoint
    taken right after a process's last batch of an epoch records it all as trained, and resumed
    there its loader would yield nothing (the Trainer stops at an empty epoch). Whether
    anything is left is read once from the stream (at most what the replay skips anyway)."""
    trained = sum(start.consumed.values())
    if trained == 0:
        return start
    stream.set_epoch(start.epoch)
    if next(islice(iter(stream), trained, None), None) is None:
        return StreamStart(start.epoch + 1)
    return start


@dataclass
class PositionCollator:
    """Collates examples with the task's collator and carries their positions along."""

    collate: Callable[[list[dict]], dict]

    def __call__(self, examples: list[dict]) -> dict:
        positions = [example.pop(POSITION) for example in examples]
        skipped = [name for example in examples for name in example.pop(SKIPPED)]
        batch = self.collate(examples)
        batch[POSITION], batch[SKIPPED] = positions, skipped
        return batch


@dataclass
class StreamPositions:
    """What one process has trained on: per DataLoader worker, examples of the current epoch."""

    epoch: int = 0
    consumed: dict[int, int] = field(default_factory=dict)

    @classmethod
    def starting_at(cls, start: StreamStart) -> StreamPositions:
        return cls(start.epoch, dict(start.consumed))

    def trained(self, positions: list[tuple]) -> None:
        for worker, epoch, index, _ in positions:
            if epoch > self.epoch:
                self.epoch, self.consumed = epoch, {}
            if epoch == self.epoch:
                self.consumed[worker] = max(self.consumed.get(worker, 0), index + 1)

    def save(self, checkpoint: Path, rank: int, world_size: int, skipped: dict) -> None:
        """With `skipped`, the undecodable examples counted so far (`StreamSkips.state()`)."""
        path = checkpoint / STATE_DIRNAME / f"rank-{rank}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {"world_size": world_size, "epoch": self.epoch, "consumed": self.consumed,
                 "skipped": skipped}  # fmt: skip
        path.write_text(json.dumps(state))


def stream_start(checkpoint: str | None, rank: int, world_size: int) -> StreamStart:
    """Where this process's stream resumes: from its state in `checkpoint`, else the start."""
    if checkpoint is None:
        return StreamStart()
    path = Path(checkpoint) / STATE_DIRNAME / f"rank-{rank}.json"
    if not path.is_file():
        raise UserError(
            f"{checkpoint} holds no stream position for rank {rank} (it was not saved by a "
            "--streaming run): resume it without --streaming, or start afresh with --resume never."
        )
    state = json.loads(path.read_text())
    if state["world_size"] != world_size:
        raise UserError(
            f"{checkpoint} was saved by {state['world_size']} processes; a stream divided "
            f"among {world_size} cannot resume from it exactly: use {state['world_size']}."
        )
    consumed = {int(worker): count for worker, count in state["consumed"].items()}
    return StreamStart(state["epoch"], consumed, state.get("skipped", {}))


def indexed_rows(task) -> int | None:
    """Examples per epoch of the training stream, when every source is an indexed shard set."""
    indexes = [shard_index_of(source.data_args.dataset_name) for source in task.sources()]
    if any(index is None for index in indexes):
        return None
    names = split_names(task.data_args.train_split_name)
    return sum(index.rows(name) for index in indexes for name in names)


def epoch_line(task, args) -> str:
    """What `--max_steps` means in epochs, from the shard indexes (streams have no length)."""
    spec = task.data_args.train_split_name
    per_step = args.per_device_train_batch_size * args.world_size * args.gradient_accumulation_steps
    rows = indexed_rows(task)
    if rows is None:
        return f"streaming {spec}: {per_step} examples per optimizer step, {args.max_steps} steps"
    return (
        f"streaming {spec}: {rows} examples per epoch (shard index; filters may drop some), "
        f"{per_step} per optimizer step: --max_steps {args.max_steps} is "
        f"{args.max_steps * per_step / rows:.2f} epochs"
    )


def is_stream(dataset: Dataset | IterableDataset | None) -> bool:
    from datasets import IterableDataset

    return isinstance(dataset, IterableDataset)
