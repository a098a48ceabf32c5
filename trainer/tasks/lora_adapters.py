"""`--peft lora`: low-rank adapters (PEFT) on a frozen pretrained model, and the merge that turns
a trained adapter back into a plain full model for delivery.

The launcher checks the adapter's target modules on a weightless copy of the model (built on
the meta device from its config, in a second), so an unknown module name or a model type
without default targets is one line before launch, not a failure after the weights loaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from trainer.common.errors import UserError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from transformers import PreTrainedModel

    from trainer.settings.model_flags import ModelArguments

ADAPTER_DIRNAME = "adapter"
"""Where the delivered model folder keeps the trained adapter beside the merged model."""


def lora_targets(
    model_args: ModelArguments, model_type: str, defaults: Mapping[str, tuple[str, ...]]
) -> list[str]:
    """The module names that get adapters: `--lora_target_modules`, else the task's defaults
    for the model type (its spec's `lora_targets`); UserError when neither names any."""
    given = model_args.target_modules()
    if given:
        return given
    if model_type not in defaults:
        raise UserError(
            f"--peft lora: no default target modules for model type {model_type!r} (defaults "
            f"exist for {', '.join(defaults) or 'none'}); name them with "
            "--lora_target_modules, e.g. --lora_target_modules q_proj,v_proj."
        )
    return list(defaults[model_type])


ALL_LINEAR = "all-linear"
"""PEFT's (and TRL's) shorthand for every linear layer but the output layer."""


def expanded_targets(model, targets: list[str], heads: list[str] | None = None) -> list[str]:
    """`targets`, with `all-linear` as PEFT reads it: the names of every linear layer of
    `model` but its output layer (the LM head) and the `heads` trained in full beside the
    adapters (a classifier)."""
    if [target.lower() for target in targets] != [ALL_LINEAR]:
        return targets
    import torch

    output, skipped = model.get_output_embeddings(), set(heads or ())
    return sorted({
        name.rsplit(".", 1)[-1]
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and module is not output
        and name.split(".")[0] not in skipped
    })  # fmt: skip


def check_targets(model: PreTrainedModel, targets: list[str]) -> None:
    """Every target names at least one linear layer of `model` (as PEFT matches them: the
    last parts of a module's dotted name); UserError listing the candidates otherwise. PEFT
    itself refuses only when no target matches, and silently skips the others."""
    import torch

    linear = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
    unknown = [
        target
        for target in targets
        if not any(name == target or name.endswith(f".{target}") for name in linear)
    ]
    if unknown:
        leaves = sorted({name.rsplit(".", 1)[-1] for name in linear})
        raise UserError(
            f"--lora_target_modules: {', '.join(unknown)} names no linear layer of "
            f"{model.config.model_type}; its linear layers are {', '.join(leaves)}."
        )


def weightless(
    model_class, path: str, cache_dir: str | None, local_only: bool = False, **config_kwargs
):
    """`model_class` built from `path`'s config on the meta device: module names and
    parameter counts without loading (or allocating) a weight."""
    import torch
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(
        path, cache_dir=cache_dir, local_files_only=local_only, **config_kwargs
    )
    with torch.device("meta"):  # an Auto class builds through from_config, others directly
        build = getattr(model_class, "from_config", model_class)
        return build(config)


def with_lora(
    model: PreTrainedModel,
    model_args: ModelArguments,
    defaults: Mapping[str, tuple[str, ...]],
    modules_to_save: list[str] | None = None,
):
    """`model` frozen, with LoRA adapters on its target modules (`--lora_target_modules`, else
    `defaults` for its type); `modules_to_save`: modules trained in full beside them (a
    classifier head fresh for the labels)."""
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    targets = lora_targets(model_args, model.config.model_type, defaults)
    targets = expanded_targets(model, targets, modules_to_save)
    check_targets(model, targets)
    if model_args.quantized:
        # fp32 layer norms and output head, and inputs that carry gradients into the
        # frozen 8-bit layers (PEFT's recipe for quantized bases)
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    config = LoraConfig(
        r=model_args.lora_r,
        lora_alpha=model_args.lora_alpha,
        lora_dropout=model_args.lora_dropout,
        target_modules=targets,
        modules_to_save=modules_to_save or None,
    )
    return get_peft_model(model, config)


def merge_adapter(base: PreTrainedModel, adapter_dir: Path) -> PreTrainedModel:
    """`base` (the pretrained model as the task loaded it, in full precision) with the adapter in
    `adapter_dir` merged in: a plain model, loading without PEFT."""
    from peft import PeftModel

    return PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()


def parameter_counts(model) -> tuple[int, int]:
    """(trainable, total) parameters, counted on real or meta tensors alike."""
    total = sum(parameter.numel() for parameter in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, total


def eight_bit_loading(model_args: ModelArguments) -> dict:
    """`from_pretrained` arguments loading the frozen base in 8 bits (`--load_in_8bit`) or in 4
    (`--load_in_4bit`: QLoRA's NF4 with double quantization, computing in bf16; Dettmers et al.
    2023) on this process's GPU (the launcher refused either without a suitable GPU); none
    otherwise."""
    if not model_args.quantized:
        return {}
    import os

    import torch
    from transformers import BitsAndBytesConfig

    if model_args.load_in_4bit:
        quantization = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16,
        )  # fmt: skip
    else:
        quantization = BitsAndBytesConfig(load_in_8bit=True)
    return {
        "quantization_config": quantization,
        "device_map": {"": int(os.environ.get("LOCAL_RANK", "0"))},
    }
