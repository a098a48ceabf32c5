"""The model flags every task reads (`--model_name_or_path` and its loading options)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ModelArguments:
    model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "Hub id or local folder of the pretrained model. Leave it and "
            "--dataset_name out to run the built-in demo."
        },
    )
    cache_dir: str | None = field(
        default=None, metadata={"help": "Where downloaded models and datasets are cached."}
    )
    attn_implementation: str | None = field(
        default=None,
        metadata={
            "help": "Attention kernels: sdpa (PyTorch's fused attention; the default for every "
            "model that supports it), eager, or flash_attention_2 (needs the flash-attn package)."
        },
    )
