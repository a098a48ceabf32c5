"""The resolved run checked as the training processes will use it, before launch (by every way in:
the launcher on its node, `trainer.ray`, `trainer.jobspec` for its machines).

Each check stands for a failure the training processes would otherwise hit only after the image
pull, the nodes' start, the rendezvous and the model loading: a `--metric_for_best_model` the
task never reports (a KeyError at the first evaluation), a `--report_to` integration this image
lacks (a RuntimeError when the Trainer starts), a DeepSpeed JSON whose fixed values contradict
the training flags (a ValueError when DeepSpeed starts), an `--optim` whose package this image
lacks or whose GPU this node lacks (an ImportError when the Trainer makes its optimizer). They
run the same transformers code on the same `TrainingArguments` (tasks/training_arguments.py).
"""

from __future__ import annotations

from transformers import Trainer
from transformers.integrations import (
    get_available_reporting_integrations,
    get_reporting_integration_callbacks,
)
from transformers.trainer_optimizer import _BITSANDBYTES_OPTIMIZERS

from trainer.common.errors import UserError
from trainer.settings.run_config import Hardware, RunConfig
from trainer.tasks.base import Task
from trainer.tasks.registry import load_task
from trainer.tasks.training_arguments import training_arguments_before_launch


def check_training_arguments(config: RunConfig, packages_here: bool = True):
    """Build the run's TrainingArguments as its processes will, check them, and return
    them; UserError (one line) for the first problem. `packages_here` false (a job spec,
    written away from the image that will train) leaves the optimizer's package to the node."""
    args = training_arguments_before_launch(config)
    check_tf32(args.tf32, config.hardware)
    check_metric(load_task(config.task), args.metric_for_best_model)
    check_integrations(args.report_to)
    check_deepspeed_values(args)
    check_optimizer_device(args.optim.value, config.hardware)
    if packages_here:
        check_optimizer_package(args)
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
            f"{task_class.spec.name}: choose one of {', '.join(names)} (with or "
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


DEFAULT_OPTIMIZER = "leave --optim out (torch's AdamW, the default)"


def check_optimizer_device(optim: str, hardware: Hardware) -> None:
    """transformers' bitsandbytes optimizers (`adamw_bnb_8bit`, `paged_*`, `lion_*`, ...) run
    CUDA kernels only; judged from the detected hardware, before anything imports bitsandbytes
    (on a CPU-only node: pages of CUDA probing). Which optimizers those are is transformers'
    own list, private: a transformers that renames it fails this import, and the tests."""
    if hardware.gpu_count == 0 and optim in _BITSANDBYTES_OPTIMIZERS:
        raise UserError(
            f"--optim {optim} is a bitsandbytes optimizer and needs a CUDA GPU; this is a "
            f"CPU-only node: {DEFAULT_OPTIMIZER}, or use a machine with a GPU."
        )


def check_optimizer_package(args) -> None:
    """The optimizer class the Trainer will make, resolved here by the Trainer's own code
    (`get_optimizer_cls_and_kwargs`: no model made, no optimizer built), so that every
    `--optim` whose package this image lacks (bitsandbytes, galore_torch, apollo_torch,
    lomo_optim, torchao, schedulefree, grokadamw, torch-optimi, torchdistx, torch_xla,
    torch_npu) or whose `--optim_args`/`--optim_target_modules` it cannot use is refused
    here, not when the Trainer makes its optimizer in every training process. The
    optimizers that need the model itself (GaLore, APOLLO, LOMO) say so only once their
    package is found: that is left to the training processes."""
    optim = args.optim.value
    try:
        Trainer.get_optimizer_cls_and_kwargs(args)
    except (ImportError, ValueError) as error:
        if package_missing(error):
            raise UserError(
                f"--optim {optim}: {one_line(error, args.optim)} (not in this image): "
                f"{DEFAULT_OPTIMIZER}, or add that package to the image's dependencies "
                "(pyproject.toml) and rebuild it."
            ) from None
        # "You need to pass a model ...": GaLore, APOLLO and LOMO found their package
        if "pass a model" not in str(error).replace("`", ""):
            raise UserError(f"--optim {optim}: {one_line(error, args.optim)}.") from None


def package_missing(error: Exception) -> bool:
    """How transformers' optimizer handlers say a package is missing: an ImportError, a
    ValueError raised while handling one (torch_xla, torch_npu, torchdistx), or a ValueError
    asking to install it (grokadamw)."""
    return (
        isinstance(error, ImportError)
        or isinstance(error.__context__, ImportError)
        or "install" in str(error).lower()
    )


def one_line(error: Exception, optim) -> str:
    """transformers' message on one line, the optimizer named as the user gave it (some
    messages format `OptimizerNames.GALORE_ADAMW`)."""
    return " ".join(str(error).replace(str(optim), optim.value).split()).rstrip(".")
