"""The Trainer's side of "nothing trained is lost": a step whose evaluation fails or is
stopped is still saved, and a save that fails says why.

The HF Trainer evaluates a step before it saves it (`_maybe_log_save_evaluate`): a metric
that raises, a failing report or a SIGTERM during the evaluation would lose the step, and
at the last step the model too (every shipped recipe evaluates there). So:

- a stop agreed during an evaluation (`EvaluationStopped`, raised on every rank at the same
  batch) abandons it; every rank saves the step and training ends as for any stop;
- a failure after the evaluation's collectives (in the metric, a report, the logs) is
  held; every rank learns in one all-reduce whether any rank's evaluation failed, all save
  the step together, and then the ranks that failed raise `EvaluationFailed`. A failure
  inside the evaluation loop (before its gathers are done) cannot be agreed on: the other
  ranks wait in a gather, so it is raised at once, and the newest earlier save is what is
  kept;
- a save that fails raises `SaveFailed` naming the checkpoint and, for a full disk, the
  disk and its free space (torch's own message is "unexpected pos").
"""

from __future__ import annotations

from pathlib import Path

from trainer.storage.faults import brief, disk_full, disk_line
from trainer.tasks.trainers import mixed_in
from trainer.training.failures import RunFailed
from trainer.training.preemption import EvaluationStopped, agree


class EvaluationFailed(RunFailed):
    """This rank's evaluation at `step` failed; the step was saved first."""

    def __init__(self, step: int, error: BaseException) -> None:
        super().__init__(f"the evaluation at step {step} failed ({brief(error)})")
        self.step = step


class SaveFailed(RunFailed):
    """Writing a checkpoint to the local disk failed on this rank."""

    rank_local = True

    def __init__(self, checkpoint: Path, error: BaseException) -> None:
        if disk_full(error):
            what = disk_line(checkpoint, f"writing {checkpoint.name}")
        else:
            what = f"writing {checkpoint.name} to {checkpoint} failed"
        super().__init__(f"{what} ({brief(error)})")


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
            self._save_step(trial)
            raise
        except Exception as error:
            if not self._loop_done:
                raise  # the other ranks are inside a gather: no save can line up
            failure = error
        (anyone_failed,) = agree([float(failure is not None)])
        if anyone_failed:
            self._save_step(trial)
        if failure is not None:
            raise EvaluationFailed(self.state.global_step, failure) from failure
        return metrics

    def _save_step(self, trial) -> None:
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


def work_keeping_trainer(trainer_class):
    """`trainer_class` (a Trainer subclass or a partial of one) that keeps its steps."""
    return mixed_in(KeepWorkMixin, trainer_class)
