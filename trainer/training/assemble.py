"""A process's training run, assembled from the resolved configuration: the task, its model
and processor (with LoRA adapters), the TrainingArguments, the datasets, the resume point,
and the Trainer with its callbacks (progress lines, checkpoint uploads, TensorBoard sync,
hyperparameter-tuning reports, SIGTERM and timed saves)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import PrinterCallback, set_seed

from trainer.settings.run_config import RunConfig
from trainer.storage.checkpoints import CheckpointUploader
from trainer.storage.store import open_store
from trainer.tasks import build_task
from trainer.tasks.base import Task
from trainer.tasks.training_arguments import build_training_arguments
from trainer.training.callbacks import (
    CheckpointSyncCallback,
    HypertuneCallback,
    NoStepPastTheEnd,
    SaveOnStopOrInterval,
    TensorBoardSyncCallback,
    reports_to_tuning,
)
from trainer.training.distributed import ProcessPlace, use_gloo_on_cpu
from trainer.training.fabric import report_fabric
from trainer.training.gradient_checkpointing import decide_gradient_checkpointing
from trainer.training.keep_work import work_keeping_trainer
from trainer.training.kept import WhatIsKept
from trainer.training.preemption import StopRequest
from trainer.training.progress import (
    DataWaitClock,
    FirstBatchReport,
    ProgressLogCallback,
    StartupTimer,
    progress_by_time,
)
from trainer.training.resume import checkpoint_to_resume
from trainer.training.stream_training import for_the_training_data
from trainer.training.world_size import resume_with_world_size

STAGING_DIRNAME = ".staging"


@dataclass
class TrainingRun:
    """Everything the steps of a run (trainer/training/run.py) work with."""

    config: RunConfig
    task: Task
    trainer: Any
    place: ProcessPlace
    resume_from: str | None
    eval_size: int | None
    """Examples in the evaluation set (None: no evaluation)."""
    uploader: CheckpointUploader | None
    tensorboard: TensorBoardSyncCallback | None
    stop: StopRequest
    saver: SaveOnStopOrInterval
    kept: WhatIsKept


def assemble(config: RunConfig, startup: StartupTimer) -> TrainingRun:
    startup.mark("launcher, torchrun and imports")
    task = build_task(config)
    startup.mark("flags")
    use_gloo_on_cpu(config.training.ddp_timeout, deepspeed=config.training.deepspeed is not None)
    set_seed(config.training.seed)
    startup.mark("rendezvous")
    model, processor, args = model_and_arguments(config, task)
    startup.mark("model")
    place = ProcessPlace.from_env()
    if place.num_nodes > 1:
        report_fabric(place, args)
    with args.main_process_first(desc="loading datasets"):
        train_dataset, eval_dataset = task.load_datasets(processor)
    resume_from = checkpoint_to_resume(config, args, place)
    trainer_class, train_dataset, skips = for_the_training_data(
        task, train_dataset, resume_from, args
    )
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
    eval_size = None if eval_dataset is None else len(eval_dataset)
    return TrainingRun(
        config, task, trainer, place, resume_from, eval_size,
        **with_callbacks(config, trainer, place, skips, startup),
    )  # fmt: skip


def model_and_arguments(config: RunConfig, task: Task):
    """The model to train (with --peft lora: frozen, with adapters), its processor, and the
    TrainingArguments, made after the model on purpose: with a ZeRO-3 config, TrainingArguments
    makes from_pretrained run under deepspeed.zero.Init, where Whisper's weight init fails on
    partitioned tensors (transformers 5.23: sinusoids() gets an empty shape). Loaded normally,
    the model is partitioned when DeepSpeed starts."""
    model, processor = task.build_model_and_processor()
    model = task.trained_model(model)
    checkpointing = None
    if config.gradient_checkpointing_left_open:
        checkpointing = decide_gradient_checkpointing(config, task, model)
    return model, processor, build_training_arguments(config, gradient_checkpointing=checkpointing)


def with_callbacks(config: RunConfig, trainer, place: ProcessPlace, skips, startup) -> dict:
    """Attach the callbacks: progress lines, checkpoint uploads, TensorBoard sync and
    tuning reports, stops and timed saves. Returns the parts the run's steps use."""
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(NoStepPastTheEnd())
    data_wait = DataWaitClock()
    data_wait.attach(trainer)
    FirstBatchReport().attach(trainer)
    timed = progress_by_time(config.given)
    trainer.add_callback(ProgressLogCallback(data_wait, timed=timed, stream_skips=skips))
    trainer.add_callback(startup)
    stop = StopRequest()
    uploader = checkpoint_uploader(config, trainer.args, place, stop)
    trainer.add_callback(CheckpointSyncCallback(uploader))
    tensorboard = tensorboard_sync(config, trainer.args, place)
    metric = config.training.metric_for_best_model
    tuning = reports_to_tuning(os.environ) and place.is_global_main and metric
    for callback in (tensorboard, HypertuneCallback(metric) if tuning else None):
        if callback is not None:
            trainer.add_callback(callback)
    saver = SaveOnStopOrInterval(stop, config.outputs.save_interval_minutes, uploader=uploader,
                                 num_nodes=place.num_nodes,
                                 stop_grace=config.outputs.stop_grace_seconds)  # fmt: skip
    trainer.add_callback(saver)
    outputs = config.outputs
    kept = WhatIsKept(uploader, config.locations.checkpoints, outputs.stop_grace_seconds,
                      place.node_rank, failure_wait=outputs.failure_upload_seconds)  # fmt: skip
    return {"uploader": uploader, "tensorboard": tensorboard, "stop": stop, "saver": saver,
            "kept": kept}  # fmt: skip


def checkpoint_uploader(config: RunConfig, args, place: ProcessPlace, stop: StopRequest):
    """This node's uploader, on its local main process only (None elsewhere); a SIGTERM here
    (`stop`) leaves the chief's retention undone, for the stop checkpoint's sake."""
    locations = config.locations
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
        peer_timeout=config.outputs.peer_upload_timeout,
        stop_requested=lambda: stop.requested,
    )


def tensorboard_sync(config: RunConfig, args, place: ProcessPlace):
    """The TensorBoard sync of the global main process, when logs have a destination."""
    if not (config.locations.tensorboard and place.is_global_main):
        return None
    output_dir = Path(args.output_dir)
    return TensorBoardSyncCallback(
        local_dir=output_dir / "runs",
        store=open_store(config.locations.tensorboard),
        staging=output_dir / STAGING_DIRNAME / "tensorboard",
        interval=config.outputs.tensorboard_sync_seconds,
    )
