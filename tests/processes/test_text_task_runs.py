"""The text task through the real `python -m trainer`: two processes under ZeRO-3 with
class weights, outputs in Cloud Storage (the emulator) as Vertex AI sets them, macro F1
reported for tuning, the delivered model used by `pipeline()`, and a restart that resumes
from the bucket. The task in this process: tests/unit/test_text_task.py."""

from __future__ import annotations

import json
import re
import uuid

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from tests.support.gcs_emulator import BUCKET
from tests.support.helpers import TEXT_COLUMNS, run_trainer, trainer_env, use_delivered_model
from tests.support.sentiment_labels import SENTIMENTS
from trainer.storage.store import open_store


@pytest.mark.slow
def test_bert_zero3_run_writes_to_gcs_reports_f1_and_resumes(text_assets, tmp_path, gcs):
    """Two processes with ZeRO-3 and class weights, outputs in Cloud Storage (emulated) as
    Vertex AI sets them, macro F1 reported for tuning; then a restart on a fresh machine
    resumes from the checkpoint in the bucket."""
    model_dir, dataset_dir = text_assets
    base = f"gs://{BUCKET}/{uuid.uuid4().hex}"
    env = {
        "STORAGE_EMULATOR_HOST": gcs,
        "AIP_CHECKPOINT_DIR": f"{base}/checkpoints/",
        "AIP_MODEL_DIR": f"{base}/model/",
        "AIP_TENSORBOARD_LOG_DIR": f"{base}/logs/",
        "CLOUD_ML_HP_METRIC_FILE": str(tmp_path / "hypertune.jsonl"),
    }
    args = [
        "--task", "text-classification", "--nproc_per_node", "2", "--deepspeed", "zero3",
        "--model_name_or_path", str(model_dir), "--dataset_name", str(dataset_dir), *TEXT_COLUMNS,
        "--class_weights", "balanced", "--max_seq_length", "16", "--learning_rate", "3e-3",
        "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "9",
        "--eval_strategy", "steps", "--eval_steps", "4", "--save_steps", "4",
        "--logging_steps", "4", "--metric_for_best_model", "macro_f1", "--output_dir", "out",
    ]  # fmt: skip
    first, restart = tmp_path / "first", tmp_path / "restart"
    first.mkdir(), restart.mkdir()
    code, output = run_trainer([*args, "--max_steps", "8"], cwd=first,
                               env=trainer_env(tmp_path / "cache", **env))  # fmt: skip
    assert code == 0, output[-3000:]
    assert "labels from split train of" in output and "0 negative, 1 neutral, 2 positive" in output
    results = json.loads((first / "out" / "eval_results.json").read_text())
    assert 0 <= results["eval_accuracy"] <= 1 and 0 <= results["eval_macro_f1"] <= 1, results
    reports = [json.loads(line) for line in (tmp_path / "hypertune.jsonl").read_text().splitlines()]
    assert [int(r["global_step"]) for r in reports] == [4, 8]
    assert all(0 <= float(r["macro_f1"]) <= 1 for r in reports), reports

    local = tmp_path / "model-from-gcs"
    open_store(f"{base}/model").download(local)
    model = AutoModelForSequenceClassification.from_pretrained(local)
    tokenizer = AutoTokenizer.from_pretrained(local)
    assert model.config.id2label == dict(enumerate(SENTIMENTS))
    initial = AutoModelForSequenceClassification.from_pretrained(model_dir).state_dict()
    trained = model.state_dict()
    changed = [name for name in initial if not torch.equal(initial[name], trained[name])]
    assert len(changed) > len(initial) // 2, "the saved weights are not the trained ones"
    with torch.no_grad():
        logits = model(**tokenizer(["Net sales rose last year ."], return_tensors="pt")).logits
    assert logits.shape == (1, 3)
    used = use_delivered_model("text-classification", local, "Net sales rose last year .")
    assert sorted(used["labels"]) == sorted(SENTIMENTS), "pipeline() must name the classes"

    code, output = run_trainer([*args, "--max_steps", "12"], cwd=restart,
                               env=trainer_env(tmp_path / "cache", **env))  # fmt: skip
    assert code == 0, output[-3000:]
    assert "resuming from out/checkpoint-8" in output
    assert re.findall(r"step (\d+)/12", output) == ["12"], "training restarted from scratch"
