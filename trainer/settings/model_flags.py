"""The model flags every task reads: `--model_name_or_path`, its loading options, and how
much of it trains (`--peft lora` and its settings, trainer/tasks/lora_adapters.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from trainer.common.flag_fields import flag


@dataclass(frozen=True)
class ModelArguments:
    model_name_or_path: str | None = flag(
        None,
        "Hub id or local folder of the pretrained model. Leave it and "
        "--dataset_name out to run the built-in demo.",
    )
    cache_dir: str | None = flag(None, "Where downloaded models and datasets are cached.")
    attn_implementation: str | None = flag(
        None,
        "Attention kernels: sdpa (default where supported), eager; flash_attention_2 needs "
        "flash-attn, which this image lacks.",
    )
    peft: Literal["none", "lora"] = flag(
        "none",
        "lora: train low-rank adapters (PEFT), deliver the merged model; none: every weight.",
        nargs="?",
        const="lora",  # `--peft` alone, as trl-jobs writes it: TRL's --use_peft
    )
    lora_r: int = flag(16, "LoRA rank (with --peft lora).")
    lora_alpha: int = flag(32, "LoRA scaling numerator: updates are scaled by alpha/r.")
    lora_dropout: float = flag(0.05, "Dropout on the LoRA branch's input.")
    lora_target_modules: str | None = flag(
        None,
        "Names of the modules that get adapters, comma- or space-separated, or all-linear "
        "(default: the task's for the model type, docs/tasks.md).",
    )
    load_in_8bit: bool = flag(
        False,
        "Load the frozen base model in 8 bits (bitsandbytes; with --peft lora, on a "
        "CUDA GPU of compute capability 7.5+).",
    )
    load_in_4bit: bool = flag(
        False,
        "Load the frozen base model in 4 bits, NF4 (QLoRA; bitsandbytes, with --peft lora, "
        "on a CUDA GPU of compute capability 7.5+).",
    )
    save_adapter_only: bool = flag(
        False,
        "With --peft lora, deliver only the adapter and processor, not the merged full model.",
    )

    def __post_init__(self) -> None:
        if self.lora_r <= 0:
            raise ValueError("--lora_r must be positive.")
        if not 0 <= self.lora_dropout < 1:
            raise ValueError("--lora_dropout must be in [0, 1).")
        lora_only = [
            name
            for name, value in (
                ("--lora_target_modules", self.lora_target_modules),
                ("--load_in_8bit", self.load_in_8bit),
                ("--load_in_4bit", self.load_in_4bit),
                ("--save_adapter_only", self.save_adapter_only),
            )
            if value
        ]
        if self.peft == "none" and lora_only:
            raise ValueError(f"{', '.join(lora_only)} needs --peft lora.")
        if self.load_in_8bit and self.load_in_4bit:
            raise ValueError("--load_in_8bit and --load_in_4bit: give one.")

    @property
    def quantized(self) -> bool:
        """The frozen base is loaded in 8 or 4 bits."""
        return self.load_in_8bit or self.load_in_4bit

    def target_modules(self) -> list[str] | None:
        if not self.lora_target_modules:
            return None
        return [name.strip() for name in self.lora_target_modules.split(",") if name.strip()]
