"""The model a run trains, planned before launch: `--load_in_8bit` only where bitsandbytes
can run it, the LoRA targets checked, the trainable and total parameters counted and the
per-GPU memory of a training step estimated, on a weightless copy of the model (its config
on the meta device: a second, no weights read). A plan that cannot fit the node's GPUs is
refused here, in one line, instead of running out of memory after the image pull, the
rendezvous and the model loading."""

from __future__ import annotations

from trainer.common.errors import UserError
from trainer.config.flags import ParsedFlags
from trainer.config.hardware import Hardware
from trainer.config.memory_estimate import (
    GIB,
    deepspeed_zero_settings,
    footprint_of,
    gradient_checkpointing_needed,
    usable_gpu_bytes,
)
from trainer.config.resolve import RunConfig
from trainer.tasks.lora import parameter_counts

EIGHT_BIT_CAPABILITY = (7, 5)
"""bitsandbytes' int8 matrix multiplication needs Turing or newer (T4, L4, A100, H100)."""


def check_eight_bit(flags: ParsedFlags, hardware: Hardware, zero_stage: int | None) -> None:
    """`--load_in_8bit` needs a CUDA GPU bitsandbytes supports, and weights that ZeRO-3
    does not partition (DeepSpeed cannot shard int8 tensors). Checked before anything
    imports bitsandbytes, which on a CPU node fails with pages of CUDA probing."""
    if not flags.model.load_in_8bit:
        return
    capability = hardware.compute_capability
    if hardware.gpu_count == 0 or capability is None or capability < EIGHT_BIT_CAPABILITY:
        raise UserError(
            f"--load_in_8bit needs a CUDA GPU of compute capability 7.5+ (T4, L4, A100, "
            f"H100); this is {hardware.gpu_name or 'a CPU-only node'}: leave it out (LoRA "
            "alone trains on any node)."
        )
    if zero_stage is not None and zero_stage >= 3:
        raise UserError(
            "--load_in_8bit with --deepspeed zero3: DeepSpeed cannot partition 8-bit weights; "
            "use zero2 or no --deepspeed."
        )


def plan_model(config: RunConfig, flags: ParsedFlags) -> dict:
    """What the dry run shows of the model: parameters and, when the task estimates
    activations, a step's memory per GPU. UserError for bad LoRA settings, 8-bit where it
    cannot run, or a step that does not fit the GPU."""
    check_eight_bit(flags, config.hardware, deepspeed_zero_settings(flags.training.deepspeed)[0])
    try:
        model = flags.task.weightless_model(local_only=config.launcher.skip_hub_check)
    except OSError as error:  # a Hub id not reachable from here: the Hub check says more
        if flags.model.peft == "lora":
            raise UserError(
                f"--peft lora: cannot read the config of {flags.model.model_name_or_path} "
                f"to check the adapter's target modules ({error})."
            ) from None
        return {"not_estimated": f"the model's config cannot be read here ({error})"}
    trainable, total = parameter_counts(model)
    plan: dict = {"trainable_parameters": trainable, "total_parameters": total}
    footprint = footprint_of(flags, model, config.topology.world_size)
    if footprint is None:
        return plan
    checkpointing = flags.training.gradient_checkpointing
    gpu_bytes = config.hardware.gpu_memory_bytes
    if config.gradient_checkpointing_left_open and gpu_bytes:
        checkpointing = gradient_checkpointing_needed(footprint, gpu_bytes)
    plan["memory_per_gpu"] = footprint.describe(checkpointing)
    needed = footprint.step_bytes(checkpointing)
    if gpu_bytes and needed > usable_gpu_bytes(gpu_bytes):
        raise UserError(
            f"a training step needs about {needed / GIB:.1f} GiB per GPU "
            f"({describe(footprint, checkpointing)}), "
            f"more than the {usable_gpu_bytes(gpu_bytes) / GIB:.1f} GiB usable of this node's "
            f"{gpu_bytes / GIB:.0f} GiB {config.hardware.gpu_name}: train with --peft lora, "
            "--deepspeed zero3, or a smaller --per_device_train_batch_size"
            + ("" if checkpointing else " or --gradient_checkpointing true")
            + "."
        )
    return plan


def describe(footprint, checkpointing: bool) -> str:
    parts = footprint.describe(checkpointing)
    return ", ".join(
        f"{name.removesuffix('_bytes').replace('_', ' ')} {parts[name] / GIB:.1f}" for name in PARTS
    )


PARTS = ("weights_bytes", "gradients_bytes", "optimizer_state_bytes", "activations_bytes")
