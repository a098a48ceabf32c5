"""How much GPU memory a training step of a task's model needs, per GPU: arithmetic on the model's
parameter counts and the task's activation counts, shared by the preflight (the plan's estimate
and refusal, trainer/preflight/model_plan.py) and the training processes (the gradient
checkpointing decision, trainer/training/gradient_checkpointing.py).

Checked against peak memory measured on CPU for tiny and whisper-small-sized models, with and
without LoRA (tests/processes/test_memory_estimate.py), and for tiny Llama and Qwen2 causal LMs
(bench/chat_memory.py; DPO with its reference model: bench/preference_memory.py); the tables
are in docs/benchmarks.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from trainer.settings.run_config import RunConfig
from trainer.tasks.base import Task
from trainer.tasks.lora_adapters import parameter_counts

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
    frozen_in_8bit: bool = False
    """`--load_in_8bit`: the frozen weights take one byte each."""
    frozen_in_4bit: bool = False
    """`--load_in_4bit`: the frozen weights take half a byte each (NF4; its double-quantized
    block constants add about 0.13 bits a weight, Dettmers et al. 2023, sec. 3)."""
    quantizable_parameters: int | None = None
    """The frozen weights 8- and 4-bit loading quantizes (`quantizable_weights`): the others
    (embeddings, the LM head, norms, biases) stay unquantized. None: all of them."""
    reference_parameters: int = 0
    """A frozen second model's weights beside the trained one (`Task.reference_parameters`),
    at the width of the frozen weights, partitioned under ZeRO-3 like them."""

    def weight_bytes(self) -> float:
        """Trainable weights in fp32 (16-bit under DeepSpeed's mixed precision, whose fp32
        master copy is optimizer state); frozen ones as loaded: fp32, 16-bit under
        DeepSpeed's mixed precision, one byte in 8 bits, half a byte in 4, where 8/4-bit
        loading quantizes them; the frozen weights it leaves (embeddings, LM head, norms)
        at the full width: PEFT's `prepare_model_for_kbit_training`, which LoRA on a
        quantized base runs, casts them from bf16 to fp32; a frozen reference model's
        weights as frozen ones of full width. ZeRO-3 partitions them all."""
        params, trainable = self.parameters, self.trainable_parameters
        deepspeed_16bit = self.mixed_precision and self.zero_stage is not None
        width = 2 if deepspeed_16bit else 4
        frozen = params - trainable
        quantized = 0
        if self.frozen_in_8bit or self.frozen_in_4bit:
            quantized = frozen if self.quantizable_parameters is None else min(
                self.quantizable_parameters, frozen)  # fmt: skip
        quantized_width = 1 if self.frozen_in_8bit else 0.52
        weights = width * (trainable + frozen - quantized) + quantized_width * quantized
        weights += width * self.reference_parameters
        return weights / (self.world_size if (self.zero_stage or 0) >= 3 else 1)

    def gradient_bytes(self) -> float:
        """One gradient per trainable weight, of its width; ZeRO-2 and -3 partition them."""
        width = 2 if self.mixed_precision and self.zero_stage is not None else 4
        partitioned = (self.zero_stage or 0) >= 2
        return width * self.trainable_parameters / (self.world_size if partitioned else 1)

    def optimizer_bytes(self) -> float:
        """AdamW's two fp32 moments (8 bytes a trainable weight), plus the fp32 master
        weights under DeepSpeed's mixed precision (12 in all; ZeRO paper, Rajbhandari et al.
        2020, sec. 3); partitioned from ZeRO-1 on, none on the GPU when offloaded."""
        if self.zero_stage is None:
            return 8.0 * self.trainable_parameters
        if self.optimizer_offloaded:
            return 0.0
        per_weight = 12 if self.mixed_precision else 8
        return per_weight * self.trainable_parameters / self.world_size

    def model_state_bytes(self) -> float:
        """Weights, gradients and optimizer state."""
        return self.weight_bytes() + self.gradient_bytes() + self.optimizer_bytes()

    def activation_bytes_per_sample(self, checkpointing: bool) -> float:
        """2 bytes per value under DeepSpeed's bf16/fp16 (16-bit weights and activations); 4 in
        fp32 and under autocast without DeepSpeed, which keeps fp32 inputs beside their 16-bit
        copies (autograd saved about the fp32 bytes, measured on whisper-tiny and -base)."""
        values = self.checkpointed_activation_values if checkpointing else self.activation_values
        return values * (2 if self.mixed_precision and self.zero_stage is not None else 4)

    def step_bytes(self, checkpointing: bool) -> float:
        per_sample = self.activation_bytes_per_sample(checkpointing)
        return self.model_state_bytes() + self.batch_size * per_sample

    def describe(self, checkpointing: bool) -> dict:
        """The estimate as the dry run shows it: bytes per GPU by part, and the total."""
        activations = self.batch_size * self.activation_bytes_per_sample(checkpointing)
        reference = {"reference_parameters": self.reference_parameters}
        return {
            **(reference if self.reference_parameters else {}),
            "weights_bytes": round(self.weight_bytes()),
            "gradients_bytes": round(self.gradient_bytes()),
            "optimizer_state_bytes": round(self.optimizer_bytes()),
            "activations_bytes": round(activations),
            "total_gib": round(self.step_bytes(checkpointing) / GIB, 2),
            "batch_size": self.batch_size,
            "gradient_checkpointing": checkpointing,
        }


def usable_gpu_bytes(gpu_bytes: int) -> float:
    return USABLE_GPU_FRACTION * gpu_bytes - RESERVED_GPU_BYTES


def gradient_checkpointing_needed(footprint: TrainingFootprint, gpu_bytes: int) -> bool:
    """True when a step does not fit in the GPU's usable memory without checkpointing, which costs
    about a third more compute (every layer's forward runs again during backward)."""
    return footprint.step_bytes(checkpointing=False) > usable_gpu_bytes(gpu_bytes)


def deepspeed_zero_settings(config: str | dict | None) -> tuple[int | None, bool]:
    """(ZeRO stage or None without DeepSpeed, whether the optimizer state is offloaded)."""
    if not config:
        return None, False
    if isinstance(config, str):
        config = json.loads(Path(config).read_text())
    zero = config.get("zero_optimization", {})
    offload = zero.get("offload_optimizer", {}).get("device", "none")
    return int(zero.get("stage", 0)), offload in ("cpu", "nvme")


def footprint_of(config: RunConfig, task: Task, model, world_size: int) -> TrainingFootprint | None:
    """The footprint of training `model` (loaded, or weightless on the meta device) as the
    run says, over `world_size` processes; None when the task gives no activation count."""
    training = config.training
    full, checkpointed = task.activation_values_per_sample(model)
    if full == 0:
        return None
    zero_stage, offloaded = deepspeed_zero_settings(training.deepspeed)
    trainable, total = parameter_counts(model)
    frozen_body = quantizable_weights(model)
    return TrainingFootprint(
        parameters=total,
        trainable_parameters=trainable,
        activation_values=full,
        checkpointed_activation_values=checkpointed,
        batch_size=training.per_device_train_batch_size,
        mixed_precision=bool(training.bf16 or training.fp16),
        zero_stage=zero_stage,
        optimizer_offloaded=offloaded,
        world_size=world_size,
        frozen_in_8bit=config.model.load_in_8bit,
        frozen_in_4bit=config.model.load_in_4bit,
        quantizable_parameters=frozen_body,
        reference_parameters=task.reference_parameters(model),
    )


def quantizable_weights(model) -> int:
    """The weights 8- and 4-bit loading quantizes in `model` (real or on the meta device):
    those of its linear layers but the output layer (transformers keeps the LM head unconverted;
    bitsandbytes replaces only `nn.Linear`) and LoRA's own adapters. Embeddings, norms and
    biases stay unquantized."""
    import torch

    output = model.get_output_embeddings()
    return sum(
        module.weight.numel()
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and module is not output and "lora_" not in name
    )
