"""The flags of each task (`--task`), beside the flags every task reads: the dataclasses its
parser is built from and the run configuration holds (trainer/settings/run_config.py). They
live below the tasks, so reading a run's configuration imports no task module (nor transformers
or torch). A new task adds its flags here, one line to `TASK_FLAGS`, and its module in
trainer/tasks/ (docs/tasks.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from trainer.common.flag_fields import flag

DEFAULT_TASK = "speech-recognition"


@dataclass(frozen=True)
class ClassificationArguments:
    label_column_name: str = flag(
        "label", "Column with the class: a ClassLabel, or values such as positive."
    )
    class_weights: str | None = flag(
        None,
        "Weight the loss per class: balanced (inverse frequency in the training "
        "split), or one weight per label in label-id order, e.g. 1,2.5,1.",
    )

    def __post_init__(self) -> None:
        if self.class_weights is not None:
            parse_class_weights(self.class_weights)


def parse_class_weights(text: str) -> str | tuple[float, ...]:
    if text.strip() == "balanced":
        return "balanced"
    try:
        weights = tuple(float(part) for part in text.split(","))
    except ValueError:
        weights = ()
    if not weights or not all(weight > 0 and math.isfinite(weight) for weight in weights):
        raise ValueError(
            f'--class_weights "{text}": use balanced, or one positive number per label '
            "separated by commas (e.g. 1,2.5,1)."
        )
    return weights


@dataclass(frozen=True)
class ImageArguments(ClassificationArguments):
    image_column_name: str = flag("image", "Column with the image.")
    augment: bool = flag(False, "Random resized crop and horizontal flip of training images.")


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
        "Join the columns of --text_column_name into one text with this "
        "separator (run_classification.py's way to use several columns).",
    )
    joined_text_columns: str | None = flag(
        None,
        "Columns separated by commas, joined into one text with "
        "--text_column_delimiter (a space if not given): run_classification.py's "
        "--text_column_names. In place of --text_column_name.",
    )
    max_seq_length: int = flag(128, "Longer texts are truncated to this many tokens.")
    train_file: str | None = flag(
        None,
        "A .csv, .tsv, .jsonl, .json or .parquet file of training examples, in "
        "place of --dataset_name (run_glue.py's flag): the split train.",
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


@dataclass(frozen=True)
class SpeechArguments:
    audio_column_name: str = flag("audio", "Column with the audio.")
    text_column_name: str = flag("text", "Column with the transcription (Common Voice: sentence).")
    language: str | None = flag(
        None,
        "Spoken language, by name or code (english, en, ...); without it, "
        "generate() detects each clip's (English-only checkpoints need none).",
    )
    whisper_task: Literal["transcribe", "translate"] = flag(
        "transcribe",
        "Whisper's own task: transcribe or translate (multilingual checkpoints; "
        "English-only *.en checkpoints only transcribe, with no task token).",
    )
    max_duration_in_seconds: float | None = flag(
        None, "Drop longer clips (default: the model's input window, 30 s for Whisper)."
    )
    min_duration_in_seconds: float = flag(0.0, "Drop shorter clips.")
    do_lower_case: bool = flag(False, "Lower-case training targets.")
    do_remove_punctuation: bool = flag(False, "Remove punctuation from training targets.")
    do_normalize_eval: bool = flag(
        True, "Normalise predictions and references (Whisper's normaliser) for WER."
    )
    freeze_encoder: bool = flag(False, "Train the decoder only (keeps the audio encoder fixed).")
    log_mel_on: Literal["auto", "loader", "device"] = flag(
        "auto",
        "Where log-mel features are computed: in the data loader, on the "
        "training process's device, or auto (the device when it is a GPU).",
    )

    def __post_init__(self) -> None:
        if self.max_duration_in_seconds is not None and self.max_duration_in_seconds <= 0:
            raise ValueError("--max_duration_in_seconds must be positive.")
        if (
            self.max_duration_in_seconds is not None
            and self.min_duration_in_seconds >= self.max_duration_in_seconds
        ):
            raise ValueError(
                "--min_duration_in_seconds must be smaller than --max_duration_in_seconds."
            )


TaskOptions = SpeechArguments | ImageArguments | TextArguments

TASK_FLAGS: dict[str, type[TaskOptions]] = {
    "image-classification": ImageArguments,
    "speech-recognition": SpeechArguments,
    "text-classification": TextArguments,
}
"""`--task` value -> the dataclass of its own flags."""


def task_names() -> list[str]:
    return sorted(TASK_FLAGS)
