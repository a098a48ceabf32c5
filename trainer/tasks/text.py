"""Text classification (BERT or any `AutoModelForSequenceClassification`): accuracy, macro F1.

Texts are tokenised in the collator, batch by batch: truncated to `--max_seq_length` tokens and
padded to the batch's longest (dynamic padding), so short texts cost short batches and no pass
over the corpus writes token ids before training.

Data sources (`--dataset_name`): a hub dataset, or a local directory holding one file per
split, all in one format: `train.csv`, `test.csv`, ... (or `.tsv`, `.jsonl`, `.json` with JSON
Lines or one array of objects, `.parquet`), split names being the file names without suffix.
Labels may be strings ("positive") or integers; the label set is the training split's sorted
distinct labels unless the dataset declares a `ClassLabel`.
"""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

from trainer.common.errors import UserError
from trainer.data.sources import LocalLayout, table_header
from trainer.settings.task_flags import TextArguments
from trainer.tasks.classification import ClassificationTask, LabelSet

TABLE_FORMATS = {
    ".csv": ("csv", {}),
    ".tsv": ("csv", {"delimiter": "\t"}),
    ".jsonl": ("json", {}),
    ".json": ("json", {}),
    ".parquet": ("parquet", {}),
}
"""Local file suffix -> `datasets` builder and its arguments."""


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
        return table_layout({path.stem: path for path in files}, str(directory))

    def file_layout(self) -> LocalLayout | None:
        files = self.options.data_files()
        if not files:
            return None
        if self.data_args.dataset_name is not None:
            raise UserError("--train_file and --dataset_name both name the data: give one.")
        if "train" not in files:
            raise UserError("--validation_file and --test_file go with --train_file.")
        for path in files.values():
            if path.suffix not in TABLE_FORMATS or not path.is_file():
                raise UserError(
                    f"Data file {path} not found, or not one of {', '.join(TABLE_FORMATS)}."
                )
        return table_layout(files, "the files of --train_file, --validation_file, --test_file")

    def model_class(self):
        from transformers import AutoModelForSequenceClassification

        return AutoModelForSequenceClassification

    def sequence_length(self, config) -> int:
        return self.options.max_seq_length  # batches are padded to their longest text only

    def load_model_and_processor(self, labels: LabelSet, quantized: bool = True):
        from transformers import AutoTokenizer

        path = self.model_args.model_name_or_path
        tokenizer = AutoTokenizer.from_pretrained(path, cache_dir=self.model_args.cache_dir)
        model = self.model_class().from_pretrained(
            path, **self.pretrained_kwargs(labels, quantized)
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

    def input_renames(self) -> dict[str, str]:
        """One column is `text`; more are `text`, `text_pair`, `text_2`... in their order."""
        names = ["text", "text_pair", *(f"text_{i}" for i in range(2, 64))]
        return dict(zip(self.options.text_columns(), names, strict=False))

    def input_encoder(self, tokenizer):
        tokenize = partial(
            tokenizer,
            truncation=True,
            max_length=self.options.max_seq_length,
            padding=True,
            return_tensors="pt",
        )
        delimiter = self.options.text_column_delimiter
        if len(self.options.text_columns()) == 1:
            return tokenize
        if delimiter is not None:
            return lambda texts: tokenize([delimiter.join(map(str, row)) for row in texts])
        # A pair: the tokenizer marks the two (BERT: [SEP] and token type ids), and
        # truncation takes tokens from the longer one, as run_glue.py's tokenisation does.
        return lambda pairs: tokenize([a for a, _ in pairs], [b for _, b in pairs])


def table_layout(files: dict[str, Path], where: str) -> LocalLayout:
    """Split name -> table file, all in one format; the columns all of them have."""
    suffixes = sorted({path.suffix for path in files.values()})
    if len(suffixes) > 1:
        raise UserError(f"{where}: {' and '.join(suffixes)} files mixed; use one format.")
    builder, load_kwargs = TABLE_FORMATS[suffixes[0]]
    headers = [frozenset(table_header(path)) for path in files.values()]
    return LocalLayout(
        builder=builder,
        splits={split: [path] for split, path in files.items()},
        columns=frozenset.intersection(*headers),
        load_kwargs=load_kwargs,
    )


TASK = TextClassificationTask
