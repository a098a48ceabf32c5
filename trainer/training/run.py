"""The training run every process makes, from the resolved configuration, top to bottom:

configuration -> task -> model and processor -> datasets -> resume point -> Trainer ->
train, save and deliver the model, evaluate. Nothing here changes a flag: the launcher
resolved them (trainer/config/resolve.py); the one decision left to this side is gradient
checkpointing when the user left it open on a GPU (`decide_gradient_checkpointing`).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from transformers import PrinterCallback, set_seed

from trainer.common.errors import UserError
from trainer.config.cluster import reports_to_tuning
from trainer.config.flags import ParsedFlags
from trainer.config.resolve import RunConfig
from trainer.config.training_arguments import build_training_arguments
from trainer.data.bad_examples import StreamSkips
from trainer.data.streams import (
    epoch_line,
    indexed_rows,
    is_stream,
    prepare_stream,
    stream_start,
)
from trainer.storage.checkpoints import (
    MANIFEST,
    CheckpointUnreadable,
    CheckpointUploader,
    find_resumable_checkpoint,
    publish_model,
    read_manifest,
)
from trainer.storage.faults import brief, disk_full, disk_line
from trainer.storage.locations import resolve_output_locations
from trainer.storage.store import open_store
from trainer.tasks.base import Task
from trainer.training.callbacks import (
    CheckpointSyncCallback,
    HypertuneCallback,
    SaveOnStopOrInterval,
    TensorBoardSyncCallback,
)
from trainer.training.distributed import ProcessPlace, release_process_group, use_gloo_on_cpu
from trainer.training.fabric import report_fabric
from trainer.training.failures import RunFailed, is_peer_failure, root_cause
from trainer.training.keep_work import EvaluationFailed, work_keeping_trainer
from trainer.training.kept import WhatIsKept
from trainer.training.lora import merge_delivered_adapter
from trainer.training.memory import decide_gradient_checkpointing
from trainer.training.preemption import EvaluationStopped, Stopped, StopRequest
from trainer.training.progress import (
    DataWaitClock,
    FirstBatchReport,
    ProgressLogCallback,
    StartupTimer,
    before_after_line,
    evaluation_logged_at,
)
from trainer.training.run_end import remember_delivery
from trainer.training.stream_training import streaming_trainer
from trainer.training.world_size import resume_with_world_size

FINAL_MODEL_DIRNAME = "model"
STAGING_DIRNAME = ".staging"
RESUME_CHOICE_FILENAME = ".resume-from"


def train(config: RunConfig, launched_at: float | None = None) -> None:
    startup = StartupTimer(launched_at)
    startup.mark("launcher, torchrun and imports")
    flags = config.parsed()
    task = flags.task
    startup.mark("flags")
    use_gloo_on_cpu(flags.training.ddp_timeout, deepspeed=config.deepspeed_config is not None)
    set_seed(flags.training.seed)
    startup.mark("rendezvous")
    # The model is loaded before TrainingArguments exists on purpose: with a ZeRO-3 config,
    # TrainingArguments makes from_pretrained run under deepspeed.zero.Init, where Whisper's
    # weight init fails on already-partitioned tensors (transformers 5.23: sinusoids() gets
    # an empty shape). Loaded normally, the model is partitioned when DeepSpeed starts.
    model, processor = task.build_model_and_processor()
    model = task.trained_model(model)  # with --peft lora: frozen, with adapters
    checkpointing = None
    if config.gradient_checkpointing_left_open:
        checkpointing = decide_gradient_checkpointing(flags, model)
    args = build_training_arguments(flags, gradient_checkpointing=checkpointing)
    startup.mark("model")
    place = ProcessPlace.from_env()
    if place.num_nodes > 1:
        report_fabric(place, args)
    locations = resolve_output_locations(flags.outputs, os.environ, args.output_dir)
    output_dir = Path(args.output_dir)

    with args.main_process_first(desc="loading datasets"):
        train_dataset, eval_dataset = task.load_datasets(processor)
    resume_from = checkpoint_to_resume(flags, locations, args, place)
    trainer_class = task.trainer_class
    skips = None
    if is_stream(train_dataset):
        start = stream_start(resume_from, args.process_index, args.world_size)
        train_dataset = prepare_stream(
            train_dataset, args.seed, flags.data.shuffle_buffer_size, start
        )
        data = flags.data
        where = f"split {data.train_split_name} of {data.dataset_name}"
        skips = StreamSkips(data.max_bad_examples, where, indexed_rows(task))
        skips.resume(start.skipped)
        trainer_class = streaming_trainer(
            trainer_class, train_dataset.start, data.stream_audit_dir, skips
        )
        if place.is_global_main:
            print(epoch_line(task, args), flush=True)
    if resume_from:  # after a stream's check, which refuses another count outright
        resume_from = str(resume_with_world_size(Path(resume_from), args, place))
    startup.mark("data and resume point")

    trainer = work_keeping_trainer(trainer_class)(
        model=model,
        args=args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        data_collator=task.data_collator(processor),
        processing_class=processor,
        compute_metrics=task.compute_metrics(processor) if eval_dataset is not None else None,
    )
    trainer.remove_callback(PrinterCallback)
    data_wait = DataWaitClock()
    data_wait.attach(trainer)
    FirstBatchReport().attach(trainer)
    timed = progress_by_time(config.given)
    trainer.add_callback(ProgressLogCallback(data_wait, timed=timed, stream_skips=skips))
    trainer.add_callback(startup)
    uploader = checkpoint_uploader(locations, args, place, flags.outputs.peer_upload_timeout)
    trainer.add_callback(CheckpointSyncCallback(uploader))
    reporting = reporting_callbacks(flags, locations, output_dir, place)
    for callback in reporting:
        trainer.add_callback(callback)
    stop = StopRequest()
    saver = SaveOnStopOrInterval(stop, flags.outputs.save_interval_minutes)
    trainer.add_callback(saver)

    kept = WhatIsKept(uploader, locations.checkpoints, flags.outputs.stop_grace_seconds)
    # SIGTERM is held from here to the end: whenever it comes, the step or the model in
    # hand is kept first, and the run ends with one `preempted:` line.
    stop.install()
    try:
        result = trainer.train(resume_from_checkpoint=resume_from)
    except EvaluationFailed as failed:
        if failed.step >= trainer.state.max_steps:  # the last step: its model is the result
            try:
                kept.model = deliver_model(trainer, output_dir / FINAL_MODEL_DIRNAME,
                                           locations, place, task)  # fmt: skip
            except ModelNotDelivered as also:
                raise kept.failed(RunFailed(f"{failed}; {also}")) from root_cause(failed)
        raise kept.failed(failed) from root_cause(failed)
    except RunFailed as failed:
        raise kept.failed(failed) from root_cause(failed)
    except UserError as error:  # found by training itself: a stream past --max_bad_examples
        line = kept.line()
        stop.uninstall()
        raise UserError(f"{error}; {line}") from error
    except Exception as error:
        # A peer's failure: uploads waiting for a dead node's marker are not waited for.
        if not is_peer_failure(error):
            kept.wait()
        # report_failure ends the process's one line with it: a dead node or a crash on
        # one rank says, like every other failure, where a restart resumes.
        error.add_note(kept.checkpoint_line())
        stop.uninstall()  # a pending SIGTERM (torchrun stopping an echo) ends it now
        raise
    if saver.stopped_at_step is not None:
        raise stopped_after_saving(saver, stop, uploader, locations.checkpoints, flags.outputs)
    trainer.save_metrics("train", result.metrics)
    kept.model = deliver_or_fail(trainer, output_dir, locations, place, kept, task)
    stop_if_requested(stop, place, kept)
    # Everything after this point may fail without losing the run: the model is delivered.
    if eval_dataset is not None:
        history, steps = trainer.state.log_history, trainer.state.global_step
        try:
            # An evaluation at the last step already scored these weights: a second one
            # would only cost time (generation over the whole eval set, for speech).
            final_metrics = evaluation_logged_at(history, steps)
            if final_metrics is None or args.load_best_model_at_end:
                final_metrics = trainer.evaluate()
            trainer.save_metrics("eval", final_metrics)
        except EvaluationStopped as stopped:
            kept.wait(since=stop.requested_at)
            raise Stopped(f"{stop_cause(stopped.origin_node)}: {kept.line()}") from None
        except Exception as error:
            raise kept.failed(error, "the final evaluation") from error
        if place.is_global_main:
            print(
                before_after_line(
                    evaluation_logged_at(history, 0), final_metrics, steps, len(eval_dataset),
                    kept.model, args.metric_for_best_model,
                ),
                flush=True,
            )  # fmt: skip
    try:
        for callback in reporting:
            if isinstance(callback, TensorBoardSyncCallback):
                callback.sync()
    except Exception as error:
        raise kept.failed(error, "syncing the TensorBoard logs") from error
    if uploader is not None:
        uploader.close()  # the last checkpoint's upload, however long it takes
        if unsaved := uploader.unsaved():  # older failures: a newer checkpoint holds more
            raise kept.failed(RunFailed(f"uploading {', '.join(unsaved)} failed"))
    stop_if_requested(stop, place, kept)
    stop.uninstall()
    if place.is_global_main:
        print(f"checkpoints: {locations.checkpoints}; metrics and logs: {output_dir}", flush=True)
    release_process_group()


def stop_cause(node: int) -> str:
    return f"SIGTERM on node {node} (Spot preemption or a stopped job)"


def stop_if_requested(stop: StopRequest, place: ProcessPlace, kept: WhatIsKept) -> None:
    """A SIGTERM that came after the ranks' last agreement (during the last save, the
    model's delivery or the last uploads): stop with what is kept."""
    if stop.requested:
        kept.wait(since=stop.requested_at)
        raise Stopped(f"{stop_cause(place.node_rank)} after training: {kept.line()}")


def stopped_after_saving(saver, stop, uploader, checkpoints: str, outputs) -> Stopped:
    """Wait for this node's uploads, up to `--stop_grace_seconds` from the moment this
    process learned of the stop (its own SIGTERM, or the ranks' agreement); say what was
    kept. The chief's upload ends with the manifest, so "complete" there means resumable."""
    learned_at = stop.requested_at if stop.requested else saver.agreed_at
    grace = outputs.stop_grace_seconds
    name = f"checkpoint-{saver.stopped_at_step}"
    cause = stop_cause(saver.stop_origin_node)
    if uploader is None:
        return Stopped(f"{cause}: every rank saved {name} locally")
    done = uploader.close(timeout=max(0.0, learned_at + grace - time.monotonic()))
    seconds = time.monotonic() - learned_at
    if not done or name in uploader.failures:
        return Stopped(
            f"{cause}: {name} was not uploaded to {checkpoints} within {seconds:.1f} s "
            f"(--stop_grace_seconds {grace:g}); the job resumes from the previous complete "
            "checkpoint"
        )
    what = "is complete" if uploader.is_global_main else "has this node's part"
    return Stopped(f"{cause}: {name} {what} in {checkpoints}, {seconds:.1f} s after the stop")


def deliver_or_fail(trainer, output_dir: Path, locations, place, kept: WhatIsKept, task) -> str:
    """`deliver_model`, or the run's one line when the delivery failed."""
    try:
        return deliver_model(trainer, output_dir / FINAL_MODEL_DIRNAME, locations, place, task)
    except ModelNotDelivered as failed:
        raise kept.failed(failed) from root_cause(failed)


class ModelNotDelivered(RunFailed):
    """Saving or uploading the final model failed; the message says what is left where."""


def deliver_model(trainer, final_dir: Path, locations, place: ProcessPlace, task: Task) -> str:
    """Save the final model and processor, and upload them to their destination, before
    anything else can fail: the final evaluation, metrics or uploads come after this. The
    model's manifest is written last: without it, the model there is incomplete.

    Every rank takes part in saving (under ZeRO-3 gathering the weights is a collective);
    the global main process writes (with `--peft lora`, merges: training/lora.py) and
    uploads. Returns where the model is.
    """
    try:
        trainer.save_model(str(final_dir))
        if place.is_global_main:
            merge_delivered_adapter(task, final_dir, trainer.args)
    except Exception as error:
        what = (
            disk_line(final_dir, "writing the final model")
            if disk_full(error)
            else f"saving the final model to {final_dir} failed"
        )
        raise ModelNotDelivered(f"{what} ({brief(error)})") from error
    if not place.is_global_main:
        return locations.model
    try:
        publish_model(open_store(locations.model), final_dir)
    except Exception as error:
        raise ModelNotDelivered(
            f"uploading the final model to {locations.model} failed ({brief(error)}); the "
            f"model there is incomplete (no {MANIFEST}); this node's copy at {final_dir} is "
            "gone when the job ends"
        ) from error
    print(
        f"final model and processor saved to {locations.model} (load with from_pretrained)",
        flush=True,
    )
    # a restart of this job then stops before launch, saying the model is there
    remember_delivery(locations.checkpoints, locations.model, trainer.state.global_step)
    return locations.model


def checkpoint_to_resume(flags: ParsedFlags, locations, args, place: ProcessPlace) -> str | None:
    """The local path of the checkpoint to resume from, fetched and verified, or None.

    Each node's local main process looks for it (and downloads what its node lacks) while
    the node's other processes wait, then they read its choice from a node-local file.
    """
    if args.resume_from_checkpoint:
        return args.resume_from_checkpoint
    choice = flags.outputs.resume
    if choice == "never":
        return None
    output_dir = Path(args.output_dir)
    choice_file = output_dir / RESUME_CHOICE_FILENAME
    with args.main_process_first(local=True, desc="looking for a checkpoint to resume"):
        if place.is_local_main:
            if choice == "auto":
                found = newest_readable_checkpoint(locations.checkpoints, output_dir)
            else:
                found = explicit_checkpoint(choice, output_dir)
            output_dir.mkdir(parents=True, exist_ok=True)
            choice_file.write_text(str(found or ""))
        path = choice_file.read_text() or None
    if path and place.is_global_main:
        print(f"resuming from {path}", flush=True)
    return path


def newest_readable_checkpoint(checkpoints: str, output_dir: Path) -> Path | None:
    """`find_resumable_checkpoint`, or one line when complete checkpoints may exist but
    cannot be read: starting from step 1 would lose them, and retention would delete them."""
    try:
        return find_resumable_checkpoint(open_store(checkpoints), output_dir)
    except CheckpointUnreadable as error:
        cause = error.__cause__
        what = (
            disk_line(error.local, f"downloading {error.name or 'a checkpoint'}")
            + f" ({brief(cause)})"
            if disk_full(cause)
            else str(error)
        )
        raise RunFailed(
            f"{what}; the run stops before training rather than start again from step 1 "
            f"(nothing was trained or deleted): restart once {checkpoints} can be read"
        ) from cause


def explicit_checkpoint(location: str, output_dir: Path) -> Path:
    """`--resume PATH_OR_URI`: a complete checkpoint (one with a manifest), fetched here."""
    store = open_store(location)
    entries = read_manifest(store)
    if entries is None:
        if not location.startswith("gs://") and Path(location).is_dir():
            return Path(location)  # a plain local Trainer checkpoint: trusted as given
        raise UserError(f"--resume {location}: no {MANIFEST} there, so not a complete checkpoint.")
    local = output_dir / location.rstrip("/").rsplit("/", 1)[-1]
    store.download(local, entries)
    return local


def checkpoint_uploader(locations, args, place: ProcessPlace, peer_timeout: float):
    """This node's uploader, on its local main process only (None elsewhere)."""
    if not place.is_local_main:
        return None
    if place.num_nodes > 1 and not locations.shared_checkpoints:
        if place.is_global_main:
            logging.getLogger(__name__).warning(
                "%d nodes but no --checkpoint_dir or AIP_CHECKPOINT_DIR: checkpoints stay on "
                "each node's disk and cannot be resumed after a restart.",
                place.num_nodes,
            )
        return None
    return CheckpointUploader(
        store=open_store(locations.checkpoints),
        staging_root=Path(args.output_dir) / STAGING_DIRNAME / "checkpoints",
        node_rank=place.node_rank,
        num_nodes=place.num_nodes,
        is_global_main=place.is_global_main,
        keep=args.save_total_limit if locations.shared_checkpoints else None,
        peer_timeout=peer_timeout,
    )


def reporting_callbacks(flags: ParsedFlags, locations, output_dir: Path, place: ProcessPlace):
    """TensorBoard sync (when a destination is set) and hyperparameter-tuning reports."""
    callbacks = []
    if locations.tensorboard and place.is_global_main:
        callbacks.append(
            TensorBoardSyncCallback(
                local_dir=output_dir / "runs",
                store=open_store(locations.tensorboard),
                staging=output_dir / STAGING_DIRNAME / "tensorboard",
                interval=flags.outputs.tensorboard_sync_seconds,
            )
        )
    if (
        reports_to_tuning(os.environ)
        and place.is_global_main
        and flags.training.metric_for_best_model
    ):
        callbacks.append(HypertuneCallback(flags.training.metric_for_best_model))
    return callbacks


def progress_by_time(given: tuple[str, ...]) -> bool:
    """Whether progress lines come by time: yes unless the command line or recipe chose a
    logging interval (`given`: the flags the user gave), which then wins."""
    return not set(given) & {"--logging_steps", "--logging_strategy"}
