"""`python -m trainer.predict MODEL INPUT OUTPUT` in this process, with tiny models of each
task: every input kind (a folder with its metadata or class folders, a .jsonl of serving
instances, a dataset saved with save_to_disk), predictions equal to what the server's
predictor returns for the same instances, metrics as training computes them, broken
examples skipped and counted up to --max_bad_examples, bad command lines refused before the
model loads, and a gs:// OUTPUT in the Cloud Storage emulator. The command as its own
process is tests/processes/test_predict_runs.py's."""

from __future__ import annotations

import base64
import csv
import json
from pathlib import Path

import pytest

from tests.support.gcs_emulator import BUCKET
from tests.support.labelled_models import COLOURS, png
from tests.support.served_predictions import assert_same_predictions, served
from trainer.predict.__main__ import main
from trainer.storage.store import open_store


def predict(*argv: str) -> int:
    try:
        main([str(a) for a in argv])
    except SystemExit as stopped:
        return stopped.code
    return 0


def lines_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error:")]


def test_a_jsonl_of_instances_is_predicted_in_order_and_scored_by_accuracy(
    tmp_path, text_classifier, capsys
):
    instances = [
        {"id": "a", "text": "good service .", "label": "positive"},
        {"id": "b", "text": "bad food .", "reference": "negative"},
        {"text": "the room was fine .", "text_pair": "the staff were kind ."},
        "a bare string is a text too",
        {"id": "c", "text": "awful .", "label": 1},  # a label id, named by the model's id2label
    ]
    source = tmp_path / "test.jsonl"
    source.write_text("".join(json.dumps(i) + "\n" for i in instances))
    assert predict(text_classifier, source, tmp_path / "out", "--batch_size", "2") == 0

    lines = lines_of(tmp_path / "out" / "predictions.jsonl")
    assert [line["id"] for line in lines] == ["a", "b", 3, 4, "c"]
    assert [line.get("reference") for line in lines] == ["positive", "negative", None, None, 1]
    stripped = [{"text": "good service ."}, {"text": "bad food ."}, instances[2], instances[3],
                {"text": "awful ."}]  # fmt: skip
    expected = served(text_classifier, stripped)
    assert_same_predictions([line["prediction"] for line in lines], expected)
    hits = [p["label"] == r for p, r in zip(expected, ["positive", "negative"], strict=False)]
    hits.append(expected[4]["label"] == "positive")
    results = json.loads((tmp_path / "out" / "test_results.json").read_text())
    assert results["test_samples"] == 3
    assert results["test_accuracy"] == pytest.approx(sum(hits) / 3)
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == (f"predicted 5 of 5 examples, skipped 0: predictions.jsonl and "
                       f"test_results.json in {tmp_path / 'out'}")  # fmt: skip


def class_folders(root: Path, broken: int = 0) -> Path:
    """red/, green/, blue/ with two images each, and `broken` files no decoder reads."""
    for name, colour in COLOURS.items():
        (root / name).mkdir(parents=True)
        for index in range(2):
            (root / name / f"{index}.png").write_bytes(png(colour))
    for index in range(broken):
        (root / "red" / f"broken-{index}.png").write_bytes(b"this is text, not a PNG")
    (root / "README.md").write_text("not an image file: not an example")
    return root


def test_an_image_folder_skips_and_counts_a_broken_file_and_labels_by_class_folder(
    tmp_path, image_classifier, capsys
):
    folder = class_folders(tmp_path / "images", broken=1)
    code = predict(image_classifier, folder, tmp_path / "out", "--max_bad_examples", "1",
                   "--parameters", '{"top_k": 1}')  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    lines = lines_of(tmp_path / "out" / "predictions.jsonl")
    names = ["blue/0.png", "blue/1.png", "green/0.png", "green/1.png", "red/0.png", "red/1.png"]
    assert [line["id"] for line in lines] == names
    assert [line["reference"] for line in lines] == [name.split("/")[0] for name in names]
    files = [{"b64": base64.b64encode((folder / n).read_bytes()).decode()} for n in names]
    expected = served(image_classifier, files, {"top_k": 1})
    assert_same_predictions([line["prediction"] for line in lines], expected)
    accuracy = sum(p["labels"][0] == n.split("/")[0] for p, n in zip(expected, names, strict=True))
    results = json.loads((tmp_path / "out" / "test_results.json").read_text())
    assert results["test_accuracy"] == pytest.approx(accuracy / 6)
    warnings = [line for line in captured.err.splitlines() if line.startswith("warning:")]
    assert warnings == ["warning: skipped red/broken-0.png: not an image that Pillow can decode"]
    assert captured.out.splitlines()[-1].startswith("predicted 6 of 7 examples, skipped 1: ")


def test_more_broken_files_than_allowed_is_one_error_line_exit_1_and_nothing_written(
    tmp_path, image_classifier, capsys
):
    folder = class_folders(tmp_path / "images", broken=2)
    code = predict(image_classifier, folder, tmp_path / "out", "--max_bad_examples", "1")
    err = capsys.readouterr().err
    assert code == 1
    assert error_lines(err) == [
        f"error: 2 of 8 examples in {folder} cannot be decoded, more than --max_bad_examples "
        "1 allows (1); first: red/broken-0.png, red/broken-1.png"
    ]
    assert not (tmp_path / "out").exists()


def test_a_speech_folder_is_transcribed_as_served_and_scored_by_trainings_wer(
    tmp_path, demo_assets
):
    import jiwer
    from transformers import AutoTokenizer

    source = demo_assets.dataset_dir / "test"
    folder = tmp_path / "clips"
    folder.mkdir()
    with (source / "metadata.csv").open() as handle:
        rows = list(csv.DictReader(handle))[:2]
    for row in rows:
        (folder / row["file_name"]).write_bytes((source / row["file_name"]).read_bytes())
    (folder / "metadata.csv").write_text(
        "file_name,transcription\n" + "".join(f"{r['file_name']},{r['transcription']}\n"
                                              for r in rows))  # fmt: skip
    assert predict(demo_assets.model_dir, folder, tmp_path / "out") == 0

    lines = lines_of(tmp_path / "out" / "predictions.jsonl")
    assert [line["id"] for line in lines] == [row["file_name"] for row in rows]
    assert [line["reference"] for line in lines] == [row["transcription"] for row in rows]
    files = [{"b64": base64.b64encode((folder / r["file_name"]).read_bytes()).decode()}
             for r in rows]  # fmt: skip
    assert [line["prediction"] for line in lines] == served(demo_assets.model_dir, files)
    tokenizer = AutoTokenizer.from_pretrained(demo_assets.model_dir)
    pairs = [(tokenizer.normalize(line["reference"]), tokenizer.normalize(
        line["prediction"]["text"])) for line in lines]  # fmt: skip
    wer = 100 * jiwer.wer([r for r, _ in pairs], [p for _, p in pairs])
    results = json.loads((tmp_path / "out" / "test_results.json").read_text())
    assert results == {"test_wer": pytest.approx(wer), "test_samples": 2}


def test_a_saved_dataset_split_is_predicted_with_its_class_label_names(tmp_path, text_classifier):
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Value

    features = Features({"text": Value("string"),
                         "label": ClassLabel(names=["negative", "positive"])})  # fmt: skip
    rows = {"text": ["lovely .", "dreadful .", "fine ."], "label": [1, 0, 1]}
    DatasetDict({"test": Dataset.from_dict(rows, features=features)}).save_to_disk(
        tmp_path / "saved"
    )
    assert predict(text_classifier, tmp_path / "saved", tmp_path / "out") == 0
    lines = lines_of(tmp_path / "out" / "predictions.jsonl")
    assert [(line["id"], line["reference"]) for line in lines] == [
        (0, "positive"), (1, "negative"), (2, "positive")]  # fmt: skip
    expected = served(text_classifier, [{"text": t} for t in rows["text"]])
    assert_same_predictions([line["prediction"] for line in lines], expected)

    assert predict(text_classifier, tmp_path / "saved", tmp_path / "out", "--split", "train") == 2


def test_a_bad_command_line_is_one_error_line_and_exit_2_before_the_model_loads(
    tmp_path, text_classifier, capsys
):
    source = tmp_path / "test.jsonl"
    source.write_text('{"text": "fine ."}\n')
    (tmp_path / "table.csv").write_text("text\nfine .\n")
    (tmp_path / "a-file").write_text("")
    out = tmp_path / "out"
    cases = [
        ([tmp_path / "nowhere", source, out], f"{tmp_path / 'nowhere'} is not a model folder"),
        ([text_classifier, tmp_path / "missing.jsonl", out], "missing.jsonl does not exist"),
        ([text_classifier, tmp_path / "table.csv", out], "is neither a folder of media files"),
        (
            [text_classifier, source, tmp_path / "a-file"],
            "a-file is a file: OUTPUT is a folder",
        ),
        (
            [text_classifier, source, out, "--batch_size", "0"],
            "--batch_size must be at least 1",
        ),
        ([text_classifier, source, out, "--max_bad_examples", "x"], '--max_bad_examples "x"'),
        (
            [text_classifier, source, out, "--parameters", "[1]"],
            "--parameters [1]: give a JSON",
        ),
        ([text_classifier, source, "gs://"], "gs:// names no bucket"),
    ]
    for argv, message in cases:
        assert predict(*argv) == 2, argv
        lines = error_lines(capsys.readouterr().err)
        assert len(lines) == 1 and message in lines[0], (argv, lines)
    assert not out.exists()


def test_a_gs_model_is_downloaded_and_predictions_go_to_a_gs_output(tmp_path, text_classifier, gcs):
    open_store(f"gs://{BUCKET}/predict/model").upload(text_classifier)
    source = tmp_path / "test.jsonl"
    source.write_text('{"id": "x", "text": "fine .", "label": "positive"}\n')
    assert predict(f"gs://{BUCKET}/predict/model", source, f"gs://{BUCKET}/predict/run-1") == 0
    store = open_store(f"gs://{BUCKET}/predict/run-1")
    assert sorted(store.list_files()) == ["predictions.jsonl", "test_results.json"]
    (line,) = [json.loads(x) for x in store.read_text("predictions.jsonl").splitlines()]
    assert (line["id"], line["reference"]) == ("x", "positive")
    results = json.loads(store.read_text("test_results.json"))
    assert results["test_accuracy"] == (1.0 if line["prediction"]["label"] == "positive" else 0.0)
