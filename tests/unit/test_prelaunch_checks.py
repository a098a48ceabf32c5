"""What would fail only inside the training processes is refused by the launcher instead.

Each case below passed the launcher once and then failed in every training process, after
the image pull, the nodes' start, the rendezvous and the model loading. Now each is one
`error:` line and exit code 2 from `python -m trainer --dry-run` (the checks run in the dry
run too; nothing is started or written; here the launcher runs in-process), and the valid
neighbours of each still pass. The real command line, and what genuinely shows only in
training (its own exit code, 78): tests/processes/test_prelaunch_checks_runs.py.
"""

from __future__ import annotations

import json
from dataclasses import replace
from importlib.util import find_spec

import numpy as np
import pytest
import torch
from transformers import EvalPrediction

from tests.support.helpers import (
    TEXT_COLUMNS,
    assert_planned,
    assert_refused,
    free_port,
    resolved,
    speech_task,
    use_hub_at,
)
from tests.support.loopback_hub import running_hub
from trainer.tasks import load_task, task_names
from trainer.tasks.classification import ClassificationTask, classification_metrics
from trainer.tasks.training_arguments import training_arguments_before_launch

ZERO3_FIXED = {
    "fp16": {"enabled": True, "loss_scale": 0, "loss_scale_window": 1000,
             "initial_scale_power": 16, "hysteresis": 2, "min_loss_scale": 1},
    "zero_optimization": {
        "stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "offload_param": {"device": "cpu", "pin_memory": True}, "overlap_comm": True,
        "contiguous_gradients": True, "sub_group_size": 1e14, "reduce_bucket_size": 0,
        "stage3_prefetch_bucket_size": 0, "stage3_param_persistence_threshold": 0,
        "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
        "stage3_gather_fp16_weights_on_model_save": True,
    },
    "optimizer": {"type": "AdamW",
                  "params": {"lr": 3e-5, "betas": [0.8, 0.999], "eps": 1e-8, "weight_decay": 3e-7}},
    "scheduler": {"type": "WarmupLR",
                  "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-5, "warmup_num_steps": 500}},
    "steps_per_print": 2000,
    "wall_clock_breakdown": False,
}  # fmt: skip
"""transformers' tests/deepspeed/ds_config_zero3.json as it was at 61c7ec94: fixed optimizer,
scheduler and fp16 values, which contradict the Trainer's defaults (lr 5e-5 here 3e-3 by
the text flags below, betas 0.9/0.999, weight decay 0, no fp16)."""

ZERO3_AUTO = {
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000,
             "initial_scale_power": 16, "hysteresis": 2, "min_loss_scale": 1},
    "optimizer": {"type": "AdamW",
                  "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                 "warmup_num_steps": "auto"}},
    "zero_optimization": {
        **ZERO3_FIXED["zero_optimization"], "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
    },
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "steps_per_print": 2000,
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "wall_clock_breakdown": False,
}  # fmt: skip
"""The same file as transformers ships it now (e7a14199): "auto" wherever a flag decides."""


# --metric_for_best_model -------------------------------------------------------------------


def test_a_metric_the_task_never_reports_is_refused_with_the_valid_names(dry_run):
    best = ["--load_best_model_at_end", "true", "--eval_strategy", "epoch",
            "--save_strategy", "epoch"]  # fmt: skip
    assert_refused(
        dry_run("--metric_for_best_model", "f1", *best),
        "--metric_for_best_model f1 is not a metric of --task text-classification: choose "
        "one of accuracy, macro_f1, loss (with or without the eval_ prefix).",
    )
    for metric in ("eval_accuracy", "macro_f1", "eval_loss"):
        plan = assert_planned(dry_run("--metric_for_best_model", metric, *best))
        assert plan["config"]["flags"]["training"]["metric_for_best_model"] == metric


def test_every_tasks_metric_names_cover_its_default_and_direction():
    for name in task_names():
        task = load_task(name)
        assert task.default_metric in task.metric_names, name
        assert task.lower_is_better <= set(task.metric_names), name


def test_classification_metric_names_are_what_its_metrics_return():
    prediction = EvalPrediction(
        predictions=np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]]), label_ids=np.array([0, 1, 1])
    )
    metrics = classification_metrics(prediction)
    assert tuple(metrics) == ClassificationTask.metric_names
    assert metrics["accuracy"] == pytest.approx(2 / 3)


def test_speech_metric_names_are_what_its_metrics_return(demo_assets):
    task, _, processor = speech_task(
        demo_assets.model_dir, demo_assets.dataset_dir, "--text_column_name", "transcription"
    )
    ids = np.array([processor.tokenizer("one two three").input_ids])
    metrics = task.compute_metrics(processor)(EvalPrediction(predictions=ids, label_ids=ids))
    assert metrics == {"wer": 0.0}
    assert tuple(metrics) == task.metric_names


# --report_to --------------------------------------------------------------------------------


@pytest.mark.skipif(find_spec("wandb") is not None, reason="needs an environment without wandb")
def test_an_integration_this_image_lacks_is_refused(dry_run):
    assert_refused(
        dry_run("--report_to", "wandb"),
        "--report_to wandb: not installed in this image (it has tensorboard)",
    )
    assert_refused(
        dry_run("--report_to", "tensorbored"), "--report_to: tensorbored is not supported"
    )


def test_tensorboard_and_none_are_accepted(dry_run):
    for value in ("tensorboard", "none"):
        plan = assert_planned(dry_run("--report_to", value))
        assert plan["config"]["flags"]["training"]["report_to"] == value


# DeepSpeed ----------------------------------------------------------------------------------


def test_deepspeed_values_that_contradict_the_flags_are_refused(dry_run, tmp_path):
    path = tmp_path / "ds_config_zero3.json"
    path.write_text(json.dumps(ZERO3_FIXED))
    assert_refused(
        dry_run("--deepspeed", str(path)),
        f"error: DeepSpeed config {path} contradicts the training flags (ds "
        "optimizer.params.lr=3e-05 vs hf learning_rate=0.003; ds optimizer.params.betas=[0.8, "
        "0.999] vs hf adam_beta1+adam_beta2=[0.9, 0.999]; ds optimizer.params.weight_decay="
        "3e-07 vs hf weight_decay=0.0; ds scheduler.params.warmup_max_lr=3e-05 vs hf "
        "learning_rate=0.003; ds fp16.enabled=True vs hf fp16|fp16_full_eval=False): set these "
        'values to "auto"',
    )


def test_a_zero3_config_of_auto_values_and_the_presets_pass(dry_run, tmp_path):
    path = tmp_path / "ds_config_zero3.json"
    path.write_text(json.dumps(ZERO3_AUTO))
    for choice in (str(path), "zero2", "zero3", "zero3-offload"):
        plan = assert_planned(dry_run("--deepspeed", choice, "--nproc_per_node", "2"))
        assert plan["config"]["flags"]["training"]["deepspeed"].endswith(".json")


def test_the_batch_size_is_checked_for_the_planned_world_size(dry_run, tmp_path):
    """DeepSpeed's train_batch_size is world size x per-device batch x accumulation: the
    launcher (one process) checks it for the processes it will start."""
    path = tmp_path / "fixed_batch.json"
    path.write_text(json.dumps({**ZERO3_AUTO, "train_batch_size": 16}))
    batch = ["--deepspeed", str(path), "--per_device_train_batch_size", "8"]
    assert_planned(dry_run(*batch, "--nproc_per_node", "2"))
    assert_refused(
        dry_run(*batch, "--nproc_per_node", "1"),
        "ds train_batch_size=16 vs hf train_batch_size (calculated)=8",
    )


def test_the_launchers_training_arguments_start_no_process_group(monkeypatch, text_assets):
    """As on a Vertex AI node (WORLD_SIZE and RANK per node) with --use_cpu, where building
    TrainingArguments plainly waits for a gloo process group no peer joins."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    model_dir, dataset_dir = text_assets
    argv = ["--task", "text-classification", "--model_name_or_path", model_dir,
            "--dataset_name", dataset_dir, *TEXT_COLUMNS, "--use_cpu", "true"]  # fmt: skip
    config = resolved(argv)
    two_by_two = replace(config.topology, num_nodes=2, nproc_per_node=2)
    args = training_arguments_before_launch(replace(config, topology=two_by_two))
    assert args.world_size == 4
    assert not torch.distributed.is_initialized()


def test_tf32_is_judged_by_the_nodes_hardware(dry_run):
    """TrainingArguments asks this process's GPU; the launcher asks the detected hardware
    (here: none), as for every device decision."""
    assert_refused(
        dry_run("--tf32", "true"),
        "--tf32 true needs an Ampere or newer GPU (compute capability 8.0+); this is a "
        "CPU-only node: leave --tf32 out.",
    )


# --push_to_hub ------------------------------------------------------------------------------


@pytest.fixture
def hub(monkeypatch):
    """A loopback Hub knowing a write token and a read token; this process leaves offline
    mode and talks to it."""
    with running_hub({}, tokens={"hf_write": "write", "hf_read": "read"}) as server:
        use_hub_at(monkeypatch, server.url)
        yield server


def test_push_to_hub_with_a_write_token_passes(dry_run, hub, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_write")
    assert_planned(dry_run("--push_to_hub", "true"))
    # huggingface_hub fetches its own agent registry once per process, with its first request
    asked = [path for _, path, _ in hub.requests if path != "/api/agent-harnesses"]
    assert asked == ["/api/whoami-v2"]
    assert_planned(dry_run())  # no push: the Hub is not asked
    assert len([path for _, path, _ in hub.requests if path != "/api/agent-harnesses"]) == 1


def test_push_to_hub_with_a_refused_or_read_only_token_is_refused(dry_run, hub, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    assert_refused(
        dry_run("--push_to_hub", "true", "--hub_token", "hf_typo"),
        f"The Hub at {hub.url} refused the token for --push_to_hub (HTTP 401)",
    )
    assert_refused(
        dry_run("--push_to_hub", "true", "--hub_token", "hf_read"),
        f"--push_to_hub: the token of loopback-user at {hub.url} is read-only",
    )


def test_push_to_hub_without_a_reachable_hub_is_refused(dry_run, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_write")
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    use_hub_at(monkeypatch, endpoint)
    assert_refused(
        dry_run("--push_to_hub", "true"),
        f"Cannot reach the Hugging Face Hub at {endpoint} for --push_to_hub (ConnectError",
    )
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert_refused(dry_run("--push_to_hub", "true"), "offline mode (HF_HUB_OFFLINE=1) forbids")
