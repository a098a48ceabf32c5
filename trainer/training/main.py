"""The training program that `accelerate launch` runs in every process.

flags -> task -> model and processor -> datasets -> resume point -> Trainer -> train,
evaluate, save. It is also usable on its own (`python -m trainer.training.main FLAGS`, e.g. as
the module of a Vertex AI prebuilt-container job), but `python -m trainer` is the normal
entry point: it finds the cluster, checks the flags and starts this program on every GPU
of every node.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from trainer.common.errors import UserError
from trainer.common.exit_codes import PREEMPTED_EXIT_CODE
from trainer.common.log_lines import write_whole_lines
from trainer.common.quiet import silence_known_noise
from trainer.config.flags import ParsedFlags, greater_is_better, parse_flags
from trainer.config.recipes import expand_config_file
from trainer.launcher.main import LAUNCHED_AT_VARIABLE
from trainer.training.failures import (
    FailedAfterTraining,
    model_kept_if_failing,
    report_failed_after_training,
    report_failure,
)
from trainer.training.preemption import Stopped

FINAL_MODEL_DIRNAME = "model"
STAGING_DIRNAME = ".staging"
RESUME_CHOICE_FILENAME = ".resume-from"


@dataclass(frozen=True)
class ProcessPlace:
    """Where this process sits, from the variables torchrun sets for every worker."""

    node_rank: int
    num_nodes: int
    is_local_main: bool
    is_global_main: bool

    @classmethod
    def from_env(cls) -> ProcessPlace:
        env = os.environ
        world, local_world = int(env.get("WORLD_SIZE", "1")), int(env.get("LOCAL_WORLD_SIZE", "1"))
        return cls(
            node_rank=int(env.get("GROUP_RANK", "0")),
            num_nodes=max(1, world // local_world),
            is_local_main=env.get("LOCAL_RANK", "0") == "0",
            is_global_main=env.get("RANK", "0") == "0",
        )


def main(argv: list[str] | None = None) -> None:
    write_whole_lines()  # every rank of the node prints to the same stdout and stderr
    launched_at = os.environ.get(LAUNCHED_AT_VARIABLE)
    argv = expand_config_file_or_exit(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    silence_known_noise()  # before torch, DeepSpeed or datasets print anything
    try:
        train(argv, float(launched_at) if launched_at else None)
    except UserError as error:
        if os.environ.get("LOCAL_RANK", "0") == "0":
            print(f"error: {error}", file=sys.stderr, flush=True)
        sys.exit(2)
    except FailedAfterTraining as error:
        report_failed_after_training(error)
        sys.exit(1)
    except Stopped as stopped:
        if os.environ.get("LOCAL_RANK", "0") == "0":
            print(f"preempted: {stopped}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        # Not sys.exit: it would wait for the storage client's transfer threads, i.e. for
        # an upload this process has given up on (its checkpoint keeps no manifest).
        os._exit(PREEMPTED_EXIT_CODE)
    except Exception as error:  # noqa: BLE001 - reported once here; the exit code tells torchrun
        report_failure(error)
        sys.exit(1)


def expand_config_file_or_exit(argv: list[str]) -> list[str]:
    try:
        return expand_config_file(argv)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        sys.exit(2)


def train(argv: list[str], launched_at: float | None = None) -> None:
    from trainer.training.progress import StartupTimer

    startup = StartupTimer(launched_at)
    startup.mark("launcher, torchrun and imports")
    from transformers import PrinterCallback, set_seed

    from trainer.data.streams import epoch_line, is_stream, prepare_stream, stream_start
    from trainer.storage.locations import resolve_output_locations
    from trainer.training.callbacks import (
        CheckpointSyncCallback,
        SaveOnStopOrInterval,
        TensorBoardSyncCallback,
    )
    from trainer.training.preemption import StopRequest
    from trainer.training.progress import (
        DataWaitClock,
        FirstBatchReport,
        ProgressLogCallback,
        before_after_line,
        evaluation_logged_at,
    )
    from trainer.training.stream_training import streaming_trainer

    flags = parse_flags(argv)
    task = flags.task
    task.adjust_training_arguments(flags.training)
    infer_metric_direction(flags)
    startup.mark("flags")
    use_gloo_on_cpu(flags.training)
    set_seed(flags.training.seed)
    startup.mark("rendezvous")
    # The model is loaded before TrainingArguments exists on purpose: with a ZeRO-3 config,
    # TrainingArguments makes from_pretrained run under deepspeed.zero.Init, where Whisper's
    # weight init fails on already-partitioned tensors (transformers 5.23: sinusoids() gets
    # an empty shape). Loaded normally, the model is partitioned when DeepSpeed starts.
    model, processor = task.build_model_and_processor()
    choose_gradient_checkpointing(flags, model, argv)
    if flags.data.streaming:
        # The stream resumes at its own recorded position (trainer/data/streams.py); the
        # Trainer's skipping of already-trained batches would read them a second time.
        flags.training.ignore_data_skip = True
    args = build_training_arguments(flags)
    startup.mark("model")
    place = ProcessPlace.from_env()
    locations = resolve_output_locations(flags.outputs, os.environ, args.output_dir)
    output_dir = Path(args.output_dir)

    with args.main_process_first(desc="loading datasets"):
        train_dataset, eval_dataset = task.load_datasets(processor)
    resume_from = checkpoint_to_resume(flags, locations, args, place)
    trainer_class = task.trainer_class
    if is_stream(train_dataset):
        start = stream_start(resume_from, args.process_index, args.world_size)
        train_dataset = prepare_stream(
            train_dataset, args.seed, flags.data.shuffle_buffer_size, start
        )
        trainer_class = streaming_trainer(
            trainer_class, train_dataset.start, flags.data.stream_audit_dir
        )
        if place.is_global_main:
            print(epoch_line(task, args), flush=True)
    startup.mark("data and resume point")

    trainer = trainer_class(
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
    trainer.add_callback(ProgressLogCallback(data_wait, timed=progress_by_time(argv)))
    trainer.add_callback(startup)
    uploader = checkpoint_uploader(locations, args, place, flags.outputs.peer_upload_timeout)
    trainer.add_callback(CheckpointSyncCallback(uploader))
    reporting = reporting_callbacks(flags, locations, output_dir, place)
    for callback in reporting:
        trainer.add_callback(callback)
    stop = StopRequest()
    saver = SaveOnStopOrInterval(stop, flags.outputs.save_interval_minutes)
    trainer.add_callback(saver)

    # If training fails (a peer died, say), the uploads in flight are not waited for: the
    # chief would wait for markers a dead node never writes. Their checkpoints simply get
    # no manifest, and the upload thread ends with the process.
    stop.install()
    try:
        result = trainer.train(resume_from_checkpoint=resume_from)
    finally:
        if saver.stopped_at_step is None:  # only a stop's uploads outlast a SIGTERM
            stop.uninstall()
    if saver.stopped_at_step is not None:
        raise stopped_after_saving(saver, stop, uploader, locations.checkpoints, flags.outputs)
    trainer.save_metrics("train", result.metrics)
    model_location = deliver_model(trainer, output_dir / FINAL_MODEL_DIRNAME, locations, place)
    # Everything after this point may fail without losing the run: the model is delivered.
    if eval_dataset is not None:
        history, steps = trainer.state.log_history, trainer.state.global_step
        with model_kept_if_failing("the final evaluation", model_location):
            # An evaluation at the last step already scored these weights: a second one
            # would only cost time (generation over the whole eval set, for speech).
            final_metrics = evaluation_logged_at(history, steps)
            if final_metrics is None or args.load_best_model_at_end:
                final_metrics = trainer.evaluate()
            trainer.save_metrics("eval", final_metrics)
        if place.is_global_main:
            print(
                before_after_line(
                    evaluation_logged_at(history, 0), final_metrics, steps, len(eval_dataset),
                    model_location, args.metric_for_best_model,
                ),
                flush=True,
            )  # fmt: skip
    with model_kept_if_failing("syncing the TensorBoard logs", model_location):
        for callback in reporting:
            if isinstance(callback, TensorBoardSyncCallback):
                callback.sync()
    if uploader is not None:
        with model_kept_if_failing("uploading checkpoints", model_location):
            uploader.close()
            if uploader.failures:
                raise RuntimeError(f"not saved to {locations.checkpoints}: {uploader.failures}")
    if place.is_global_main:
        print(f"checkpoints: {locations.checkpoints}; metrics and logs: {output_dir}", flush=True)
    release_process_group()


def release_process_group() -> None:
    """Destroy the process group at the end of a run, as torch asks every training process
    to. Left to the interpreter's exit, gloo's worker threads can abort a finished process
    ("terminate called without an active exception", SIGABRT: pytorch/pytorch#179291), and
    torchrun then reports a run that delivered its model as failed. Only after success: a
    failed run's peers may still be inside a collective."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def stopped_after_saving(saver, stop, uploader, checkpoints: str, outputs) -> Stopped:
    """Wait for this node's uploads, up to `--stop_grace_seconds` from the moment this
    process learned of the stop (its own SIGTERM, or the ranks' agreement); say what was
    kept. The chief's upload ends with the manifest, so "complete" there means resumable."""
    import time

    learned_at = stop.requested_at if stop.requested else saver.agreed_at
    grace = outputs.stop_grace_seconds
    name = f"checkpoint-{saver.stopped_at_step}"
    cause = f"SIGTERM on node {saver.stop_origin_node} (Spot preemption or a stopped job)"
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


def deliver_model(trainer, final_dir: Path, locations, place: ProcessPlace) -> str:
    """Save the final model and processor, and upload them to their destination, before
    anything else can fail: the final evaluation, metrics or uploads come after this.

    Every rank takes part in saving (under ZeRO-3 gathering the weights is a collective);
    the global main process writes and uploads. Returns where the model is.
    """
    from trainer.storage.store import open_store

    trainer.save_model(str(final_dir))
    if not place.is_global_main:
        return locations.model
    if locations.model != str(final_dir):
        try:
            open_store(locations.model).upload(final_dir)
        except Exception as error:
            raise FailedAfterTraining(
                f"uploading the final model to {locations.model} failed "
                f"({type(error).__name__}: {error}); it is saved on this node at {final_dir}, "
                f"and complete checkpoints are at {locations.checkpoints}"
            ) from error
    print(
        f"final model and processor saved to {locations.model} (load with from_pretrained)",
        flush=True,
    )
    return locations.model


def checkpoint_to_resume(flags: ParsedFlags, locations, args, place: ProcessPlace) -> str | None:
    """The local path of the checkpoint to resume from, fetched and verified, or None.

    Each node's local main process looks for it (and downloads what its node lacks) while
    the node's other processes wait, then they read its choice from a node-local file.
    """
    from trainer.storage.checkpoints import find_resumable_checkpoint
    from trainer.storage.store import open_store

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
                found = find_resumable_checkpoint(open_store(locations.checkpoints), output_dir)
            else:
                found = explicit_checkpoint(choice, output_dir)
            output_dir.mkdir(parents=True, exist_ok=True)
            choice_file.write_text(str(found or ""))
        path = choice_file.read_text() or None
    if path and place.is_global_main:
        print(f"resuming from {path}", flush=True)
    return path


def explicit_checkpoint(location: str, output_dir: Path) -> Path:
    """`--resume PATH_OR_URI`: a complete checkpoint (one with a manifest), fetched here."""
    from trainer.storage.checkpoints import MANIFEST, read_manifest
    from trainer.storage.store import open_store

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
    from trainer.storage.checkpoints import CheckpointUploader
    from trainer.storage.store import open_store

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
    from trainer.storage.store import open_store
    from trainer.training.callbacks import HypertuneCallback, TensorBoardSyncCallback

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
    tuning = "CLOUD_ML_TRIAL_ID" in os.environ or "CLOUD_ML_HP_METRIC_FILE" in os.environ
    if tuning and place.is_global_main and flags.training.metric_for_best_model:
        callbacks.append(HypertuneCallback(flags.training.metric_for_best_model))
    return callbacks


def progress_by_time(argv: list[str]) -> bool:
    """Whether progress lines come by time: yes unless the command line or recipe (both
    are flags by now) chose a logging interval, which then wins."""
    from trainer.config.hardware_defaults import flag_names

    return not flag_names(argv) & {"--logging_steps", "--logging_strategy"}


def infer_metric_direction(flags: ParsedFlags) -> None:
    """Set `greater_is_better` for the Trainer, which would treat WER as bigger-is-better."""
    if flags.training.metric_for_best_model:
        flags.training.greater_is_better = greater_is_better(flags)


def use_gloo_on_cpu(training: argparse.Namespace) -> None:
    """Without CUDA, accelerate leaves the backend unset and every rank thinks it is alone.

    Creating the process group over gloo before TrainingArguments exists, and telling the
    Trainer to use that configured state, makes multi-process CPU runs (tests, demos) real.
    """
    import torch

    if torch.cuda.is_available() or "LOCAL_RANK" not in os.environ:
        return
    from accelerate import PartialState

    PartialState(backend="gloo", timeout=timedelta(seconds=training.ddp_timeout))
    config = training.accelerator_config or {}
    if isinstance(config, str):
        config = json.loads(config)
    training.accelerator_config = {**config, "use_configured_state": True}


def choose_gradient_checkpointing(flags: ParsedFlags, model, argv: list[str]) -> None:
    """On a GPU, turn gradient checkpointing on only if a step would not fit without it.

    A `--gradient_checkpointing` flag (or recipe line) always wins. The estimate and the
    decision are printed once, so an out-of-memory error can be checked against them.
    """
    import torch

    from trainer.config.hardware_defaults import (
        GIB,
        TrainingFootprint,
        flag_names,
        gradient_checkpointing_needed,
    )

    training = flags.training
    if "--gradient_checkpointing" in flag_names(argv) or not torch.cuda.is_available():
        return
    full, checkpointed = flags.task.activation_values_per_sample(model, training)
    if full == 0:
        return
    zero_stage, offloaded = deepspeed_zero_settings(training.deepspeed)
    footprint = TrainingFootprint(
        parameters=model.num_parameters(),
        trainable_parameters=model.num_parameters(only_trainable=True),
        activation_values=full,
        checkpointed_activation_values=checkpointed,
        batch_size=training.per_device_train_batch_size,
        mixed_precision=bool(training.bf16 or training.fp16),
        zero_stage=zero_stage,
        optimizer_offloaded=offloaded,
        world_size=int(os.environ.get("WORLD_SIZE", "1")),
    )
    gpu = torch.cuda.get_device_properties(int(os.environ.get("LOCAL_RANK", "0")))
    gpu_bytes = gpu.total_memory
    training.gradient_checkpointing = gradient_checkpointing_needed(footprint, gpu_bytes)
    if os.environ.get("RANK", "0") == "0":
        state = "on" if training.gradient_checkpointing else "off"
        print(
            f"gradient checkpointing {state}: a training step needs about "
            f"{footprint.step_bytes(checkpointing=False) / GIB:.1f} GiB per GPU without it, "
            f"{footprint.step_bytes(checkpointing=True) / GIB:.1f} GiB with it; the GPU has "
            f"{gpu_bytes / GIB:.1f} GiB (--gradient_checkpointing true|false decides instead)",
            flush=True,
        )


def deepspeed_zero_settings(config: str | dict | None) -> tuple[int | None, bool]:
    """(ZeRO stage or None without DeepSpeed, whether the optimizer state is offloaded)."""
    if not config:
        return None, False
    if isinstance(config, str):
        config = json.loads(Path(config).read_text())
    zero = config.get("zero_optimization", {})
    offload = zero.get("offload_optimizer", {}).get("device", "none")
    return int(zero.get("stage", 0)), offload in ("cpu", "nvme")


def build_training_arguments(flags: ParsedFlags):
    try:
        return flags.task.training_arguments_class(**vars(flags.training))
    except ValueError as error:
        raise UserError(" ".join(str(error).split())) from None


if __name__ == "__main__":
    main()
