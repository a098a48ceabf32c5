"""The image task in this process: imagefolder layouts, labels, undecodable images,
streams, batches and augmentation. A real run through `python -m trainer` in which a tiny
ViT learns to tell colours apart: tests/processes/test_image_task_runs.py."""

from __future__ import annotations

import io
import random
import re
import shutil
from pathlib import Path

import datasets
import pytest
import torch
from datasets import ClassLabel, Dataset, Features, Value
from datasets import Image as HFImage
from PIL import Image

from tests.support.colour_set import ALLOW_FIXTURE_BAD, CLASSES, TRAIN_IMAGES
from tests.support.helpers import image_task
from tests.support.tiny_assets import COLOURS, IMAGE_SPLITS
from trainer.command_line.parser import parse_flags
from trainer.command_line.recipes import RECIPES_DIR, config_file_flags
from trainer.common.errors import UserError


def test_class_folders_become_the_label_set_of_the_model(image_assets):
    task = image_task(*image_assets)
    model, processor = task.build_model_and_processor()
    assert model.config.id2label == dict(enumerate(CLASSES))
    assert model.config.label2id == {name: i for i, name in enumerate(CLASSES)}
    assert model.classifier.out_features == len(CLASSES)
    assert processor.size == {"height": 32, "width": 32}


def test_undecodable_images_are_skipped_and_counted(image_assets, capsys):
    task = image_task(*image_assets, *ALLOW_FIXTURE_BAD)
    _, processor = task.build_model_and_processor()
    train, evaluation = task.load_datasets(processor)
    assert len(train) == TRAIN_IMAGES and len(evaluation) == IMAGE_SPLITS["test"] * len(COLOURS)
    out = capsys.readouterr().out
    assert f"skipped 2 of {TRAIN_IMAGES + 2} images in split train" in out
    assert re.search(r"first: (not-an-image|truncated)\.png, (not-an-image|truncated)\.png in "
                     r"\S+/red/\)", out)  # fmt: skip
    assert all(example["image"].size == (40, 40) for example in train)


def test_a_streamed_split_skips_undecodable_images_as_they_are_read(image_assets, tmp_path):
    """From shards, augmented: the stream decodes every image whole as it is read, and the
    two bad files reach the training process as names only."""
    from tests.support.shard_sets import make_shards
    from trainer.data.streams import SKIPPED, prepare_stream

    make_shards(image_assets[1], tmp_path / "shards", "--task", "image-classification",
                "--shard_size_mb", "0.05")  # fmt: skip
    task = image_task(image_assets[0], tmp_path / "shards", "--streaming", "--max_steps", "1",
                      "--augment", "true", *ALLOW_FIXTURE_BAD)  # fmt: skip
    _, processor = task.build_model_and_processor()
    train, _ = task.load_datasets(processor)
    examples = list(prepare_stream(train, seed=1, buffer_size=4, start=None))
    assert len(examples) == TRAIN_IMAGES
    skipped = sorted(Path(name).name for example in examples for name in example[SKIPPED])
    assert skipped == ["not-an-image.png", "truncated.png"]
    assert all(isinstance(example["image"], Image.Image) for example in examples)


def test_more_undecodable_images_than_allowed_stop_the_run_naming_them(image_assets):
    """The default, 1% of the 122 training files, allows 1: the fixture has 2."""
    task = image_task(*image_assets)
    _, processor = task.build_model_and_processor()
    bad = r"(not-an-image|truncated)\.png"
    message = rf"^2 of {TRAIN_IMAGES + 2} images in split train .* more than --max_bad_examples "
    with pytest.raises(UserError, match=rf"{message}1% allows \(1\); first: {bad}, {bad} in "
                                        r"\S+/red/$"):  # fmt: skip
        task.load_datasets(processor)


def test_a_class_only_in_evaluation_is_named_as_such(image_assets, tmp_path, capsys):
    """imagefolder declares a class folder of any split: the model gets an output for a
    test-only class, and the labels line must not say it came from the training split."""
    for split in ("train", "test"):
        (tmp_path / split).symlink_to(image_assets[1] / split)
    purple = tmp_path / "validation"
    shutil.copytree(image_assets[1] / "test", purple)
    (purple / "purple").mkdir()
    for index in range(3):
        Image.new("RGB", (40, 40), (120, 20, 160)).save(purple / "purple" / f"{index}.png")
    task = image_task(image_assets[0], tmp_path, "--eval_split_name", "validation",
                      *ALLOW_FIXTURE_BAD)  # fmt: skip
    model, processor = task.build_model_and_processor()
    assert model.config.id2label == dict(enumerate(["blue", "green", "purple", "red"]))
    task.load_datasets(processor)
    out = capsys.readouterr().out
    assert (
        f"labels from split train of {tmp_path}: 0 blue, 1 green, 3 red; declared by the "
        f"dataset but without an example in split train of {tmp_path} (never learnt): "
        "2 purple" in out
    )
    assert f"warning: split validation of {tmp_path} has class(es) purple that split train" in out


def test_split_in_which_nothing_decodes_is_an_error(image_assets, tmp_path):
    for name in CLASSES:
        (tmp_path / "train" / name).mkdir(parents=True)
        (tmp_path / "train" / name / "a.png").write_bytes(b"not an image")
    task = image_task(image_assets[0], tmp_path, "--eval_split_name", "")
    _, processor = task.build_model_and_processor()
    with pytest.raises(UserError, match=r"None of the 3 images in split train .* can be decoded"):
        task.load_datasets(processor)


def test_class_folders_at_the_top_are_all_training_data(image_assets, tmp_path):
    for name in ("cat", "dog"):
        (tmp_path / name).mkdir()
        Image.new("RGB", (8, 8)).save(tmp_path / name / "x.png")
    task = image_task(image_assets[0], tmp_path, "--eval_split_name", "")
    assert set(task.detect_local_layout(tmp_path).splits) == {"train"}
    model, _ = task.build_model_and_processor()
    assert model.config.id2label == {0: "cat", 1: "dog"}


def test_hub_dataset_with_the_beans_schema(image_assets, monkeypatch, capsys):
    """A hub dataset (loading faked: no network here) with beans' columns: images stored as
    bytes, a `labels` ClassLabel and a column the task does not need."""
    beans = ["angular_leaf_spot", "bean_rust", "healthy"]
    features = Features(
        {"image_file_path": Value("string"), "image": HFImage(), "labels": ClassLabel(names=beans)}
    )
    png = io.BytesIO()
    Image.new("RGB", (20, 20), (10, 200, 10)).save(png, format="PNG")
    rows = {
        "image_file_path": ["a.jpg", "b.jpg", "c.jpg", "d.jpg"],
        "image": [{"bytes": png.getvalue(), "path": None}] * 3 + [{"bytes": b"junk", "path": None}],
        "labels": [0, 1, 2, 1],
    }
    requested = []

    def fake_load_dataset(name, config=None, split=None, cache_dir=None):
        requested.append((name, split))
        return Dataset.from_dict(rows, features=features)

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    task = image_task(image_assets[0], "AI-Lab-Makerere/beans", "--label_column_name", "labels",
                      "--eval_split_name", "validation", "--max_bad_examples", "1")  # fmt: skip
    model, processor = task.build_model_and_processor()
    assert model.config.id2label == dict(enumerate(beans))
    train, evaluation = task.load_datasets(processor)
    assert [split for _, split in requested] == ["train", "validation"]
    assert train.column_names == ["image", "label"] and len(train) == 3
    out = capsys.readouterr().out
    assert "skipped 1 of 4 images in split train of AI-Lab-Makerere/beans that" in out
    assert "not be decoded (first: example 3)" in out
    batch = task.data_collator(processor)([train[i] for i in range(3)])
    assert batch["labels"].tolist() == [0, 1, 2] and len(evaluation) == 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--label_column_name", "labels"], 'Column "labels" (--label_column_name) not found'),
        (["--image_column_name", "img"], 'Column "img" (--image_column_name) not found'),
        (["--label_column_name", "image"], "name the same column"),
        (["--eval_split_name", "validation"], 'Split "validation" not found'),
    ],
)
def test_bad_columns_and_splits_are_caught_before_launch(image_assets, args, message):
    with pytest.raises(UserError, match=re.escape(message)):
        image_task(*image_assets, *args)


def test_a_directory_without_class_folders_is_refused(image_assets, tmp_path):
    (tmp_path / "notes.txt").write_text("no images here")
    with pytest.raises(UserError, match="is not an imagefolder"):
        image_task(image_assets[0], tmp_path)


def test_collator_makes_pixel_batches_from_any_image_mode(image_assets):
    task = image_task(*image_assets, *ALLOW_FIXTURE_BAD)
    model, processor = task.build_model_and_processor()
    train, _ = task.load_datasets(processor)
    modes = {train[i]["image"].mode for i in range(5)}
    assert {"RGB", "P"} <= modes, "the set holds palette PNGs and JPEGs as well"
    examples = [train[i] for i in range(5)]
    batch = task.data_collator(processor)(examples)
    assert tuple(batch["pixel_values"].shape) == (5, 3, 32, 32)
    assert batch["labels"].tolist() == [example["label"] for example in examples]
    assert torch.isfinite(model(**batch).loss)


def test_augmentation_changes_training_images_only(image_assets):
    task = image_task(*image_assets, "--augment", "true", *ALLOW_FIXTURE_BAD)
    _, processor = task.build_model_and_processor()
    train, evaluation = task.load_datasets(processor)
    random.seed(0)
    sizes = {train[0]["image"].size for _ in range(8)}
    assert len(sizes) > 1, "random resized crops differ from read to read"
    assert all(w <= 40 and h <= 40 for w, h in sizes)
    assert {evaluation[0]["image"].size for _ in range(3)} == {(40, 40)}


def test_seed_recipe_is_valid_flags():
    flags = parse_flags(config_file_flags(RECIPES_DIR / "vit-beans.yaml"))
    assert flags.model.model_name_or_path == "google/vit-base-patch16-224-in21k"
    assert flags.task_options.label_column_name == "labels" and flags.task_options.augment
    assert flags.training["metric_for_best_model"] == "accuracy"
