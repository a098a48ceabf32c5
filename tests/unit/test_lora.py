"""`--peft lora` in this process: which weights train, the bad target modules, and the
plan before launch (trainable parameters, the memory estimate and what it refuses). Real
two-process LoRA runs: tests/processes/test_lora_runs.py."""

from __future__ import annotations

import json
import shutil
import sys

import pytest
import torch
from transformers import WhisperForConditionalGeneration

from tests.support.helpers import (
    TEXT_COLUMNS,
    assert_planned,
    assert_refused,
    checked_task,
    resolved,
)
from tests.support.lora_flags import LORA
from trainer.common.errors import UserError
from trainer.config.deepspeed import PRESETS_DIR
from trainer.preflight.model_plan import PARTS
from trainer.settings.run_config import Hardware
from trainer.tasks import build_task
from trainer.tasks.lora_adapters import parameter_counts
from trainer.tasks.speech_recognition.whisper_sizes import whisper_config
from trainer.tasks.step_memory import GIB, footprint_of, usable_gpu_bytes


def test_lora_trains_adapters_and_the_head_only(text_assets):
    task = checked_task("text-classification", *text_assets, *TEXT_COLUMNS, *LORA)
    model, _ = task.build_model_and_processor()
    _, total = parameter_counts(model)
    adapted = task.trained_model(model)
    trainable = {name for name, p in adapted.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name or ".classifier." in name for name in trainable)
    assert any("query.lora_A" in name for name in trainable)
    assert any("value.lora_B" in name for name in trainable)
    assert not any("key.lora" in name for name in trainable), "only query and value by default"
    trained, total_with_adapters = parameter_counts(adapted)
    assert trained < total_with_adapters / 5 and total_with_adapters > total


def test_unknown_target_module_is_one_line_naming_the_linear_layers(text_assets):
    task = checked_task(
        "text-classification", *text_assets, *TEXT_COLUMNS, *LORA,
        "--lora_target_modules", "query,qkv_proj",
    )  # fmt: skip
    with pytest.raises(UserError, match=r"qkv_proj names no linear layer of bert; .*query"):
        task.weightless_model()


# Before launch: the plan, and what it refuses ------------------------------------------------


def test_the_plan_counts_trainable_parameters_and_estimates_memory(dry_run):
    full = assert_planned(dry_run())["model"]
    lora = assert_planned(dry_run(*LORA))["model"]
    assert lora["total_parameters"] > full["total_parameters"] == full["trainable_parameters"]
    assert 0 < lora["trainable_parameters"] < full["trainable_parameters"] / 5
    memory, lora_memory = full["memory_per_gpu"], lora["memory_per_gpu"]
    assert 0 < lora_memory["optimizer_state_bytes"] < memory["optimizer_state_bytes"] / 5
    assert lora_memory["activations_bytes"] == memory["activations_bytes"] > 0
    total = sum(memory[part] for part in PARTS)
    assert memory["total_gib"] == pytest.approx(total / GIB, abs=0.01)


def test_an_unknown_target_module_is_refused_before_launch(dry_run):
    refused = dry_run(*LORA, "--lora_target_modules", "query,attn")
    assert_refused(refused, "--lora_target_modules: attn names no linear layer of bert")


def test_a_model_type_without_default_targets_needs_them_named(dry_run, text_assets, tmp_path):
    model = tmp_path / "distilbert"
    shutil.copytree(text_assets[0], model)
    (model / "config.json").write_text(json.dumps({"model_type": "distilbert", "dim": 32,
        "n_layers": 1, "n_heads": 2, "hidden_dim": 64, "vocab_size": 100}))  # fmt: skip
    refused = dry_run(*LORA, model=model)
    assert_refused(refused, "no default target modules for model type 'distilbert'")
    named = assert_planned(dry_run(*LORA, "--lora_target_modules", "q_lin,v_lin", model=model))
    assert named["model"]["trainable_parameters"] < named["model"]["total_parameters"]


def test_8bit_on_a_node_without_a_gpu_is_refused_before_bitsandbytes_loads(dry_run):
    refused = dry_run(*LORA, "--load_in_8bit", "true")
    assert_refused(refused, "--load_in_8bit needs a CUDA GPU of compute capability 7.5+")
    assert "bitsandbytes" not in sys.modules
    assert_refused(dry_run("--load_in_8bit", "true"), "--load_in_8bit needs --peft lora")


def test_a_plan_that_cannot_fit_the_gpu_is_refused_with_what_would(dry_run, monkeypatch):
    small = Hardware(1, "NVIDIA L4", (8, 9), 8, gpu_memory_bytes=3 * GIB)
    monkeypatch.setattr("trainer.node.machine.detect_hardware", lambda: small)
    assert_planned(dry_run("--per_device_train_batch_size", "8"))
    refused = dry_run("--per_device_train_batch_size", "100000")
    assert_refused(refused, "GiB usable of this node's 3 GiB NVIDIA L4: train with --peft lora")


@pytest.mark.parametrize(
    ("peft", "deepspeed", "world_size", "fits"),
    [("none", "zero2", 1, False), ("none", "zero3", 8, True), ("lora", "zero2", 1, True)],
)
def test_whisper_large_v3_on_one_l4_fits_with_lora(peft, deepspeed, world_size, fits):
    """The recipe's plan on the real large-v3 dimensions (weightless): a full fine-tune on
    one 24 GB L4 does not fit even with checkpointing; LoRA does, as does ZeRO-3 over 8."""
    argv = ["whisper-large-v3-lora.yaml", "--peft", peft, "--deepspeed", deepspeed]
    config = resolved(argv, Hardware(1, "NVIDIA L4", (8, 9), 8, gpu_memory_bytes=24 * GIB))
    assert config.training.deepspeed == str(PRESETS_DIR / f"{deepspeed}.json")
    task = build_task(config)
    with torch.device("meta"):
        model = WhisperForConditionalGeneration(whisper_config("large-v3"))
    footprint = footprint_of(config, task, task.trained_model(model), world_size)
    assert config.training.gradient_checkpointing and config.training.bf16
    assert (footprint.step_bytes(checkpointing=True) < usable_gpu_bytes(24 * GIB)) == fits
