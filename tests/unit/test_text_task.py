"""The text task in this process: local table layouts, label sets, dynamic padding, class
weights, accuracy and macro F1, the attention implementation. A real ZeRO-3 run of a tiny
BERT through `python -m trainer`: tests/processes/test_text_task_runs.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import ClassLabel, Dataset, Features, Value
from transformers import EvalPrediction, TrainingArguments

from tests.support.helpers import checked_task
from tests.support.sentiment_labels import SENTIMENTS
from tests.support.tiny_assets import write_paraphrase_csv
from trainer.command_line.parser import parse_flags
from trainer.command_line.recipes import RECIPES_DIR, config_file_flags
from trainer.common.errors import UserError
from trainer.tasks import load_task
from trainer.tasks.classification import LabelSet, classification_metrics
from trainer.tasks.trainers import ClassWeightedTrainer

COLUMNS = ["--text_column_name", "sentence", "--label_column_name", "sentiment"]


def text_task(model_dir: Path, dataset_dir: Path, *extra: str):
    return checked_task("text-classification", model_dir, dataset_dir, *extra)


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_csv_string_labels_give_a_sorted_label_set(text_assets):
    task = text_task(*text_assets, *COLUMNS)
    model, tokenizer = task.build_model_and_processor()
    assert model.config.id2label == dict(enumerate(SENTIMENTS))
    assert model.config.label2id == {name: i for i, name in enumerate(SENTIMENTS)}
    train, evaluation = task.load_datasets(tokenizer)
    assert train.column_names == ["text", "label"] and len(train) == 60
    assert len(evaluation) == 18


def test_jsonl_with_integer_labels_and_own_column_names(text_assets, tmp_path):
    reviews = [("great", 5), ("awful", 1), ("fine", 2), ("superb", 5)]
    write_jsonl(tmp_path / "train.jsonl", [{"review": t, "stars": s} for t, s in reviews])
    write_jsonl(tmp_path / "dev.jsonl", [{"review": "bad", "stars": 1}])
    task = text_task(
        text_assets[0], tmp_path, "--text_column_name", "review", "--label_column_name", "stars",
        "--eval_split_name", "dev",
    )  # fmt: skip
    model, tokenizer = task.build_model_and_processor()
    assert model.config.id2label == {0: "1", 1: "2", 2: "5"}
    train, _ = task.load_datasets(tokenizer)
    batch = task.data_collator(tokenizer)([train[i] for i in range(4)])
    assert batch["labels"].tolist() == [2, 0, 1, 2]


def test_evaluation_label_outside_the_training_labels_is_refused(text_assets, tmp_path):
    write_jsonl(tmp_path / "train.jsonl", [{"text": w, "label": w} for w in ("up", "down")])
    write_jsonl(tmp_path / "test.jsonl", [{"text": "sideways", "label": "mixed"}])
    task = text_task(text_assets[0], tmp_path)
    _, tokenizer = task.build_model_and_processor()
    with pytest.raises(UserError, match=r"has label\(s\) 'mixed' that are not in the label set "
                       r"\(down, up\) taken from split train"):  # fmt: skip
        task.load_datasets(tokenizer)


def test_unlabelled_classlabel_examples_are_refused():
    features = Features({"text": Value("string"), "label": ClassLabel(names=["neg", "pos"])})
    train = Dataset.from_dict({"text": ["a", "b"], "label": [0, 1]}, features=features)
    test = Dataset.from_dict({"text": ["c"], "label": [-1]}, features=features)
    labels = LabelSet.from_split(train, "split train")
    assert labels.names == ("neg", "pos")
    with pytest.raises(UserError, match=r"^split test has no labels \(a benchmark's test split"):
        labels.check(test, "split test")


def test_a_single_label_or_a_missing_label_is_refused():
    one = Dataset.from_dict({"text": ["a", "b"], "label": ["x", "x"]})
    with pytest.raises(UserError, match="needs at least two"):
        LabelSet.from_split(one, "split train")
    gap = Dataset.from_dict({"text": ["a", "b", "c"], "label": ["x", None, "y"]})
    with pytest.raises(UserError, match="examples without a label"):
        LabelSet.from_split(gap, "split train")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--text_column_name", "sentence"], 'Column "label" (--label_column_name) not found'),
        (COLUMNS[:2] + ["--label_column_name", "mood"], 'Column "mood" (--label_column_name)'),
        (COLUMNS + ["--eval_split_name", "validation"], 'Split "validation" not found'),
        (COLUMNS + ["--class_weights", "1,-2,1"], "--class_weights"),
        (COLUMNS + ["--max_seq_length", "0"], "--max_seq_length must be at least 1"),
    ],
)
def test_bad_columns_splits_and_options_are_caught_before_launch(text_assets, args, message):
    with pytest.raises(UserError, match=re.escape(message)):
        text_task(*text_assets, *args)


def test_a_directory_without_tables_is_refused(text_assets, tmp_path):
    (tmp_path / "readme.md").write_text("nothing to train on")
    with pytest.raises(UserError, match=r"holds no data files: put one \.csv, \.tsv, \.jsonl"):
        text_task(text_assets[0], tmp_path)


def test_unknown_task_names_every_task():
    with pytest.raises(UserError, match="choose one of image-classification, preference-tuning, "
                       "speech-recognition, text-classification"):  # fmt: skip
        load_task("sentiment")


def test_max_seq_length_beyond_the_model_is_refused(text_assets):
    task = text_task(*text_assets, *COLUMNS, "--max_seq_length", "200")
    with pytest.raises(UserError, match="--max_seq_length 200 exceeds the 128 tokens"):
        task.build_model_and_processor()


def test_collator_truncates_and_pads_to_the_longest_text(text_assets):
    task = text_task(*text_assets, *COLUMNS, "--max_seq_length", "8")
    model, tokenizer = task.build_model_and_processor()
    collate = task.data_collator(tokenizer)
    short = [
        {"text": "Demand rose .", "label": "positive"},
        {"text": "Net sales fell .", "label": "negative"},
    ]
    batch = collate(short)
    lengths = batch["attention_mask"].sum(dim=1).tolist()
    assert batch["input_ids"].shape[1] == max(lengths) < 8, "padded to the longest, not the max"
    assert min(lengths) < max(lengths) and batch["labels"].tolist() == [2, 0]
    long = {"text": " ".join(["operating profit rose"] * 10), "label": "neutral"}
    assert collate([*short, long])["input_ids"].shape[1] == 8
    assert torch.isfinite(model(**batch).loss)


@pytest.mark.parametrize("pair", [False, True], ids=["one-text", "sentence-pair"])
def test_group_by_length_gets_the_token_counts_the_collator_makes(pair, text_assets, tmp_path):
    """`--group_by_length` (run_glue.py's): the Trainer's samplers read each example's length
    from the length column, else from `input_ids`, which raw rows lack (the collator
    tokenises): the task counts the collator's tokens, truncation and a pair's two texts
    included, for the training and evaluation splits."""
    dataset, columns, limit = text_assets[1], COLUMNS, 12  # texts of 7 to 14 tokens
    if pair:  # pairs of 14 to 24 tokens
        dataset, limit = tmp_path / "pairs", 20
        columns = ["--text_column_name", "sentence1,sentence2", "--eval_split_name", "validation"]
        write_paraphrase_csv(dataset)
    task = text_task(text_assets[0], dataset, *columns, "--max_seq_length", str(limit),
                     "--group_by_length")  # fmt: skip
    model, tokenizer = task.build_model_and_processor()
    train, evaluation = task.load_datasets(tokenizer)
    collate = task.data_collator(tokenizer)
    for split in (train, evaluation):
        made = [collate([example])["attention_mask"].sum().item() for example in split]
        assert split["length"] == made
    assert len(set(train["length"])) > 1 and max(train["length"]) == limit, "some truncated"

    from transformers.trainer_pt_utils import LengthGroupedSampler

    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), train_sampling_strategy="group_by_length",
        use_cpu=True, report_to=[], remove_unused_columns=False,
    )  # fmt: skip
    trainer = task.trainer_class(model=model, args=args, train_dataset=train,
                                 processing_class=tokenizer)  # fmt: skip
    sampler = trainer._get_train_sampler()
    assert isinstance(sampler, LengthGroupedSampler) and sampler.lengths == train["length"]
    assert trainer._get_eval_sampler(evaluation).lengths == evaluation["length"]


def test_accuracy_and_macro_f1():
    labels = np.array([0, 0, 1, 1, 2, 2])
    predicted = np.array([0, 0, 1, 2, 2, 2])
    metrics = classification_metrics(EvalPrediction(np.eye(4)[predicted], labels))
    # F1 per class: 1, 2/3, 4/5 (class 3 never occurs: left out, as scikit-learn does)
    assert metrics["accuracy"] == pytest.approx(5 / 6)
    assert metrics["macro_f1"] == pytest.approx((1 + 2 / 3 + 4 / 5) / 3)


def test_balanced_class_weights_and_the_weighted_loss(text_assets, tmp_path):
    rows = [("good", "pos")] * 3 + [("bad", "neg")]
    write_jsonl(tmp_path / "train.jsonl", [{"text": t, "label": label} for t, label in rows])
    task = text_task(
        text_assets[0], tmp_path, "--eval_split_name", "", "--class_weights", "balanced"
    )
    model, tokenizer = task.build_model_and_processor()
    train, _ = task.load_datasets(tokenizer)
    weights = task._class_weights
    assert weights.tolist() == pytest.approx([4 / (2 * 1), 4 / (2 * 3)])  # neg, pos
    assert task.trainer_class.func is ClassWeightedTrainer

    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[], use_cpu=True)
    trainer = task.trainer_class(model=model, args=args)
    batch = task.data_collator(tokenizer)([train[i] for i in range(4)])
    loss = trainer.compute_loss(model, batch)
    logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
    expected = torch.nn.functional.cross_entropy(logits, batch["labels"], weight=weights)
    assert loss.item() == pytest.approx(expected.item())
    assert loss.item() != pytest.approx(model(**batch).loss.item())


def test_explicit_class_weights_must_match_the_labels(text_assets):
    task = text_task(*text_assets, *COLUMNS, "--class_weights", "1,2")
    _, tokenizer = task.build_model_and_processor()
    with pytest.raises(UserError, match=r"2 weight\(s\) for 3 labels \(negative, neutral"):
        task.load_datasets(tokenizer)


def test_sentiment_recipe_is_valid_flags():
    flags = parse_flags(config_file_flags(RECIPES_DIR / "bert-sentiment.yaml"))
    assert flags.model.model_name_or_path == "google-bert/bert-base-uncased"
    assert flags.task_options.class_weights == "balanced"
    assert flags.training["metric_for_best_model"] == "macro_f1"


def test_attention_is_sdpa_unless_a_flag_says_otherwise(text_assets):
    model, _ = text_task(*text_assets, *COLUMNS).build_model_and_processor()
    assert model.config._attn_implementation == "sdpa"
    flag = ("--attn_implementation", "eager")
    eager, _ = text_task(*text_assets, *COLUMNS, *flag).build_model_and_processor()
    assert eager.config._attn_implementation == "eager"


def test_examples_without_a_text_are_skipped_and_counted_not_left_to_fail_a_batch(
    text_assets, tmp_path, capsys
):
    """An empty CSV cell reaches the collator as None, and the tokenizer fails the batch that
    holds it, mid-training. The task skips such examples, with one line, up to
    --max_bad_examples (here the default, 1%, and a given 2), for single texts and pairs."""
    from trainer.data.bad_examples import skipped_per_epoch

    NO_EVALUATION = ["--eval_strategy", "no"]  # noqa: N806 - a constant of this test
    model_dir = text_assets[0]
    rows = [f"text number {i} is {'good' if i % 2 else 'bad'},{'positive' if i % 2 else 'negative'}"
            for i in range(200)]  # fmt: skip
    rows[3] = ",negative"
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "train.csv").write_text("sentence,sentiment\n" + "\n".join(rows) + "\n")
    task = text_task(model_dir, tmp_path / "one", *COLUMNS, *NO_EVALUATION)
    _, tokenizer = task.build_model_and_processor()
    train, _ = task.load_datasets(tokenizer)
    assert len(train) == 199 and None not in train["text"]
    assert skipped_per_epoch() >= 1
    assert (
        "warning: skipped 1 of 200 examples in split train of "
        f"{tmp_path / 'one'} without a text (first: example 3)"
    ) in capsys.readouterr().out
    task.data_collator(tokenizer)([train[i] for i in range(8)])  # no example fails its batch

    pairs = ["first,second,label", "a cat,a dog,same", ",a cow,other", "a hen,,same",
             "a fox,a fox,same"]  # fmt: skip
    (tmp_path / "pairs").mkdir()
    (tmp_path / "pairs" / "train.csv").write_text("\n".join(pairs) + "\n")
    columns = ["--text_column_name", "first,second", "--label_column_name", "label",
               *NO_EVALUATION]  # fmt: skip
    task = text_task(model_dir, tmp_path / "pairs", *columns, "--max_bad_examples", "2")
    _, tokenizer = task.build_model_and_processor()
    train, _ = task.load_datasets(tokenizer)
    assert train["text"] == ["a cat", "a fox"] and train["text_pair"] == ["a dog", "a fox"]

    task = text_task(model_dir, tmp_path / "pairs", *columns, "--max_bad_examples", "1")
    _, tokenizer = task.build_model_and_processor()
    with pytest.raises(UserError, match=r"^2 of 4 examples in split train of .* have no text, "
                                        r"more than --max_bad_examples 1 allows \(1\); "
                                        r"first: example 1, example 2$"):  # fmt: skip
        task.load_datasets(tokenizer)

    (tmp_path / "none").mkdir()  # every text missing: refused, whatever the limit allows
    (tmp_path / "none" / "train.csv").write_text("first,second,label\n,x,same\ny,,other\n")
    task = text_task(model_dir, tmp_path / "none", *columns[:4], "--max_bad_examples", "100%",
                     *NO_EVALUATION)  # fmt: skip
    _, tokenizer = task.build_model_and_processor()
    with pytest.raises(UserError, match=r"^None of the 2 examples in split train of .* has a "
                                        r"text \(example 0, example 1\)\.$"):  # fmt: skip
        task.load_datasets(tokenizer)
