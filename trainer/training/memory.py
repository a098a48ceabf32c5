"""How much GPU memory a training step needs, and the gradient checkpointing decision that
follows from it (the one setting the training processes decide: it needs the model)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from trainer.config.flags import ParsedFlags

GIB = 2**30
USABLE_GPU_FRACTION = 0.9
RESERVED_GPU_BYTES = 2 * GIB
"""Left out of a GPU's memory for the CUDA context, NCCL and DeepSpeed buffers and the
allocator's fragmentation; the estimate below counts none of them."""


@dataclass(frozen=True)
class TrainingFootprint:
    """What decides a training step's GPU memory, per GPU."""

    parameters: int
    trainable_parameters: int
    activation_values: int
    """Activation values one sample keeps for the backward pass, without checkpointing."""
    checkpointed_activation_values: int
    """The same with gradient checkpointing (layer inputs, plus one layer being recomputed)."""
    batch_size: int
    mixed_precision: bool
    zero_stage: int | None
    """DeepSpeed ZeRO stage, or None for plain data parallelism."""
    optimizer_offloaded: bool
    world_size: int

    def model_state_bytes(self) -> float:
        """Weights, gradients and AdamW state (ZeRO paper, Rajbhandari et al. 2020, sec. 3).

        Mixed precision keeps 16-bit weights and gradients plus fp32 master weights and two
        moments (2 + 2 + 12 bytes per parameter); fp32 keeps 4 + 4 + 8. ZeRO-1/2 partition
        the optimizer state (and from stage 2 the gradients) over the world, ZeRO-3 the
        weights too. Without DeepSpeed, autocast keeps fp32 weights: 4 + 4 + 8 bytes.
        """
        params, trainable, world = self.parameters, self.trainable_parameters, self.world_size
        if self.zero_stage is None:
            return 16.0 * trainable + 4.0 * (params - trainable)
        weight_bytes = 2 if self.mixed_precision else 4
        optimizer_bytes = 0 if self.optimizer_offloaded else (12 if self.mixed_precision else 8)
        weights = weight_bytes * params / (world if self.zero_stage >= 3 else 1)
        gradients = weight_bytes * trainable / (world if self.zero_stage >= 2 else 1)
        return weights + gradients + optimizer_bytes * trainable / world

    def activation_bytes_per_sample(self, checkpointing: bool) -> float:
        """2 bytes per value under DeepSpeed's bf16/fp16, whose weights and activations are
        16-bit; 4 in fp32, and also under autocast without DeepSpeed, which keeps fp32
        inputs next to their 16-bit copies (autograd saved about as many bytes as in fp32
        when measured on whisper-tiny and -base)."""
        values = self.checkpointed_activation_values if checkpointing else self.activation_values
        return values * (2 if self.mixed_precision and self.zero_stage is not None else 4)

    def step_bytes(self, checkpointing: bool) -> float:
        per_sample = self.activation_bytes_per_sample(checkpointing)
        return self.model_state_bytes() + self.batch_size * per_sample


def gradient_checkpointing_needed(footprint: TrainingFootprint, gpu_bytes: int) -> bool:
    """True when a step does not fit in the GPU's usable memory without checkpointing.

    Checkpointing costs about a third more compute (every layer's forward runs again during
    backward), so it is only worth turning on when memory forces it.
    """
    usable = USABLE_GPU_FRACTION * gpu_bytes - RESERVED_GPU_BYTES
    return footprint.step_bytes(checkpointing=False) > usable


def decide_gradient_checkpointing(flags: ParsedFlags, model) -> bool | None:
    """On a GPU, gradient checkpointing on only if a step would not fit without it; None
    when the task gives no estimate (the flag's value stands).

    Called only when the user left the choice open (trainer/config/resolve.py). The
    estimate and the decision are printed once, so an out-of-memory error can be checked
    against them.
    """
    training = flags.training
    full, checkpointed = flags.task.activation_values_per_sample(model, training)
    if full == 0:
        return None
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


def deepspeed_zero_settings(config: str | dict | None) -> tuple[int | None, bool]:
    """(ZeRO stage or None without DeepSpeed, whether the optimizer state is offloaded)."""
    if not config:
        return None, False
    if isinstance(config, str):
        config = json.loads(Path(config).read_text())
    zero = config.get("zero_optimization", {})
    offload = zero.get("offload_optimizer", {}).get("device", "none")
    return int(zero.get("stage", 0)), offload in ("cpu", "nvme")
