"""The Trainer's side of a stream: every process reads only its own part, the position of what it
trained on goes into each checkpoint, the undecodable examples its loader workers dropped are
counted (their names come in the batches), and (on request) an audit.

Left alone, accelerate would either have the main process read every batch and send slices to
the others (`dispatch_batches`, its default) or shard the IterableDataset again by process
(`IterableDataset.shard`, or `IterableDatasetShard`, which keeps one batch in N and pads the
last with repeats). The stream already is this process's part (`split_dataset_by_node`,
trainer/data/streams.py), so its DataLoader is prepared as a one-process loader: batches still
go to the device through accelerate, unsplit.
"""

from __future__ import annotations

from pathlib import Path

from trainer.data.bad_examples import StreamSkips
from trainer.data.streams import (
    POSITION,
    SKIPPED,
    PositionCollator,
    StreamPositions,
    StreamStart,
    epoch_line,
    indexed_rows,
    is_stream,
    prepare_stream,
    stream_start,
)
from trainer.settings.data_flags import DataArguments
from trainer.tasks.base import Task
from trainer.tasks.trainers import mixed_in


class StreamingTrainerMixin:
    """Mixed in before a task's Trainer class when the training set is a stream."""

    def __init__(
        self, *args, stream_start: StreamStart, audit_dir: str | None, skips: StreamSkips, **kwargs
    ) -> None:
        super().__init__(*args, **kwargs)
        self.stream_positions = StreamPositions.starting_at(stream_start)
        self.stream_skips = skips
        self.audit_dir = Path(audit_dir) if audit_dir else None

    def get_train_dataloader(self):
        """This process's loader. Its workers start afresh each epoch, whatever
        `--dataloader_persistent_workers` says (which still applies to evaluation): the
        epoch, which reseeds the shuffle, reaches them when they start. They draw their seeds
        from the loader's own generator: from the global one, each new epoch's iterator
        would move the RNG state that a checkpoint restores (dropout), and a resumed run
        would drift from an uninterrupted one."""
        import torch
        from accelerate.data_loader import prepare_data_loader
        from torch.utils.data import DataLoader

        workers = self.args.dataloader_num_workers
        loader = DataLoader(
            self.train_dataset,
            batch_size=self._train_batch_size,
            collate_fn=PositionCollator(self.data_collator),
            num_workers=workers,
            pin_memory=self.args.dataloader_pin_memory,
            prefetch_factor=self.args.dataloader_prefetch_factor if workers else None,
            generator=torch.Generator().manual_seed(self.args.seed),
        )
        return prepare_data_loader(
            loader,
            device=self.args.device,
            num_processes=1,
            process_index=0,
            put_on_device=True,
            dispatch_batches=False,
        )

    def training_step(self, model, inputs, *args, **kwargs):
        positions = inputs.pop(POSITION)
        self.stream_positions.trained(positions)
        self.stream_skips.trained(len(positions), inputs.pop(SKIPPED))
        if self.audit_dir is not None:
            self._audit(positions)
        return super().training_step(model, inputs, *args, **kwargs)

    def _save_checkpoint(self, model, trial) -> None:
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        super()._save_checkpoint(model, trial)
        folder = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        checkpoint = Path(self._get_output_dir(trial=trial)) / folder
        self.stream_positions.save(
            checkpoint, self.args.process_index, self.args.world_size, self.stream_skips.state()
        )

    def _audit(self, positions: list[tuple]) -> None:
        """One line per example: the optimizer step it belongs to and its id (a shard
        set's `__key__`, else worker/epoch/index)."""
        step = self.state.global_step + 1
        lines = [
            f"{step} {key if key is not None else f'{worker}/{epoch}/{index}'}\n"
            for worker, epoch, index, key in positions
        ]
        self.audit_dir.mkdir(parents=True, exist_ok=True)
        with (self.audit_dir / f"rank-{self.args.process_index}.txt").open("a") as handle:
            handle.writelines(lines)


def streaming_trainer(
    trainer_class, stream_start: StreamStart, audit_dir: str | None, skips: StreamSkips
):
    """`trainer_class` (a Trainer subclass, or a partial of one) reading a stream."""
    return mixed_in(
        StreamingTrainerMixin,
        trainer_class,
        stream_start=stream_start,
        audit_dir=audit_dir,
        skips=skips,
    )


def for_the_training_data(task: Task, train_dataset, resume_from: str | None, args):
    """(the Trainer class, the training set, the stream's skip count) for the data: the
    task's own class and the set as they are, or for a stream, this process's shuffled
    part of it resuming at its recorded position, read by a streaming Trainer."""
    if not is_stream(train_dataset):
        return task.trainer_class, train_dataset, None
    data: DataArguments = task.data_args
    start = stream_start(resume_from, args.process_index, args.world_size)
    stream = prepare_stream(train_dataset, args.seed, data.shuffle_buffer_size, start)
    where = f"split {data.train_split_name} of {data.dataset_name}"
    skips = StreamSkips(data.max_bad_examples, where, indexed_rows(task))
    skips.resume(start.skipped)
    trainer_class = streaming_trainer(
        task.trainer_class, stream.start, data.stream_audit_dir, skips
    )
    if args.process_index == 0:
        print(epoch_line(task, args), flush=True)
    return trainer_class, stream, skips
