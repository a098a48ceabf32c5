"""The training run every process makes, from the resolved configuration, in four steps:

    assemble  the task, model and processor, datasets, resume point, and the Trainer with
              its callbacks (trainer/training/assemble.py)
    fit       train from the resume point; an agreed stop saves the step and ends here
    deliver   the model to its destination, before anything else can fail
    finish    the final evaluation, the test predictions (--do_predict), the TensorBoard
              logs, the last checkpoint uploads, and the model's registration
              (--register_model)

How a run that ends early ends, what it keeps and the one line that says so, is decided in
one place around the steps: `WhatIsKept.keeping` (trainer/training/kept.py). Nothing here
changes a flag: the run's configuration was resolved before launch; the one decision left
to this side is gradient checkpointing when the user left it open on a GPU
(trainer/training/gradient_checkpointing.py).
"""

from __future__ import annotations

from pathlib import Path

from trainer.settings.run_config import RunConfig
from trainer.training.assemble import TrainingRun, assemble
from trainer.training.callbacks import NothingLeftToTrain, StoppedMidStep
from trainer.training.delivery import ModelNotDelivered, deliver_model
from trainer.training.distributed import release_process_group
from trainer.training.failures import RunFailed, root_cause
from trainer.training.keep_work import EvaluationFailed
from trainer.training.model_registration import register_the_model
from trainer.training.progress import StartupTimer, before_after_line, evaluation_logged_at
from trainer.training.test_predictions import predict_test


def train(config: RunConfig, launched_at: float | None = None) -> None:
    run = assemble(config, StartupTimer(launched_at))
    with run.kept.keeping(run.stop):
        fit(run)
        deliver(run)
        finish(run)
    if run.place.is_global_main:
        output_dir = run.trainer.args.output_dir
        print(f"checkpoints: {config.locations.checkpoints}; metrics and logs: {output_dir}",
              flush=True)  # fmt: skip
    release_process_group()


def fit(run: TrainingRun) -> None:
    """Train from the resume point. An agreed stop saves its step (the last completed one when
    agreed between micro-batches) and ends the run here; an evaluation failed at the last
    step still delivers the model before the run ends; a resume point at the last step
    trains nothing (its weights are delivered)."""
    try:
        result = run.trainer.train(resume_from_checkpoint=run.resume_from)
    except StoppedMidStep:
        if run.trainer.state.global_step > 0:  # a step was completed: save it, on every rank
            run.saver.rewind_to_step_start()
            run.trainer.save_step(trial=None)
        raise run.kept.stopped_after_saving(run.saver, run.stop) from None
    except NothingLeftToTrain:
        end_at_the_resumed_last_step(run)
        return
    except EvaluationFailed as failed:
        if failed.step >= run.trainer.state.max_steps:
            try:
                run.kept.model = deliver_model(run)
            except ModelNotDelivered as also:
                raise RunFailed(f"{failed}; {also}") from root_cause(failed)
        raise
    if run.saver.stopped_at_step is not None:
        raise run.kept.stopped_after_saving(run.saver, run.stop)
    run.trainer.save_metrics("train", result.metrics)


def end_at_the_resumed_last_step(run: TrainingRun) -> None:
    """Resumed from a checkpoint of the last step: say so, and end as the Trainer's own end of
    training does (the best checkpoint's weights, with --load_best_model_at_end)."""
    trainer = run.trainer
    if run.place.is_global_main:
        print(f"{Path(run.resume_from).name} holds the last step (--max_steps "
              f"{trainer.state.max_steps}): nothing left to train; delivering its model",
              flush=True)  # fmt: skip
    if trainer.args.load_best_model_at_end and trainer.state.best_model_checkpoint:
        trainer._load_best_model()


def deliver(run: TrainingRun) -> None:
    run.kept.model = deliver_model(run)
    run.kept.stop_if_requested(run.stop)
    # Everything after this point may fail without losing the run: the model is delivered.


def finish(run: TrainingRun) -> None:
    """The final evaluation, the test predictions, the last TensorBoard sync, the last
    checkpoint's upload (however long it takes), and the model's registration: a failure in
    any of them loses nothing delivered."""
    with run.kept.step("the final evaluation"):
        evaluate_final(run)
    with run.kept.step("the test predictions"):
        predict_test(run)
    with run.kept.step("syncing the TensorBoard logs"):
        if run.tensorboard is not None:
            run.tensorboard.sync()
    run.saver.settle_uploads()  # every rank: a peer that gave up is heard after the last step
    if run.uploader is not None:
        run.uploader.close()
        if unsaved := run.uploader.unsaved():  # older failures: a newer checkpoint holds more
            raise RunFailed(f"uploading {', '.join(unsaved)} failed")
    register_the_model(run)


def evaluate_final(run: TrainingRun) -> None:
    """The delivered weights' score, beside the one before training; skipped when the last step's
    evaluation scored them (generation over the whole set, for speech, would only cost time)."""
    if run.eval_size is None:
        return
    trainer = run.trainer
    history, steps = trainer.state.log_history, trainer.state.global_step
    final_metrics = evaluation_logged_at(history, steps)
    if final_metrics is None or trainer.args.load_best_model_at_end:
        final_metrics = trainer.evaluate()
    trainer.save_metrics("eval", final_metrics)
    if run.place.is_global_main:
        before = evaluation_logged_at(history, 0)
        metric = trainer.args.metric_for_best_model
        line = before_after_line(
            before, final_metrics, steps, run.eval_size, run.kept.model, metric
        )
        print(line, flush=True)
