"""The text classification task's spec: BERT-style encoders, their flags, the layout of a
folder of tables, and how a delivered classifier serves and is scored (the training code:
trainer/tasks/text.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from trainer.common.errors import UserError
from trainer.common.flag_fields import flag
from trainer.data.sources import LocalLayout, table_header
from trainer.tasks.classification_spec import (
    ClassificationArguments,
    ClassificationPredictor,
    is_text_classifier,
)
from trainer.tasks.instance_media import InstanceError
from trainer.tasks.predictor import Prepared
from trainer.tasks.task_spec import TaskSpec

TABLE_FORMATS = {
    ".csv": ("csv", {}),
    ".tsv": ("csv", {"delimiter": "\t"}),
    ".jsonl": ("json", {}),
    ".json": ("json", {}),
    ".parquet": ("parquet", {}),
}
"""Local file suffix -> `datasets` builder and its arguments."""


@dataclass(frozen=True)
class TextArguments(ClassificationArguments):
    text_column_name: str = flag(
        "text",
        "Column with the text; two columns separated by a comma are a sentence "
        "pair (GLUE's sentence1,sentence2), tokenised as a pair unless "
        "--text_column_delimiter joins them.",
    )
    text_column_delimiter: str | None = flag(
        None,
        "Join the columns of --text_column_name with this separator.",
    )
    joined_text_columns: str | None = flag(
        None,
        "Comma-separated columns joined with --text_column_delimiter (or a space): "
        "run_classification.py's --text_column_names.",
    )
    max_seq_length: int = flag(128, "Longer texts are truncated to this many tokens.")
    train_file: str | None = flag(
        None,
        "A .csv, .tsv, .jsonl, .json or .parquet training file, in place of "
        "--dataset_name (run_glue.py's flag).",
    )
    validation_file: str | None = flag(
        None, "With --train_file: the evaluation examples (the split validation)."
    )
    test_file: str | None = flag(None, "With --train_file: more examples, the split test.")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_seq_length < 1:
            raise ValueError("--max_seq_length must be at least 1.")
        if self.joined_text_columns is not None and self.text_column_name != "text":
            raise ValueError("--joined_text_columns (run_classification.py's "
                             "--text_column_names) and --text_column_name both name the text "
                             "column(s): give one.")  # fmt: skip
        columns = self.text_columns()
        if len(columns) != len(set(columns)) or not all(columns):
            raise ValueError(f'--text_column_name "{self.text_column_name}": name each '
                             "column once, separated by commas.")  # fmt: skip
        if len(columns) > 2 and self.text_column_delimiter is None:
            raise ValueError(
                f"--text_column_name names {len(columns)} columns: a text or a pair is one or "
                "two; give --text_column_delimiter to join more into one text."
            )

    def settled(self) -> TextArguments:
        """--joined_text_columns as the other flags say it: the columns as
        --text_column_name, joined by --text_column_delimiter (a space unless given)."""
        if self.joined_text_columns is None:
            return self
        # As transformers' examples/pytorch/text-classification/run_classification.py does:
        # its preprocess_function starts each example's "sentence" with the first column's
        # value and appends `text_column_delimiter + value` for each further column; its
        # --text_column_delimiter defaults to " ". The tasks join at tokenisation
        # (trainer/tasks/text.py input_encoder), in the training processes and the checks.
        delimiter = " " if self.text_column_delimiter is None else self.text_column_delimiter
        return replace(self, text_column_name=self.joined_text_columns,
                       text_column_delimiter=delimiter, joined_text_columns=None)  # fmt: skip

    def text_columns(self) -> list[str]:
        return [column.strip() for column in self.text_column_name.split(",")]

    def data_files(self) -> dict[str, Path]:
        """Split name -> file, for the files given by flag (empty for --dataset_name)."""
        files = {"train": self.train_file, "validation": self.validation_file,
                 "test": self.test_file}  # fmt: skip
        return {split: Path(path).expanduser() for split, path in files.items() if path}


def detect_local_layout(directory: Path) -> LocalLayout:
    """A folder holding one table file per split, all in one format."""
    files = sorted(p for p in directory.iterdir() if p.is_file() and p.suffix in TABLE_FORMATS)
    if not files:
        raise UserError(
            f"{directory} holds no data files: put one {', '.join(TABLE_FORMATS)} file per "
            "split in it (train.csv, test.csv, ...)."
        )
    return table_layout({path.stem: path for path in files}, str(directory))


def table_layout(files: dict[str, Path], where: str) -> LocalLayout:
    """Split name -> table file, all in one format; the columns all of them have."""
    suffixes = sorted({path.suffix for path in files.values()})
    if len(suffixes) > 1:
        raise UserError(f"{where}: {' and '.join(suffixes)} files mixed; use one format.")
    builder, load_kwargs = TABLE_FORMATS[suffixes[0]]
    headers = {split: frozenset(table_header(path)) for split, path in files.items()}
    return LocalLayout(
        builder=builder,
        splits={split: [path] for split, path in files.items()},
        columns=frozenset.intersection(*headers.values()),
        load_kwargs=load_kwargs,
        split_columns=headers,
    )


def top_label(labels: list[str], scores: list[float], truncated: bool = False) -> dict:
    """The task's answer (the server's, `--do_predict`'s, `python -m trainer.predict`'s): the
    likeliest label and its score; `truncated` when the text was longer than the model takes
    (its start was scored)."""
    answer: dict[str, Any] = {"label": labels[0], "score": scores[0]}
    if truncated:
        answer["truncated"] = True
    return answer


class TextPredictor(ClassificationPredictor):
    pipeline_task = "text-classification"
    media_key = "text"
    call_kwargs = {"truncation": True}
    raw_media_types = ("text/plain",)

    def __init__(self, pipe, task: str) -> None:
        super().__init__(pipe, task)
        self.tokenizer_lock = threading.Lock()
        """One tokenizer call at a time: a fast tokenizer switches its truncation setting
        in place (on for the model's input, off to measure the whole text), and a switch
        during another thread's call fails it ("Already borrowed")."""

    @classmethod
    def media_extensions(cls) -> frozenset[str]:
        return frozenset({".txt"})

    @classmethod
    def row_instance(cls, row: dict) -> Callable[[], object]:
        """A saved dataset's `text` (and `text_pair` for a pair model)."""
        text = {"text": row["text"], "text_pair": row.get("text_pair")}
        return lambda: {key: value for key, value in text.items() if value is not None}

    def decoded(self, instance: object) -> str | dict:
        instance = self.fields(instance)
        if not isinstance(instance, dict) or not isinstance(instance.get("text"), str):
            raise InstanceError('an instance needs "text" (a string)')
        # Other fields are left alone (a batch job's key beside the instance), but not one
        # that looks like a misspelt text_pair: a pair model would score half the pair.
        misspelt = sorted(key for key in set(instance) - {"text", "text_pair"}
                          if key.startswith("text"))  # fmt: skip
        if misspelt or not isinstance(instance.get("text_pair", ""), str):
            raise InstanceError('an instance holds "text" and, for a pair, "text_pair" strings'
                                + (f" (not {misspelt[0]!r})" if misspelt else ""))  # fmt: skip
        if instance.get("text_pair") is None:
            return instance["text"]
        return {"text": instance["text"], "text_pair": instance["text_pair"]}

    def fields(self, instance: object) -> object:
        """A bare string, a `{"b64": ...}` text or a raw body's bytes as `{"text": ...}`;
        anything else as it is."""
        if isinstance(instance, str):
            return {"text": instance}
        if isinstance(instance, bytes) or (isinstance(instance, dict) and set(instance) == {
                "b64"}):  # fmt: skip
            try:
                return {"text": self.media(instance).decode()}
            except UnicodeDecodeError:
                raise InstanceError("the body is not UTF-8 text" if isinstance(instance, bytes)
                                    else "the b64 text is not UTF-8") from None  # fmt: skip
        return instance

    def prepared(self, pipeline_input: str | dict) -> Prepared:
        text, pair = (pipeline_input["text"], pipeline_input["text_pair"]) if isinstance(
            pipeline_input, dict) else (pipeline_input, None)  # fmt: skip
        with self.tokenizer_lock:
            tokens = self.pipe.tokenizer(text, pair, verbose=False)["input_ids"]
            features = self.features(pipeline_input)
        return Prepared(features, truncated=len(tokens) > self.pipe.tokenizer.model_max_length)

    def predict(self, batch: list[Prepared], parameters: dict[str, Any]) -> list[dict]:
        outputs = self.pipeline_outputs(batch, top_k=1)
        answers = []
        for item, output in zip(batch, outputs, strict=True):
            best = output[0] if isinstance(output, list) else output
            answers.append(top_label([best["label"]], [best["score"]], item.truncated))
        return answers

    def warm_up_input(self) -> str:
        return "warm up"

    def best_label(self, answer: dict) -> str:
        return answer["label"]


TEXT_CLASSIFICATION = TaskSpec(
    name="text-classification",
    flags=TextArguments,
    training="trainer.tasks.text:TextClassificationTask",
    claims_model=is_text_classifier,
    detect_layout=detect_local_layout,
    predictor=TextPredictor,
    # query and value projections, as in the LoRA paper (Hu et al. 2021, sec. 7.1)
    lora_targets={"bert": ("query", "value"), "roberta": ("query", "value")},
    recipes=("bert-sentiment.yaml",),
)
