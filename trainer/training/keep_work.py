"""The Trainer's side of "nothing trained is lost": a step whose evaluation fails or is stopped is
still saved, and a save that fails says why.

The HF Trainer evaluates a step before it saves it (`_maybe_log_save_evaluate`): a metric that
raises, a failing report, one rank's bad evaluation batch or a SIGTERM during the evaluation
would lose the step, and at the last step the model too (every shipped recipe evaluates there).
So every failure is first agreed on by all ranks, where none is inside a collective, and then
every rank saves the step together:

- a stop agreed during an evaluation (`EvaluationStopped`, raised on every rank at the same
  batch) abandons it; every rank saves the step and training ends as for any stop;
- a batch that fails on one rank (unreadable data, a failing collate or prediction) would leave
  the others waiting in the batch's gathers. So around each batch's prediction the ranks agree,
  in one scalar all-reduce before and one after (little next to a generation), whether any
  rank's batch failed; if one did, every rank abandons the evaluation (`BatchFailed`, naming
  the rank and its error) before any gather. (A prediction failing half-way under ZeRO-3, whose
  forward passes gather weights from every rank, leaves the others inside that gather: nothing
  can line up there, and the newest earlier save is what is kept.);
- a failure after the evaluation's collectives (in the metric, a report, the logs) is held; one
  all-reduce tells every rank whether any rank's evaluation failed, all save the step together,
  and then the ranks that failed raise `EvaluationFailed`;
- a save that fails raises `SaveFailed` naming the checkpoint and, for a full disk, the disk
  and its free space (torch's own message is "unexpected pos").
"""

from __future__ import annotations

from pathlib import Path

from trainer.storage.failure_kinds import brief, disk_full, disk_line
from trainer.tasks.trainers import mixed_in
from trainer.training.failures import RunFailed
from trainer.training.preemption import EvaluationStopped, agree, gather_objects


class EvaluationFailed(RunFailed):
    """This rank's evaluation at `step` failed; the step was saved first."""

    def __init__(self, step: int, error: BaseException) -> None:
        if isinstance(error, BatchFailed):
            where, cause = error.where, error.error
        else:
            where, cause = "", brief(error)
        super().__init__(f"the evaluation at step {step} failed{where} ({cause})")
        self.step = step


class BatchFailed(Exception):
    """Every rank agreed, around one evaluation batch, that a rank's batch failed: the
    evaluation is abandoned on all of them at once, before the batch's gathers."""

    def __init__(self, rank: int, ranks: int, error: str) -> None:
        self.where = f" on rank {rank} of {ranks}" if ranks > 1 else ""
        self.error = error
        super().__init__(f"an evaluation batch failed{self.where}: {error}")


class UnreadBatch:
    """Stands in for an evaluation batch that could not be read (or collated) on this
    rank, so that the failure reaches the agreement around `prediction_step`."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class FailuresAsBatches:
    """An evaluation loader whose failure to produce a batch becomes an `UnreadBatch`
    (and ends it); anything else is the loader's own (`dataset`, `len()`, ...)."""

    def __init__(self, loader) -> None:
        self._loader = loader

    def __getattr__(self, name: str):
        return getattr(self._loader, name)

    def __len__(self) -> int:
        return len(self._loader)

    def __iter__(self):
        batches = iter(self._loader)
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                return
            except Exception as error:  # noqa: BLE001 - any reader or collator failure
                yield UnreadBatch(error)
                return
            yield batch


class SaveFailed(RunFailed):
    """Writing a checkpoint to the local disk failed on this rank."""

    rank_local = True

    def __init__(self, checkpoint: Path, error: BaseException) -> None:
        if disk_full(error):  # the line says it all; the error would name the path again
            super().__init__(disk_line(checkpoint, f"writing {checkpoint.name}"))
        else:
            super().__init__(f"writing {checkpoint.name} to {checkpoint} failed (", brief(error),
                             ")")  # fmt: skip


class KeepWorkMixin:
    """Mixed in first (outermost) to whatever Trainer class the task and data chose."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._loop_done = False  # the evaluation's collectives are behind every rank
        self._save_tried_at: int | None = None
        if self.compute_metrics is not None:
            compute = self.compute_metrics

            def compute_metrics(*args, **kwargs):
                self._loop_done = True  # called after the loop's last gather
                return compute(*args, **kwargs)

            self.compute_metrics = compute_metrics

    def evaluation_loop(self, *args, **kwargs):
        self._loop_done = False
        output = super().evaluation_loop(*args, **kwargs)
        self._loop_done = True
        return output

    def get_eval_dataloader(self, *args, **kwargs):
        return FailuresAsBatches(super().get_eval_dataloader(*args, **kwargs))

    def prediction_step(self, model, inputs, *args, **kwargs):
        _agree_on_batch(inputs.error if isinstance(inputs, UnreadBatch) else None)
        failure = output = None
        try:
            output = super().prediction_step(model, inputs, *args, **kwargs)
        except Exception as error:
            failure = error
        _agree_on_batch(failure)
        return output

    def _maybe_log_save_evaluate(self, *args, **kwargs) -> None:
        try:
            super()._maybe_log_save_evaluate(*args, **kwargs)
        except EvaluationStopped:
            self.control.should_training_stop = True  # the step is saved (`_evaluate`)

    def _evaluate(self, trial, *args, **kwargs):
        failure = metrics = None
        try:
            metrics = super()._evaluate(trial, *args, **kwargs)
        except EvaluationStopped:
            self.save_step(trial)
            raise
        except Exception as error:
            if not (self._loop_done or isinstance(error, BatchFailed)):
                raise  # the other ranks are inside a gather: no save can line up
            failure = error
        (anyone_failed,) = agree([float(failure is not None)])
        if anyone_failed:
            self.save_step(trial)
        if failure is not None:
            raise EvaluationFailed(self.state.global_step, failure) from failure
        return metrics

    def save_step(self, trial) -> None:
        """Save this step now, on every rank, as `_maybe_log_save_evaluate` would have."""
        if self._save_tried_at == self.state.global_step:
            return
        self._save_checkpoint(self.model_wrapped, trial)
        self.control = self.callback_handler.on_save(self.args, self.state, self.control)

    def _save_checkpoint(self, model, trial) -> None:
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        self._save_tried_at = self.state.global_step
        try:
            super()._save_checkpoint(model, trial)
        except Exception as error:
            folder = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            raise SaveFailed(Path(self._get_output_dir(trial=trial)) / folder, error) from error


def _agree_on_batch(failure: BaseException | None) -> None:
    """Every rank's word on its evaluation batch; `BatchFailed` on every rank when any
    rank's failed (the first such rank's error, so that every node's line says it)."""
    (anyone_failed,) = agree([float(failure is not None)])
    if not anyone_failed:
        return
    errors = gather_objects(None if failure is None else brief(failure))
    rank, error = next((rank, error) for rank, error in enumerate(errors) if error is not None)
    raise BatchFailed(rank, len(errors), error) from failure


def work_keeping_trainer(trainer_class):
    """`trainer_class` (a Trainer subclass or a partial of one) that keeps its steps."""
    return mixed_in(KeepWorkMixin, trainer_class)
