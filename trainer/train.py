"""The training program that `accelerate launch` runs in every process.

flags -> task -> model and processor -> datasets -> Trainer -> train, evaluate, save.
It is also usable on its own (`python -m trainer.train FLAGS`, e.g. as the module of a
Vertex AI prebuilt-container job), but `python -m trainer` is the normal entry point: it
finds the cluster, checks the flags and starts this program on every GPU of every node.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import timedelta
from pathlib import Path

from trainer.arguments import ParsedFlags, parse_flags
from trainer.config_file import expand_config_file
from trainer.errors import UserError

FINAL_MODEL_DIRNAME = "model"


def main(argv: list[str] | None = None) -> None:
    argv = expand_config_file_or_exit(sys.argv[1:] if argv is None else argv)
    try:
        train(argv)
    except UserError as error:
        if os.environ.get("LOCAL_RANK", "0") == "0":
            print(f"error: {error}", file=sys.stderr, flush=True)
        sys.exit(2)


def expand_config_file_or_exit(argv: list[str]) -> list[str]:
    try:
        return expand_config_file(argv)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        sys.exit(2)


def train(argv: list[str]) -> None:
    from transformers import PrinterCallback, set_seed

    from trainer.progress import FirstBatchReport, ProgressLogCallback

    flags = parse_flags(argv)
    task = flags.task
    task.adjust_training_arguments(flags.training)
    infer_metric_direction(flags)
    use_gloo_on_cpu(flags.training)
    set_seed(flags.training.seed)
    # The model is loaded before TrainingArguments exists on purpose: with a ZeRO-3 config,
    # TrainingArguments makes from_pretrained run under deepspeed.zero.Init, where Whisper's
    # weight init fails on already-partitioned tensors (transformers 5.23: sinusoids() gets
    # an empty shape). Loaded normally, the model is partitioned when DeepSpeed starts.
    model, processor = task.build_model_and_processor()
    args = build_training_arguments(flags)
    with args.main_process_first(desc="loading datasets"):
        train_dataset, eval_dataset = task.load_datasets(processor)

    trainer = task.trainer_class(
        model=model,
        args=args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        data_collator=FirstBatchReport(task.data_collator(processor)),
        processing_class=processor,
        compute_metrics=task.compute_metrics(processor) if eval_dataset is not None else None,
    )
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(ProgressLogCallback())

    result = trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    trainer.save_metrics("train", result.metrics)
    if eval_dataset is not None:
        trainer.save_metrics("eval", trainer.evaluate())

    final_dir = Path(args.output_dir) / FINAL_MODEL_DIRNAME
    trainer.save_model(str(final_dir))
    if trainer.is_world_process_zero():
        print(f"final model and processor saved to {final_dir} (load with from_pretrained)")
        print(f"checkpoints, metrics and TensorBoard logs are under {args.output_dir}", flush=True)


def infer_metric_direction(flags: ParsedFlags) -> None:
    """The Trainer assumes bigger is better unless a metric ends in "loss"; WER is not."""
    training = flags.training
    if training.greater_is_better is None and training.metric_for_best_model:
        metric = training.metric_for_best_model.removeprefix("eval_")
        lower_is_better = metric in flags.task.lower_is_better or metric.endswith("loss")
        training.greater_is_better = not lower_is_better


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


def build_training_arguments(flags: ParsedFlags):
    try:
        return flags.task.training_arguments_class(**vars(flags.training))
    except ValueError as error:
        raise UserError(" ".join(str(error).split())) from None


if __name__ == "__main__":
    main()
