"""The delivered model of a `--peft lora` run: the Trainer saved the adapter (gathered from
every rank under ZeRO-3); here it is merged into the pretrained weights, so that `model/`
is a plain full model again, loading with `from_pretrained` and `pipeline()` without PEFT.
The adapter stays beside it in `model/adapter/`, or alone with `--save_adapter_only`.
"""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from pathlib import Path

from transformers.integrations.deepspeed import set_hf_deepspeed_config, unset_hf_deepspeed_config

from trainer.tasks.base import Task
from trainer.tasks.lora_adapters import ADAPTER_DIRNAME, merge_adapter

PEFT_FILES = ("adapter_config.json", "adapter_model.safetensors", "README.md")
"""What PEFT's `save_pretrained` writes (README.md: its model card of the adapter)."""


def merge_delivered_adapter(task: Task, final_dir: Path, args) -> None:
    """On the process writing the model, after `Trainer.save_model(final_dir)`: the adapter moved
    to `final_dir/adapter`, the merged model saved in `final_dir` (beside its processor). The
    weights are reloaded in full precision on the CPU: the training copy may be 8-bit or ZeRO-3
    partitioned, and merging into it would change the model the final evaluation scores."""
    if task.model_args.peft != "lora" or task.model_args.save_adapter_only:
        return
    adapter_dir = final_dir / ADAPTER_DIRNAME
    adapter_dir.mkdir(exist_ok=True)
    for name in PEFT_FILES:
        if (final_dir / name).exists():
            shutil.move(final_dir / name, adapter_dir / name)
    with without_zero3_init(args):
        merged = merge_adapter(task.model_to_merge_into(), adapter_dir)
    merged.save_pretrained(final_dir)


@contextmanager
def without_zero3_init(args):
    """Loading outside DeepSpeed ZeRO-3: while its config is registered (TrainingArguments
    did that), `from_pretrained` partitions the model over the ranks, a collective the
    other ranks, already past delivery, never join."""
    unset_hf_deepspeed_config()
    try:
        yield
    finally:
        if getattr(args, "hf_deepspeed_config", None) is not None:
            set_hf_deepspeed_config(args.hf_deepspeed_config)
