"""`--do_predict` through the real `python -m trainer` (trainer/training/test_predictions.py):
after the model is delivered, the test split's predictions.jsonl and test_results.json are
written beside it, in `<model>-test/`, in the shape `python -m trainer.predict` writes."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from tests.support.helpers import TEXT_COLUMNS, run_trainer, trainer_env
from tests.support.sentiment_labels import SENTIMENTS


def write_table(path, rows) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "sentence", "sentiment"])
        writer.writerows(rows)


def sentiment_rows(dataset_dir, split: str) -> list[tuple[str, str, str]]:
    """The sentiment set's split with an id column added (ex-0, ex-1, ...)."""
    with (dataset_dir / f"{split}.csv").open(encoding="utf-8") as handle:
        return [(f"ex-{i}", row["sentence"], row["sentiment"])
                for i, row in enumerate(csv.DictReader(handle))]  # fmt: skip


def predict_run(text_assets, tmp_path, test_file, *extra: str):
    """Two steps on the training file (the same columns as `test_file`: files of one
    dataset), then --do_predict over `test_file`."""
    model_dir, dataset_dir = text_assets
    train_file = tmp_path / "train.csv"
    write_table(train_file, sentiment_rows(dataset_dir, "train"))
    args = [
        "--task", "text-classification", "--deepspeed", "none", "--nproc_per_node", "1",
        "--model_name_or_path", str(model_dir), "--train_file", str(train_file),
        "--test_file", str(test_file), *TEXT_COLUMNS, "--max_seq_length", "16",
        "--per_device_eval_batch_size", "4", "--max_steps", "2", "--do_predict",
        "--output_dir", "out", *extra,
    ]  # fmt: skip
    code, output = run_trainer(args, cwd=tmp_path, env=trainer_env(tmp_path / "cache"), timeout=300)
    assert code == 0, output[-3000:]
    beside = tmp_path / "out" / "model-test"
    lines = [json.loads(line) for line in (beside / "predictions.jsonl").read_text().splitlines()]
    return lines, json.loads((beside / "test_results.json").read_text()), output


def test_do_predict_writes_predictions_and_their_accuracy_beside_the_model(text_assets, tmp_path):
    """One line per test example in the file's order, its id from the id column, its
    reference the label's name, its prediction as the server answers, the delivered
    model's for that example's text; the accuracy in test_results.json is the one the lines
    give. The model's own folder is left as it was delivered. Trained as run_glue.py's users
    run it, with `--group_by_length`: it died at the first step (the Trainer found no
    lengths), and the Trainer's evaluation sampler groups the test split by length too."""
    rows = sentiment_rows(text_assets[1], "test")
    test_file = tmp_path / "held_out.csv"
    write_table(test_file, rows)
    lines, results, output = predict_run(text_assets, tmp_path, test_file, "--group_by_length")
    assert f"test predictions: {len(rows)} examples" in output
    assert [line["id"] for line in lines] == [row[0] for row in rows]
    assert [line["reference"] for line in lines] == [row[2] for row in rows]
    assert all(set(line["prediction"]) == {"label", "score"} for line in lines)
    assert all(line["prediction"]["label"] in SENTIMENTS for line in lines)
    assert all(0 < line["prediction"]["score"] <= 1 for line in lines)
    expected = delivered_predictions(tmp_path / "out" / "model", [row[1] for row in rows])
    assert [line["prediction"]["label"] for line in lines] == [label for label, _ in expected]
    scores = [line["prediction"]["score"] for line in lines]  # two steps: close to 1/3 each
    assert scores == pytest.approx([score for _, score in expected], abs=1e-6)
    assert max(scores) - min(scores) > 1e-5, "scores this close could not tell examples apart"
    hits = [line["prediction"]["label"] == line["reference"] for line in lines]
    assert results["test_accuracy"] == sum(hits) / len(hits)
    assert results["test_samples"] == len(rows) and "test_macro_f1" in results
    manifest = json.loads((tmp_path / "out" / "model" / "manifest.json").read_text())
    assert not {"predictions.jsonl", "test_results.json"} & {
        entry["path"] for entry in manifest["files"]
    }


def delivered_predictions(model_dir, texts: list[str]) -> list[tuple[str, float]]:
    """The delivered model's likeliest label and its score for each text, computed in this
    process one text at a time (as predict_run's --max_seq_length truncates it)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    predicted = []
    for text in texts:
        with torch.no_grad():
            logits = model(**tokenizer(text, truncation=True, max_length=16, return_tensors="pt"))
        score, label = logits.logits.softmax(-1)[0].max(-1)
        predicted.append((model.config.id2label[label.item()], score.item()))
    return predicted


def test_a_test_split_without_labels_is_predicted_not_scored(text_assets, tmp_path):
    """A test file whose labels are all empty (a benchmark's hidden ones): every example is
    predicted, its reference null, and no metric is made up."""
    rows = [("h-7", "the results were strong .", ""), ("h-3", "the outlook is weak .", "")]
    test_file = tmp_path / "unlabelled.csv"
    write_table(test_file, rows)
    lines, results, _ = predict_run(text_assets, tmp_path, test_file)
    assert [(line["id"], line["reference"]) for line in lines] == [("h-7", None), ("h-3", None)]
    assert all(line["prediction"]["label"] in SENTIMENTS for line in lines)
    assert results["test_samples"] == 2 and "test_accuracy" not in results


def test_speech_do_predict_writes_generated_text_named_by_clip(demo_assets, demo_cache, tmp_path):
    """Speech predicts as its evaluation does, by generation: each line's prediction is the
    decoded text ({"text": ...}, the server's shape), its id the clip's file name, its
    reference the transcript; test_results.json has the word error rate. With the example
    scripts' `--group_by_length`, which once ended such a run after delivery (the Trainer's
    evaluation sampler looked for the test split's lengths), the split is predicted in order."""
    from tests.support.tiny_assets import write_tone_speech
    from trainer.tasks.speech_recognition.demo import DEMO_SENTENCES

    sentences = list(DEMO_SENTENCES)
    write_tone_speech(tmp_path / "speech", {"train": sentences[:4], "test": sentences[4:7]})
    args = [
        "--deepspeed", "none", "--nproc_per_node", "1", "--language", "en",
        "--model_name_or_path", str(demo_assets.model_dir),
        "--dataset_name", str(tmp_path / "speech"), "--text_column_name", "transcription",
        "--max_steps", "1", "--eval_strategy", "no", "--generation_max_length", "8",
        "--group_by_length", "--do_predict", "--output_dir", "out",
    ]  # fmt: skip
    code, output = run_trainer(args, cwd=tmp_path, env=trainer_env(demo_cache), timeout=300)
    assert code == 0, output[-3000:]
    beside = tmp_path / "out" / "model-test"
    lines = [json.loads(line) for line in (beside / "predictions.jsonl").read_text().splitlines()]
    assert [line["id"] for line in lines] == ["0000.wav", "0001.wav", "0002.wav"]
    assert [line["reference"] for line in lines] == sentences[4:7]
    assert all(list(line["prediction"]) == ["text"] for line in lines)
    assert all(isinstance(line["prediction"]["text"], str) for line in lines)
    results = json.loads((beside / "test_results.json").read_text())
    assert results["test_samples"] == 3 and results["test_wer"] >= 0
