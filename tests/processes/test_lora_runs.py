"""`--peft lora` through the real `python -m trainer` with two processes on every task
(ZeRO-2, ZeRO-3 for images, plain DDP, a stream): the delivered merged model used by
`pipeline()` in a fresh process, and runs stopped or killed after a checkpoint resuming
there, one to the weights of an uninterrupted run. One uninterrupted text run
(`text_lora_zero2`) serves both the delivery checks and that comparison. What is checked
in this process (trainable weights, the plan, refusals): tests/unit/test_lora.py."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification

from tests.support.helpers import (
    DEMO_SPEECH_FLAGS,
    SLOW_STEPS,
    TEXT_COLUMNS,
    TrainerProcess,
    complete_from,
    make_shards_in_process,
    run_trainer,
    start_trainer,
    stopped_then_resumed,
    trainer_env,
    use_delivered_model,
    wait_while_running,
    with_start_hook,
)
from tests.support.lora_flags import LORA
from tests.support.sentiment_labels import SENTIMENTS
from trainer.storage.store import open_store

pytestmark = pytest.mark.slow

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


def zero2_args(text_assets) -> list[str]:
    """The text LoRA run under ZeRO-2: 12 steps, a checkpoint every 4."""
    return text_args(text_assets, "--deepspeed", "zero2", "--max_steps", "12",
                     "--save_steps", "4")  # fmt: skip


@dataclass
class Run:
    cwd: Path
    """Where it ran: its output is under cwd/out."""
    cache: Path
    """Its TRAINER_CACHE_DIR, which the runs that repeat it reuse."""


@pytest.fixture(scope="module")
def text_lora_zero2(text_assets, tmp_path_factory) -> Run:
    """`zero2_args`, uninterrupted, once for the module: the delivered model's checks read
    its output, and the kill-and-resume test's resumed weights must equal its weights."""
    root = tmp_path_factory.mktemp("text-lora-zero2")
    run = Run(root / "reference", root / "cache")
    run.cwd.mkdir()
    code, output = run_trainer(zero2_args(text_assets), run.cwd, trainer_env(run.cache))
    assert code == 0, output[-3000:]
    return run


def test_text_lora_zero2_delivers_a_merged_model_that_pipeline_uses(text_lora_zero2, text_assets):
    """Two processes under ZeRO-2: the adapter is saved beside the merged full model, whose
    query and value weights moved while the untargeted ones kept their pretrained values."""
    model_dir = delivered(text_lora_zero2.cwd)
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


def test_a_lora_run_killed_after_a_checkpoint_resumes_to_the_uninterrupted_weights(
    text_lora_zero2, text_assets, tmp_path
):
    """DeepSpeed ZeRO-2 checkpoints of a PEFT model hold the adapter and the engine's
    partitions of the trainable weights only (hiyouga/LlamaFactory#3205: a resume that
    expects the whole model fails or silently starts the adapter afresh). The
    uninterrupted run is `text_lora_zero2`."""
    args = zero2_args(text_assets)
    env = trainer_env(text_lora_zero2.cache)
    interrupted = tmp_path / "interrupted"
    interrupted.mkdir()
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
    expected = load_file(delivered(text_lora_zero2.cwd) / "model.safetensors")
    resumed = load_file(delivered(interrupted) / "model.safetensors")
    assert expected.keys() == resumed.keys()
    for name, weight in expected.items():
        torch.testing.assert_close(resumed[name], weight, rtol=0, atol=1e-6, msg=name)


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


def test_speech_lora_zero2_delivers_a_merged_model_and_the_adapter_alone(tmp_path, demo_assets):
    """Whisper with adapters on its attention projections, and the same run with
    `--save_adapter_only`: two independent runs, started together (each its own rendezvous
    port and cache)."""
    args = [
        "--task", "speech-recognition", "--model_name_or_path", str(demo_assets.model_dir),
        "--dataset_name", str(demo_assets.dataset_dir), *DEMO_SPEECH_FLAGS,
        "--deepspeed", "zero2", "--per_device_train_batch_size", "2", "--max_steps", "2",
        "--eval_strategy", "no", *LORA, *TWO_PROCESSES,
    ]  # fmt: skip
    merged_run, adapter_run = tmp_path / "merged", tmp_path / "adapter"
    merged_run.mkdir(), adapter_run.mkdir()
    merged = start_trainer(args, merged_run, trainer_env(merged_run / "cache"))
    adapter_only = start_trainer(
        [*args, "--save_adapter_only", "true"], adapter_run, trainer_env(adapter_run / "cache"),
    )  # fmt: skip
    try:
        code, output = merged.finish()
        assert code == 0, output[-3000:]
        clip = next(demo_assets.dataset_dir.rglob("*.wav"))
        used = use_delivered_model("speech-recognition", delivered(merged_run), clip)
        assert isinstance(used["pipeline_text"], str)
        assert (delivered(merged_run) / "adapter" / "adapter_config.json").is_file()
    finally:
        code, output = adapter_only.finish()
    assert code == 0, output[-3000:]
    files = {path.name for path in delivered(adapter_run).iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= files
    assert "model.safetensors" not in files and "adapter" not in files


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
    # Slow steps until the SIGTERM lands (a whole run takes seconds); the resume goes at speed.
    stopped, output = stopped_then_resumed(args, tmp_path, trainer_env(tmp_path / "cache"), 3, 12)
    saved = int(stopped.removeprefix("checkpoint-"))
    assert min(int(step) for step in re.findall(r"step (\d+)/12", output)) == saved + 1
    labels = use_delivered_model("text-classification", delivered(tmp_path), "a fine day")
    assert sorted(labels["labels"]) == SENTIMENTS
    # the adapters learnt through the recomputed layers: LoRA's B matrices start at zero
    adapter = load_file(delivered(tmp_path) / "adapter" / "adapter_model.safetensors")
    b_matrices = [weight for name, weight in adapter.items() if "lora_B" in name]
    assert b_matrices and all(weight.abs().max() > 0 for weight in b_matrices)


@pytest.fixture(scope="module")
def streamed_and_ddp(text_assets, tmp_path_factory) -> dict[str, tuple[Path, TrainerProcess]]:
    """Two independent text LoRA runs, started together (each its own rendezvous port and
    cache): on a stream of shards under ZeRO-2, and on the table under plain DDP."""
    model_dir, dataset_dir = text_assets
    streamed, ddp = tmp_path_factory.mktemp("lora-streamed"), tmp_path_factory.mktemp("lora-ddp")
    shards = streamed / "shards"
    assert make_shards_in_process(dataset_dir, shards, "--task", "text-classification",
                                  *TEXT_COLUMNS, "--shard_size_mb", "0.001") == 0  # fmt: skip
    streamed_args = [
        "--task", "text-classification", "--model_name_or_path", str(model_dir),
        "--dataset_name", str(shards), *TEXT_COLUMNS, "--streaming", "true", "--max_steps", "6",
        "--max_seq_length", "16", "--per_device_train_batch_size", "4", "--seed", "3",
        "--learning_rate", "1e-2", "--deepspeed", "zero2", "--eval_strategy", "no",
        *LORA, *TWO_PROCESSES,
    ]  # fmt: skip
    ddp_args = text_args(text_assets, "--deepspeed", "none", "--max_steps", "4",
                         "--eval_strategy", "no")  # fmt: skip
    runs = {
        name: (cwd, start_trainer(args, cwd, trainer_env(cwd / "cache")))
        for name, cwd, args in [("streamed", streamed, streamed_args), ("ddp", ddp, ddp_args)]
    }  # fmt: skip
    yield runs
    for _, run in runs.values():
        run.finish()


def test_a_streamed_lora_run_delivers_a_merged_model(streamed_and_ddp):
    """LoRA on a stream (a shard set, `--streaming` with `--max_steps`): the adapters train
    on the examples as they stream by, and the merged model is delivered."""
    cwd, run = streamed_and_ddp["streamed"]
    code, output = run.finish()
    assert code == 0, output[-3000:]
    assert "step 6/6" in output
    labels = use_delivered_model("text-classification", delivered(cwd), "a fine day")
    assert sorted(labels["labels"]) == SENTIMENTS
    adapter = load_file(delivered(cwd) / "adapter" / "adapter_model.safetensors")
    assert any(weight.abs().max() > 0 for name, weight in adapter.items() if "lora_B" in name)


def test_lora_under_plain_ddp_delivers_a_merged_model(streamed_and_ddp):
    """Without DeepSpeed the two processes are a DDP group: the frozen base weights take
    no part in its gradient all-reduce, the adapters and the head do."""
    cwd, run = streamed_and_ddp["ddp"]
    code, output = run.finish()
    assert code == 0, output[-3000:]
    labels = use_delivered_model("text-classification", delivered(cwd), "a fine day")
    assert sorted(labels["labels"]) == SENTIMENTS
