"""The text classification task's spec: BERT-style encoders, their flags, the layout of a
folder of tables, and how a delivered classifier serves and is scored (the training code:
training.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from trainer.common.flag_fields import flag
from trainer.data.sources import LocalLayout, table_folder_layout
from trainer.tasks.classification_spec import ClassificationArguments, is_text_classifier
from trainer.tasks.task_spec import TaskSpec
from trainer.tasks.text_classification.serving import TextPredictor


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
        # (training.py input_encoder), in the training processes and the checks.
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
    return table_folder_layout(directory, "train.csv, test.csv")


SPEC = TaskSpec(
    name="text-classification",
    flags=TextArguments,
    training="trainer.tasks.text_classification.training:TextClassificationTask",
    claims_model=is_text_classifier,
    detect_layout=detect_local_layout,
    predictor=TextPredictor,
    # query and value projections, as in the LoRA paper (Hu et al. 2021, sec. 7.1)
    lora_targets={"bert": ("query", "value"), "roberta": ("query", "value")},
    recipes=("bert-sentiment.yaml",),
)
