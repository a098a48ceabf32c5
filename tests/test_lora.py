"""`--peft lora`: adapters on every task through the real `python -m trainer` with two
processes (ZeRO-2, and ZeRO-3 for images), the delivered merged model used by `pipeline()`
in a fresh process, a run killed after a checkpoint resuming to the weights of an
uninterrupted one, and the bad inputs the launcher refuses before launch."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification

from tests.helpers import (
    DEMO_SPEECH_FLAGS,
    checked_task,
    run_trainer,
    start_trainer,
    trainer_env,
    use_delivered_model,
    wait_until,
    with_start_hook,
)
from trainer.common.errors import UserError
from trainer.tasks.lora import parameter_counts

SENTIMENTS = ["negative", "neutral", "positive"]
TEXT_COLUMNS = ["--text_column_name", "sentence", "--label_column_name", "sentiment"]
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
def test_image_lora_zero3_delivers_a_merged_model_that_pipeline_uses(image_assets, tmp_path):
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


SLOW_STEPS = """
import time
from transformers import Trainer

step = Trainer.training_step

def slow_step(self, *args, **kwargs):
    time.sleep(0.5)  # the kill must land between a checkpoint and the last step
    return step(self, *args, **kwargs)

Trainer.training_step = slow_step
"""


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
    state = interrupted / "out" / "checkpoint-4" / "trainer_state.json"
    wait_until(state.exists, 300, "checkpoint-4")
    job.kill_node()
    _, log = job.finish()
    assert not delivered(interrupted).exists(), f"the kill came after the run ended:\n{log}"
    code, output = run_trainer(args, interrupted, env)
    assert code == 0, output[-3000:]
    assert "resuming from" in output and "checkpoint-" in output
    assert min(int(step) for step in re.findall(r"step (\d+)/12", output)) > 4
    expected = load_file(delivered(reference) / "model.safetensors")
    resumed = load_file(delivered(interrupted) / "model.safetensors")
    assert expected.keys() == resumed.keys()
    for name, weight in expected.items():
        torch.testing.assert_close(resumed[name], weight, rtol=0, atol=1e-6, msg=name)
