"""Text classification (BERT or any `AutoModelForSequenceClassification`): accuracy, macro F1.

Texts are tokenised in the collator, batch by batch: truncated to `--max_seq_length` tokens
and padded to the longest text of the batch (dynamic padding), so short texts cost short
batches and no pass over the corpus writes token ids before training.

Data sources (`--dataset_name`): a hub dataset, or a local directory holding one file per
split, all in one format: `train.csv`, `test.csv`, ... (or `.tsv`, or `.jsonl` with one
JSON object per line); the split names are the file names without their suffix. Labels
may be strings ("positive") or integers; the label set is the sorted distinct labels of
the training split unless the dataset declares a `ClassLabel`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from trainer.common.errors import UserError
from trainer.data.sources import LocalLayout, table_header
from trainer.tasks.classification import ClassificationArguments, ClassificationTask, LabelSet

TABLE_FORMATS = {
    ".csv": ("csv", {}),
    ".tsv": ("csv", {"delimiter": "\t"}),
    ".jsonl": ("json", {}),
}
"""Local file suffix -> `datasets` builder and its arguments."""


@dataclass
class TextArguments(ClassificationArguments):
    text_column_name: str = field(default="text", metadata={"help": "Column with the text."})
    max_seq_length: int = field(
        default=128,
        metadata={"help": "Longer texts are truncated to this many tokens."},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_seq_length < 1:
            raise ValueError("--max_seq_length must be at least 1.")


class TextClassificationTask(ClassificationTask):
    arguments_class = TextArguments
    input_column = "text"
    input_flag = "text_column_name"
    options: TextArguments

    @classmethod
    def detect_local_layout(cls, directory: Path) -> LocalLayout:
        files = sorted(p for p in directory.iterdir() if p.is_file() and p.suffix in TABLE_FORMATS)
        if not files:
            raise UserError(
                f"{directory} holds no data files: put one {', '.join(TABLE_FORMATS)} file per "
                "split in it (train.csv, test.csv, ...)."
            )
        suffixes = sorted({path.suffix for path in files})
        if len(suffixes) > 1:
            raise UserError(f"{directory} mixes {', '.join(suffixes)} files: use one format.")
        builder, load_kwargs = TABLE_FORMATS[suffixes[0]]
        columns = frozenset.intersection(*(frozenset(table_header(path)) for path in files))
        return LocalLayout(
            builder=builder,
            splits={path.stem: [path] for path in files},
            columns=columns,
            load_kwargs=load_kwargs,
        )

    def load_model_and_processor(self, labels: LabelSet):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        path = self.model_args.model_name_or_path
        tokenizer = AutoTokenizer.from_pretrained(path, cache_dir=self.model_args.cache_dir)
        model = AutoModelForSequenceClassification.from_pretrained(
            path, **self.pretrained_kwargs(labels)
        )
        limit = min(
            tokenizer.model_max_length,
            getattr(model.config, "max_position_embeddings", None) or math.inf,
        )
        if self.options.max_seq_length > limit:
            raise UserError(
                f"--max_seq_length {self.options.max_seq_length} exceeds the {limit} tokens "
                f"that {path} takes."
            )
        return model, tokenizer

    def input_encoder(self, tokenizer):
        return partial(
            tokenizer,
            truncation=True,
            max_length=self.options.max_seq_length,
            padding=True,
            return_tensors="pt",
        )


TASK = TextClassificationTask
