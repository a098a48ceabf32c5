"""`TrainingArguments` from the run's configuration: what every training process builds,
here below both so that the preflight can build the same object to check it before launch
(trainer/preflight/training_checks.py)."""

from __future__ import annotations

import copy
import os

import torch

from trainer.common.errors import UserError
from trainer.common.secrets import scrub_training_arguments
from trainer.settings.run_config import RunConfig
from trainer.tasks.registry import load_task


def build_training_arguments(config: RunConfig, gradient_checkpointing: bool | None = None):
    """The task's TrainingArguments from the run's values; `gradient_checkpointing`, when
    decided in training (`decide_gradient_checkpointing`), instead of the flag's value."""
    values = copy.deepcopy(config.training.values)  # TrainingArguments may change its lists
    if gradient_checkpointing is not None:
        values["gradient_checkpointing"] = gradient_checkpointing
    arguments = _construct(load_task(config.task).training_arguments_class, values)
    scrub_training_arguments(arguments, os.environ)  # pickled into every checkpoint
    return arguments


def training_arguments_before_launch(config: RunConfig):
    """The training processes' TrainingArguments, built in the launcher to check them: same class,
    values and `__post_init__` (its validation, `report_to` normalised, the DeepSpeed config
    filled in and compared by `HfTrainerDeepSpeedConfig`), but nothing that asks torch about
    this process's devices.

    `__post_init__` ends by setting up devices (`_setup_devices`), creating accelerate's
    `PartialState` for this process, wrong three ways in the launcher: on a CPU-only node the
    run's `use_configured_state` (trainer/config/resolve.py `platform_requirements`: the
    training processes create that state) makes it refuse; on a GPU node it makes cuda:0
    current, a CUDA context on GPU 0 in the launcher, which stays for the whole run as the
    agent; with --use_cpu where Vertex AI set WORLD_SIZE and RANK (one per node) it waits for
    a gloo group no peer joins. So the
    launcher's copy is a subclass replacing exactly that step (the device reads as CPU) and
    reporting the run's planned world size instead of 1: DeepSpeed's `train_batch_size` is
    compared with world size x batch size x accumulation steps.

    Two more steps ask this process's GPU: bf16 support (skipped under `use_cpu`) and TF32
    support (which also switches TF32 on). The launcher judges both from the detected
    `Hardware`, like every device decision (`resolve_mixed_precision`,
    `preflight/training_checks.py` `check_tf32`), so the copy is built with `use_cpu` on and
    `tf32` unset, then gets the run's values back (`dataloader_pin_memory` too, which `use_cpu`
    turns off)."""
    values = copy.deepcopy(config.training.values)
    task_arguments = load_task(config.task).training_arguments_class
    arguments_class = _without_devices(task_arguments, config.topology.world_size)
    args = _construct(arguments_class, {**values, "use_cpu": True, "tf32": None})
    for name in ("use_cpu", "tf32", "dataloader_pin_memory"):
        setattr(args, name, values[name])
    return args


DEPRECATED_ALIASES = {
    "gradient_checkpointing": "activation_checkpointing",
    "gradient_checkpointing_kwargs": "activation_checkpointing_kwargs",
}
"""transformers 5's deprecated TrainingArguments names -> the names they stand for. The flags
keep the names every recipe and blog uses; the object is built with the new ones, as
`__post_init__` would resolve them (the new name wins when both are set), without the
FutureWarning it prints in the launcher and every training process."""


def _construct(arguments_class: type, values: dict):
    values = dict(values)
    for old, new in DEPRECATED_ALIASES.items():
        value = values.pop(old, None)
        if values.get(new) is None:
            values[new] = value
    try:
        return arguments_class(**values)
    except ValueError as error:
        raise UserError(" ".join(str(error).split())) from None


def _without_devices(arguments_class: type, planned_world_size: int) -> type:
    """`arguments_class` without device setup, its world size the planned one (see
    `training_arguments_before_launch`)."""

    class WithoutDevices(arguments_class):
        @property
        def _setup_devices(self) -> torch.device:
            return torch.device("cpu")

        @property
        def world_size(self) -> int:
            return planned_world_size

    WithoutDevices.__name__ = WithoutDevices.__qualname__ = arguments_class.__name__
    return WithoutDevices
