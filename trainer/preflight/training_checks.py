"""The resolved run checked as the training processes will use it, before launch (by every way in:
the launcher on its node, `trainer.ray`, `trainer.jobspec` for its machines).

Each check stands for a failure the training processes would otherwise hit only after the image
pull, the nodes' start, the rendezvous and the model loading: a `--metric_for_best_model` the
task never reports (a KeyError at the first evaluation), a `--report_to` integration this image
lacks (a RuntimeError when the Trainer starts), a DeepSpeed JSON whose fixed values contradict
the training flags (a ValueError when DeepSpeed starts). They run the same transformers code on
the same `TrainingArguments` (tasks/training_arguments.py).
"""

from __future__ import annotations

from transformers.integrations import (
    get_available_reporting_integrations,
    get_reporting_integration_callbacks,
)

from trainer.common.errors import UserError
from trainer.settings.run_config import Hardware, RunConfig
from trainer.tasks import Task, load_task, task_name
from trainer.tasks.training_arguments import training_arguments_before_launch


def check_training_arguments(config: RunConfig):
    """Build the run's TrainingArguments as its processes will, check them, and return
    them; UserError (one line) for the first problem."""
    args = training_arguments_before_launch(config)
    check_tf32(args.tf32, config.hardware)
    check_metric(load_task(config.task), args.metric_for_best_model)
    check_integrations(args.report_to)
    check_deepspeed_values(args)
    return args


def check_tf32(tf32: bool | None, hardware: Hardware) -> None:
    """TrainingArguments refuses `--tf32 true` in a process whose GPU lacks TF32; the
    launcher asks the node's detected hardware (see `training_arguments_before_launch`)."""
    capability = hardware.compute_capability
    if tf32 and (capability is None or capability < (8, 0)):
        raise UserError(
            f"--tf32 true needs an Ampere or newer GPU (compute capability 8.0+); this is "
            f"{hardware.gpu_name or 'a CPU-only node'}: leave --tf32 out."
        )


def check_metric(task_class: type[Task], metric: str | None) -> None:
    """The Trainer looks `metric_for_best_model` up as `eval_NAME` in each evaluation's
    metrics: the task's `compute_metrics` names plus the evaluation loss."""
    if metric is None:
        return
    names = [*task_class.metric_names, "loss"]
    if metric.removeprefix("eval_") not in names:
        raise UserError(
            f"--metric_for_best_model {metric} is not a metric of --task "
            f"{task_name(task_class)}: choose one of {', '.join(names)} (with or "
            "without the eval_ prefix)."
        )


def check_integrations(report_to: list[str]) -> None:
    """Every `--report_to` name is one transformers knows and one whose package this image
    has (transformers' own test, as `--report_to all` uses it). The Trainer would fail on
    either when it starts, e.g. `WandbCallback requires wandb to be installed`."""
    try:
        get_reporting_integration_callbacks(report_to)
    except ValueError as error:
        raise UserError(f"--report_to: {error}") from None
    available = get_available_reporting_integrations()
    missing = [name for name in report_to if name not in available]
    if missing:
        raise UserError(
            f"--report_to {' '.join(missing)}: not installed in this image (it has "
            f"{', '.join(available) or 'none'}); leave it out, or add its package to the "
            "image's dependencies (pyproject.toml) and rebuild the image."
        )


def check_deepspeed_values(args) -> None:
    """A DeepSpeed JSON value that is not "auto" must equal the training flag it stands
    for: `HfTrainerDeepSpeedConfig.trainer_config_process` (run by TrainingArguments)
    records each difference, and the Trainer refuses them all when DeepSpeed starts."""
    deepspeed_config = getattr(args, "hf_deepspeed_config", None)
    if deepspeed_config is None or not deepspeed_config.mismatches:
        return
    differences = "; ".join(line.removeprefix("- ") for line in deepspeed_config.mismatches)
    raise UserError(
        f"DeepSpeed config {args.deepspeed} contradicts the training flags ({differences}): "
        'set these values to "auto" (the Trainer fills them from the flags) or change the '
        "flags to match."
    )
