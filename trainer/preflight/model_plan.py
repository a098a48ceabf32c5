"""The model a run trains, planned before launch on a weightless copy (its config on the meta
device: a second, no weights read): `--load_in_8bit` only where bitsandbytes can run it, the
LoRA targets checked, the parameters counted and the per-GPU memory of a step estimated
(trainer/tasks/step_memory.py). A plan that cannot fit the GPUs (the node's, or a job spec's
machine type's) is refused in one line, not by running out of memory after the image pull, the
rendezvous and the model loading."""

from __future__ import annotations

from dataclasses import replace

from trainer.common.errors import UserError
from trainer.preflight.stop_grace import MICRO_BATCH_TIME, micro_batch_time
from trainer.settings.model_flags import ModelArguments
from trainer.settings.run_config import Hardware, RunConfig
from trainer.tasks.base import Task
from trainer.tasks.lora_adapters import expanded_targets, lora_targets, parameter_counts
from trainer.tasks.step_memory import (
    GIB,
    deepspeed_zero_settings,
    footprint_of,
    gradient_checkpointing_needed,
    usable_gpu_bytes,
)

EIGHT_BIT_CAPABILITY = (7, 5)
"""bitsandbytes' int8 matrix multiplication needs Turing or newer (T4, L4, A100, H100)."""


def check_eight_bit(model: ModelArguments, hardware: Hardware, zero_stage: int | None) -> None:
    """`--load_in_8bit` and `--load_in_4bit` need a CUDA GPU bitsandbytes supports and weights
    ZeRO-3 leaves whole (it cannot shard them here); checked before importing bitsandbytes (on
    CPU: pages of CUDA probing)."""
    if not model.quantized:
        return
    given = "--load_in_8bit" if model.load_in_8bit else "--load_in_4bit"
    capability = hardware.compute_capability
    if hardware.gpu_count == 0 or capability is None or capability < EIGHT_BIT_CAPABILITY:
        raise UserError(
            f"{given} needs a CUDA GPU of compute capability 7.5+ (T4, L4, A100, "
            f"H100); this is {hardware.gpu_name or 'a CPU-only node'}: leave it out (LoRA "
            "alone trains on any node)."
        )
    if zero_stage is not None and zero_stage >= 3:
        raise UserError(
            f"{given} with --deepspeed zero3: DeepSpeed cannot partition "
            f"{'8' if model.load_in_8bit else '4'}-bit weights here; use zero2 or no "
            "--deepspeed."
        )


def plan_model(config: RunConfig, task: Task, config_readable: bool = True) -> dict:
    """What the dry run shows of the model: parameters and, when the task estimates activations, a
    step's memory per GPU; on GPUs, a micro-batch's estimated time (trainer/preflight/
    stop_grace.py). UserError for bad LoRA settings, 8-bit where it cannot run, or a
    step that does not fit. `config_readable` false: a model whose config cannot be read here
    (a job spec's /gcs/ path) is not estimated; the node checks its LoRA settings."""
    check_eight_bit(
        config.model, config.hardware, deepspeed_zero_settings(config.training.deepspeed)[0]
    )
    try:
        model = task.weightless_model(local_only=config.launcher.skip_hub_check)
    except (OSError, ValueError) as error:  # not reachable from here (the Hub check says
        # more), or a config transformers cannot read
        if config.model.peft == "lora" and config_readable:
            raise UserError(
                f"--peft lora: cannot read the config of {config.model.model_name_or_path} "
                f"to check the adapter's target modules ({error})."
            ) from None
        return {"not_estimated": f"the model's config cannot be read here ({error})"}
    trainable, total = parameter_counts(model)
    plan: dict = {"trainable_parameters": trainable, "total_parameters": total}
    footprint = footprint_of(config, task, model, config.topology.world_size)
    checkpointing = config.training.gradient_checkpointing
    if footprint is not None:
        checkpointing = planned_checkpointing(config, footprint)
        lora = None if config.model.peft == "lora" else lora_parameters(config, task, model)
        plan["memory_per_gpu"] = check_fits(
            config, footprint, checkpointing, lora, task.reference_free_flag
        )
    plan[MICRO_BATCH_TIME] = micro_batch_time(config, task, model, checkpointing)
    return plan


def planned_checkpointing(config: RunConfig, footprint) -> bool:
    """Gradient checkpointing as the training processes will decide it: the user's choice, or
    on a GPU left open, on when a step would not fit without it."""
    gpu_bytes = config.hardware.gpu_memory_bytes
    if config.gradient_checkpointing_left_open and gpu_bytes:
        return gradient_checkpointing_needed(footprint, gpu_bytes)
    return config.training.gradient_checkpointing


def check_fits(
    config: RunConfig,
    footprint,
    checkpointing: bool,
    lora_trainable: int | None = None,
    reference_free: str | None = None,
) -> dict:
    """The step's memory per GPU, as the dry run shows it; UserError when it cannot fit, naming
    what would (`fitting_alternatives`), or else what might."""
    hardware = config.hardware
    gpu_bytes = hardware.gpu_memory_bytes
    needed = footprint.step_bytes(checkpointing)
    if gpu_bytes and needed > usable_gpu_bytes(gpu_bytes):
        would = fitting_alternatives(
            config, footprint, checkpointing, lora_trainable, reference_free
        )
        instead = (
            "what would fit: " + "; ".join(would)
            if would
            else "train with --peft lora, --deepspeed zero3, or a smaller "
            "--per_device_train_batch_size"
            + ("" if checkpointing else " or --gradient_checkpointing true")
        )
        raise UserError(
            f"a training step needs about {needed / GIB:.1f} GiB per GPU "
            f"({describe(footprint, checkpointing)}), "
            f"more than the {usable_gpu_bytes(gpu_bytes) / GIB:.1f} GiB usable of this node's "
            f"{gpu_bytes / GIB:.0f} GiB {hardware.gpu_name}: {instead}."
        )
    return footprint.describe(checkpointing)


MAX_NODES = 64
"""The most nodes a refusal's node count considers."""


def fitting_alternatives(
    config: RunConfig,
    footprint,
    checkpointing: bool,
    lora_trainable: int | None,
    reference_free: str | None = None,
) -> list[str]:
    """The changes, each alone on top of gradient checkpointing, with which a step fits: LoRA
    (`lora_trainable` adapter weights; a frozen reference model is then the base, not a copy),
    QLoRA (4-bit frozen weights, where bitsandbytes runs and ZeRO-3 does not partition), the
    task's flag that computes a reference's outputs before training (`reference_free`), and a
    full fine-tune under ZeRO-3 over the fewest nodes of this machine; each with its
    estimate."""
    usable = usable_gpu_bytes(config.hardware.gpu_memory_bytes)
    flag = "" if checkpointing else " --gradient_checkpointing true"
    options = [(flag.strip(), footprint)] if not checkpointing else []
    options += adapter_options(config, footprint, lora_trainable, flag)
    if footprint.reference_parameters and reference_free:
        options.append((f"{reference_free}{flag}", replace(footprint, reference_parameters=0)))
    would = [f"{change} (about {option.step_bytes(True) / GIB:.1f} GiB)"
             for change, option in options if option.step_bytes(True) <= usable]  # fmt: skip
    gpus = max(config.topology.nproc_per_node, 1)
    for nodes in range(config.topology.num_nodes, MAX_NODES + 1):
        sharded = replace(footprint, zero_stage=3, world_size=nodes * gpus)
        if sharded.step_bytes(True) <= usable:
            would.append(f"--deepspeed zero3 on {nodes} node(s) of {gpus} GPU(s){flag} (about "
                         f"{sharded.step_bytes(True) / GIB:.1f} GiB)")  # fmt: skip
            break
    return would


def adapter_options(config: RunConfig, footprint, lora_trainable: int | None, flag: str):
    """(change, its footprint) for LoRA and, where bitsandbytes can run, QLoRA."""
    if lora_trainable is None:
        return []
    lora = replace(footprint, trainable_parameters=lora_trainable, reference_parameters=0)
    options = [(f"--peft lora{flag}", lora)]
    if (footprint.zero_stage or 0) < 3 and config.hardware.gpu_count:
        qlora = replace(lora, frozen_in_4bit=True, frozen_in_8bit=False)
        options.append((f"--peft lora --load_in_4bit (QLoRA){flag}", qlora))
    return options


def lora_parameters(config: RunConfig, task: Task, model) -> int | None:
    """The adapter weights `--peft lora` would train on `model` (rank `--lora_r` on each of the
    task's default targets for its type); None when the task has none for it."""
    import torch

    try:
        targets = lora_targets(config.model, model.config.model_type, task.spec.lora_targets)
    except UserError:
        return None
    targets = expanded_targets(model, targets, task.head_modules(model))
    rank = config.model.lora_r
    return sum(
        rank * (module.in_features + module.out_features)
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in targets
    )


def describe(footprint, checkpointing: bool) -> str:
    parts = footprint.describe(checkpointing)
    return ", ".join(
        f"{name.removesuffix('_bytes').replace('_', ' ')} {parts[name] / GIB:.1f}" for name in PARTS
    )


PARTS = ("weights_bytes", "gradients_bytes", "optimizer_state_bytes", "activations_bytes")
