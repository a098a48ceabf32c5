"""`python -m trainer.predict` as a user runs it: its own process over a folder of .txt files
with a metadata.csv of labels and one file that is not UTF-8. It exits 0, writes one line per
readable file in name order with what the server's predictor answers for that file, skips
and names the broken one, and scores accuracy over the lines."""

from __future__ import annotations

import base64
import json
import subprocess
import sys

import pytest

from tests.support.helpers import trainer_env
from tests.support.served_predictions import assert_same_predictions, served


def test_a_text_folder_is_predicted_skipping_a_broken_file_and_scored(
    tmp_path, text_classifier, demo_cache
):
    folder = tmp_path / "reviews"
    folder.mkdir()
    texts = {"a.txt": ("lovely room .", "positive"), "b.txt": ("rude staff .", "negative"),
             "c.txt": ("great view .", "positive")}  # fmt: skip
    for name, (text, _) in texts.items():
        (folder / name).write_text(text)
    (folder / "broken.txt").write_bytes(b"caf\xe9 latin-1")
    (folder / "metadata.csv").write_text(
        "file_name,label\n" + "".join(f"{n},{label}\n" for n, (_, label) in texts.items())
    )
    out = tmp_path / "out"
    env = trainer_env(demo_cache, OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-m", "trainer.predict", str(text_classifier), str(folder), str(out),
         "--max_bad_examples", "1"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == ["warning: skipped broken.txt: the b64 text is not UTF-8"]
    assert done.stdout.splitlines()[-1] == (
        f"predicted 3 of 4 examples, skipped 1: predictions.jsonl and test_results.json in {out}"
    )

    lines = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert [line["id"] for line in lines] == ["a.txt", "b.txt", "c.txt"]
    assert [line["reference"] for line in lines] == [label for _, label in texts.values()]
    files = [{"b64": base64.b64encode((folder / name).read_bytes()).decode()} for name in texts]
    assert_same_predictions([line["prediction"] for line in lines], served(text_classifier, files))
    hits = sum(line["prediction"]["label"] == line["reference"] for line in lines)
    results = json.loads((out / "test_results.json").read_text())
    assert results["test_accuracy"] == pytest.approx(hits / 3)
    assert results["test_samples"] == 3
