"""What a delivered model says about itself, read from where it was delivered (no download):
that it is complete (its manifest, written last by trainer/storage/checkpoints.py
`publish_model`), its task (its own config.json, as training and the server infer it), and,
for a merged `--peft lora` model, the base checkpoint its adapter names
(`adapter/adapter_config.json`, trainer/training/adapter_merge.py). A full fine-tune records no
base checkpoint in the folder (transformers 5 saves no `_name_or_path`): the caller says it.
The final metric is not in the folder either (the Trainer writes `eval_results.json` into the
run's output directory, after the model is delivered)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from trainer.common.errors import UserError
from trainer.storage.checkpoints import MANIFEST
from trainer.storage.store import Store
from trainer.tasks.lora_adapters import ADAPTER_DIRNAME
from trainer.tasks.registry import task_of_model


@dataclass(frozen=True)
class DeliveredModel:
    task: str
    adapter_base: str | None
    """The base checkpoint of a merged LoRA model; None for a full fine-tune."""


def read_delivered_model(store: Store) -> DeliveredModel:
    """The model at `store`, or UserError when it is not a complete delivered model."""
    if store.read_text(MANIFEST) is None:
        raise UserError(
            f"{store.uri} holds no delivered model: no {MANIFEST} (a run writes it last, once "
            "every file of the model is uploaded)"
        )
    config = json_object(store.read_text("config.json"))
    task = task_of_model(config) if config is not None else None
    if task is None:
        raise UserError(f"{store.uri}/config.json names no task this project trains or serves")
    adapter = json_object(store.child(ADAPTER_DIRNAME).read_text("adapter_config.json")) or {}
    return DeliveredModel(task, adapter.get("base_model_name_or_path") or None)


def json_object(text: str | None) -> dict | None:
    try:
        found = json.loads(text) if text is not None else None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None
