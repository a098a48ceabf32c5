"""`--peft lora`: adapters on every task through the real `python -m trainer` with two
processes (ZeRO-2, and ZeRO-3 for images), the delivered merged model used by `pipeline()`
in a fresh process, a run killed after a checkpoint resuming to the weights of an
uninterrupted one, and the bad inputs the launcher refuses before launch."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification, WhisperForConditionalGeneration

from tests.support.helpers import (
    DEMO_SPEECH_FLAGS,
    SLOW_STEPS,
    TEXT_COLUMNS,
    assert_planned,
    assert_refused,
    checked_task,
    complete_from,
    make_shards_in_process,
    resolved,
    run_trainer,
    start_trainer,
    trainer_env,
    use_delivered_model,
    wait_while_running,
    with_start_hook,
)
from trainer.common.errors import UserError
from trainer.config.deepspeed import PRESETS_DIR
from trainer.preflight.model_plan import PARTS
from trainer.settings.run_config import Hardware
from trainer.storage.store import open_store
from trainer.tasks import build_task
from trainer.tasks.lora_adapters import parameter_counts
from trainer.tasks.step_memory import GIB, footprint_of, usable_gpu_bytes
from trainer.tasks.whisper_sizes import whisper_config

SENTIMENTS = ["negative", "neutral", "positive"]
LORA = ["--peft", "lora", "--lora_r", "4", "--lora_alpha", "8", "--lora_dropout", "0"]
TWO_PROCESSES = ["--nproc_per_node", "2", "--output_dir", "out", "--report_to", "none"]


def text_args(text_assets, *extra: str) -> list[str]:
    model_dir, dataset_dir = text_assets
    return [
        "--task", "text-classification", "--model_name_or_path", str(model_dir),
        "--dataset_name", str(dataset_dir), *TEXT_COLUMNS, "--max_seq_length", "16",
        "--per_device_train_batch_size", "4", "--learning_rate", "1e-2", "--seed", "3",
        *LORA, *TWO_PROCESSES, *extra,
    ]  # fmt: skip


def delivered(cwd: Path) -> Path:
    return cwd / "out" / "model"


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


@pytest.mark.slow
def test_text_lora_zero2_delivers_a_merged_model_that_pipeline_uses(text_assets, tmp_path):
    """Two processes under ZeRO-2: the adapter is saved beside the merged full model, whose
    query and value weights moved while the untargeted ones kept their pretrained values."""
    cwd = tmp_path / "run"
    cwd.mkdir()
    args = text_args(text_assets, "--deepspeed", "zero2", "--max_steps", "6")
    code, output = run_trainer(args, cwd, trainer_env(tmp_path / "cache"))
    assert code == 0, output[-3000:]
    model_dir = delivered(cwd)
    assert not (model_dir / "adapter_config.json").exists(), "the model is the merged one"
    assert (model_dir / "adapter" / "adapter_model.safetensors").is_file()
    merged = load_file(model_dir / "model.safetensors")
    assert not any("lora" in name for name in merged)
    pretrained = AutoModelForSequenceClassification.from_pretrained(text_assets[0]).state_dict()
    layer = "bert.encoder.layer.0.attention.self"
    assert not torch.equal(merged[f"{layer}.query.weight"], pretrained[f"{layer}.query.weight"])
    assert not torch.equal(merged[f"{layer}.value.weight"], pretrained[f"{layer}.value.weight"])
    assert torch.equal(merged[f"{layer}.key.weight"], pretrained[f"{layer}.key.weight"])
    used = use_delivered_model("text-classification", model_dir, "Net sales rose last year .")
    assert sorted(used["labels"]) == SENTIMENTS


@pytest.mark.slow
def test_image_lora_zero3_delivers_a_merged_model_and_resumes(image_assets, tmp_path):
    model_dir, dataset_dir = image_assets
    cwd = tmp_path / "run"
    cwd.mkdir()
    args = [
        "--task", "image-classification", "--model_name_or_path", str(model_dir),
        "--dataset_name", str(dataset_dir), "--max_bad_examples", "2", "--deepspeed", "zero3",
        "--per_device_train_batch_size", "4", "--max_steps", "4", *LORA, *TWO_PROCESSES,
    ]  # fmt: skip
    code, output = run_trainer(args, cwd, trainer_env(tmp_path / "cache"))
    assert code == 0, output[-3000:]
    assert (delivered(cwd) / "adapter" / "adapter_config.json").is_file()
    image = next((dataset_dir / "test").rglob("*.png"))
    used = use_delivered_model("image-classification", delivered(cwd), image)
    assert len(used["labels"]) == len([p for p in (dataset_dir / "train").iterdir()])

    # a longer run resumes from the ZeRO-3 checkpoint of adapters and head: the engine's
    # partitions hold the trainable weights only (hiyouga/LlamaFactory#3205)
    longer = [*args]
    longer[args.index("--max_steps") + 1] = "6"
    code, output = run_trainer(longer, cwd, trainer_env(tmp_path / "cache"))
    assert code == 0, output[-3000:]
    assert "resuming from out/checkpoint-4" in output
    assert re.findall(r"step (\d+)/6", output) == ["5", "6"], "training restarted from scratch"


@pytest.mark.slow
def test_speech_lora_zero2_delivers_a_merged_model_and_the_adapter_alone(tmp_path, demo_assets):
    """Whisper with adapters on its attention projections, then `--save_adapter_only`."""
    args = [
        "--task", "speech-recognition", "--model_name_or_path", str(demo_assets.model_dir),
        "--dataset_name", str(demo_assets.dataset_dir), *DEMO_SPEECH_FLAGS,
        "--deepspeed", "zero2", "--per_device_train_batch_size", "2", "--max_steps", "2",
        "--eval_strategy", "no", *LORA, *TWO_PROCESSES,
    ]  # fmt: skip
    merged_run, adapter_run = tmp_path / "merged", tmp_path / "adapter"
    merged_run.mkdir(), adapter_run.mkdir()
    code, output = run_trainer(args, merged_run, trainer_env(tmp_path / "cache"))
    assert code == 0, output[-3000:]
    clip = next(demo_assets.dataset_dir.rglob("*.wav"))
    used = use_delivered_model("speech-recognition", delivered(merged_run), clip)
    assert isinstance(used["pipeline_text"], str)
    assert (delivered(merged_run) / "adapter" / "adapter_config.json").is_file()

    code, output = run_trainer([*args, "--save_adapter_only", "true"], adapter_run,
                               trainer_env(tmp_path / "cache"))  # fmt: skip
    assert code == 0, output[-3000:]
    files = {path.name for path in delivered(adapter_run).iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= files
    assert "model.safetensors" not in files and "adapter" not in files


@pytest.mark.slow
def test_a_lora_run_killed_after_a_checkpoint_resumes_to_the_uninterrupted_weights(
    text_assets, tmp_path
):
    """DeepSpeed ZeRO-2 checkpoints of a PEFT model hold the adapter and the engine's
    partitions of the trainable weights only (hiyouga/LlamaFactory#3205: a resume that
    expects the whole model fails or silently starts the adapter afresh)."""
    args = text_args(text_assets, "--deepspeed", "zero2", "--max_steps", "12",
                     "--save_steps", "4")  # fmt: skip
    env = trainer_env(tmp_path / "cache")
    reference, interrupted = tmp_path / "reference", tmp_path / "interrupted"
    reference.mkdir(), interrupted.mkdir()
    code, output = run_trainer(args, reference, env)
    assert code == 0, output[-3000:]

    job = start_trainer(args, interrupted, with_start_hook(env, tmp_path / "hooks", SLOW_STEPS))
    # Complete (its manifest written), not merely saved: a checkpoint without a manifest is
    # rightly not resumed from, and the kill can land between the two.
    checkpoints = open_store(str(interrupted / "out"))
    wait_while_running([job], lambda: complete_from(checkpoints, 4), 300,
                       "a complete checkpoint of step 4 or later")  # fmt: skip
    job.kill_node()
    _, log = job.finish()
    assert "final model" not in log, f"the kill came after the run ended:\n{log}"
    code, output = run_trainer(args, interrupted, env)
    assert code == 0, output[-3000:]
    assert "resuming from" in output and "checkpoint-" in output
    assert min(int(step) for step in re.findall(r"step (\d+)/12", output)) > 4
    expected = load_file(delivered(reference) / "model.safetensors")
    resumed = load_file(delivered(interrupted) / "model.safetensors")
    assert expected.keys() == resumed.keys()
    for name, weight in expected.items():
        torch.testing.assert_close(resumed[name], weight, rtol=0, atol=1e-6, msg=name)


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


@pytest.mark.slow
def test_a_lora_run_with_gradient_checkpointing_saves_on_sigterm_and_resumes_there(
    text_assets, tmp_path
):
    """LoRA composed with what a Spot job uses: gradient checkpointing (PEFT's frozen inputs
    must still carry gradients through the recomputed layers), a save by time, and the
    SIGTERM checkpoint, resumed by the next run, which then delivers a merged model."""
    args = text_args(
        text_assets, "--deepspeed", "zero2", "--max_steps", "12", "--save_steps", "100",
        "--gradient_checkpointing", "true", "--save_interval_minutes", "60",
        "--stop_grace_seconds", "25", "--logging_steps", "1",
    )  # fmt: skip
    env = with_start_hook(trainer_env(tmp_path / "cache"), tmp_path / "hooks", SLOW_STEPS)
    job = start_trainer(args, tmp_path, env)
    wait_while_running([job], lambda: "step 3/12" in job.log.read_text(), 300, "step 3")
    job.terminate()
    code, log = job.finish()
    assert code == 75, log[-3000:]
    (stopped,) = re.findall(r"^preempted: .*?(checkpoint-(\d+))", log, re.M)
    assert 3 <= int(stopped[1]) < 12 and (tmp_path / "out" / stopped[0]).is_dir(), log[-2000:]

    code, output = run_trainer(args, tmp_path, env)
    assert code == 0, output[-3000:]
    assert f"resuming from out/{stopped[0]}" in output
    assert min(int(step) for step in re.findall(r"step (\d+)/12", output)) == int(stopped[1]) + 1
    labels = use_delivered_model("text-classification", delivered(tmp_path), "a fine day")
    assert sorted(labels["labels"]) == SENTIMENTS
    # the adapters learnt through the recomputed layers: LoRA's B matrices start at zero
    adapter = load_file(delivered(tmp_path) / "adapter" / "adapter_model.safetensors")
    b_matrices = [weight for name, weight in adapter.items() if "lora_B" in name]
    assert b_matrices and all(weight.abs().max() > 0 for weight in b_matrices)


@pytest.mark.slow
def test_a_streamed_lora_run_delivers_a_merged_model(text_assets, tmp_path):
    """LoRA on a stream (a shard set, `--streaming` with `--max_steps`): the adapters train
    on the examples as they stream by, and the merged model is delivered."""
    model_dir, dataset_dir = text_assets
    shards = tmp_path / "shards"
    assert make_shards_in_process(dataset_dir, shards, "--task", "text-classification",
                                  *TEXT_COLUMNS, "--shard_size_mb", "0.001") == 0  # fmt: skip
    args = [
        "--task", "text-classification", "--model_name_or_path", str(model_dir),
        "--dataset_name", str(shards), *TEXT_COLUMNS, "--streaming", "true", "--max_steps", "6",
        "--max_seq_length", "16", "--per_device_train_batch_size", "4", "--seed", "3",
        "--learning_rate", "1e-2", "--deepspeed", "zero2", "--eval_strategy", "no",
        *LORA, *TWO_PROCESSES,
    ]  # fmt: skip
    code, output = run_trainer(args, tmp_path, trainer_env(tmp_path / "cache"))
    assert code == 0, output[-3000:]
    assert "step 6/6" in output
    labels = use_delivered_model("text-classification", delivered(tmp_path), "a fine day")
    assert sorted(labels["labels"]) == SENTIMENTS
    adapter = load_file(delivered(tmp_path) / "adapter" / "adapter_model.safetensors")
    assert any(weight.abs().max() > 0 for name, weight in adapter.items() if "lora_B" in name)


@pytest.mark.slow
def test_lora_under_plain_ddp_delivers_a_merged_model(text_assets, tmp_path):
    """Without DeepSpeed the two processes are a DDP group: the frozen base weights take
    no part in its gradient all-reduce, the adapters and the head do."""
    args = text_args(text_assets, "--deepspeed", "none", "--max_steps", "4",
                     "--eval_strategy", "no")  # fmt: skip
    code, output = run_trainer(args, tmp_path, trainer_env(tmp_path / "cache"))
    assert code == 0, output[-3000:]
    labels = use_delivered_model("text-classification", delivered(tmp_path), "a fine day")
    assert sorted(labels["labels"]) == SENTIMENTS
