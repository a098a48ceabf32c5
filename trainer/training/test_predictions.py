"""`--do_predict`: the delivered model's predictions over `--test_split_name`, after delivery
(trainer/training/run.py's `finish`), so a failure here loses nothing trained.

Every rank predicts its share with the Trainer's own `predict`, as evaluation does (speech
generates, as its evaluation does); the global main process writes predictions.jsonl (one
line per example in the split's order: `{"id", "reference", "prediction"}`, the prediction
shaped as the server answers) and test_results.json (the task's metrics with a `test_`
prefix, as `Trainer.save_metrics` writes them), the same files `python -m trainer.predict`
writes, so one reader reads both.

They go into a folder beside the model, `<model location>-test/` (`<output_dir>/model-test`,
or `<baseOutputDirectory>/model-test/` on Vertex AI): not into the model's own folder, whose
manifest, written last at delivery, lists exactly the model's files.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

from trainer.data.example_ids import EXAMPLE_ID
from trainer.storage.file_modes import make_files_readable
from trainer.storage.store import open_store

PREDICTIONS = "predictions.jsonl"
RESULTS = "test_results.json"
"""The names `python -m trainer.predict` gives its files (trainer/predict/__main__.py)."""


def test_location(model: str) -> str:
    """Where the files go: a sibling of the model's location (local, /gcs/ or gs://)."""
    return model.rstrip("/") + "-test"


def predict_test(run) -> None:
    """With `--do_predict`, predict the test split of `run` (a trainer/training/run.py
    `TrainingRun`) and store the two files beside the delivered model."""
    if not run.config.training.values.get("do_predict"):
        return
    trainer, task = run.trainer, run.task
    processor = trainer.processing_class
    with trainer.args.main_process_first(desc="loading the test split"):
        test = task.load_test_split(processor)
    if trainer.compute_metrics is None:  # a run without an evaluation split has none yet
        trainer.compute_metrics = task.compute_metrics(processor)
    with in_split_order(trainer.args):
        output = trainer.predict(test, metric_key_prefix="test")
    trainer.save_metrics("test", {**output.metrics, "test_samples": len(test)})  # rank 0 writes
    if not run.place.is_global_main:
        return
    local = Path(trainer.args.output_dir)
    values = task.predicted_values(output.predictions, processor)
    write_predictions(local / PREDICTIONS, test[EXAMPLE_ID], task.references(test), values)
    make_files_readable(local, [PREDICTIONS, RESULTS])
    destination = test_location(run.config.locations.model)
    open_store(destination).upload(local, [PREDICTIONS, RESULTS])
    print(f"test predictions: {len(test)} examples of split {task.data_args.test_split_name}; "
          f"{PREDICTIONS} and {RESULTS} saved to {destination}", flush=True)  # fmt: skip


@contextmanager
def in_split_order(args):
    """The Trainer's evaluation sampler reads `--train_sampling_strategy` too: under
    `group_by_length` it groups a split's examples by length, which would hand predictions back
    in another order than the ids and references (and needs a length column a test split does
    not get: a ValueError after delivery). Predictions are made in the split's own order."""
    strategy = args.train_sampling_strategy
    args.train_sampling_strategy = "sequential"
    try:
        yield
    finally:
        args.train_sampling_strategy = strategy


def write_predictions(path: Path, ids, references: list, predictions: list[dict]) -> None:
    """One JSON line per example, in the split's order."""
    with path.open("w", encoding="utf-8") as lines:
        for example_id, reference, prediction in zip(ids, references, predictions, strict=True):
            line = {"id": example_id, "reference": reference, "prediction": prediction}
            lines.write(json.dumps(line, ensure_ascii=False) + "\n")
