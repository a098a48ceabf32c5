"""The gradient checkpointing decision (the one setting the training processes decide: it
needs the loaded model), from the estimate in trainer/tasks/step_memory.py."""

from __future__ import annotations

import os

import torch

from trainer.settings.run_config import RunConfig
from trainer.tasks.base import Task
from trainer.tasks.step_memory import GIB, footprint_of, gradient_checkpointing_needed


def decide_gradient_checkpointing(config: RunConfig, task: Task, model) -> bool | None:
    """On a GPU, gradient checkpointing on only if a step would not fit without it; None without
    the task's estimate (the flag stands). Called when the user left it open; estimate and
    decision are printed once, to check an out-of-memory error against."""
    footprint = footprint_of(config, task, model, int(os.environ.get("WORLD_SIZE", "1")))
    if footprint is None:
        return None
    gpu = torch.cuda.get_device_properties(int(os.environ.get("LOCAL_RANK", "0")))
    gpu_bytes = gpu.total_memory
    needed = gradient_checkpointing_needed(footprint, gpu_bytes)
    if os.environ.get("RANK", "0") == "0":
        state = "on" if needed else "off"
        print(
            f"gradient checkpointing {state}: a training step needs about "
            f"{footprint.step_bytes(checkpointing=False) / GIB:.1f} GiB per GPU without it, "
            f"{footprint.step_bytes(checkpointing=True) / GIB:.1f} GiB with it; the GPU has "
            f"{gpu_bytes / GIB:.1f} GiB (--gradient_checkpointing true|false decides instead)",
            flush=True,
        )
    return needed
