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
from typing import TYPE_CHECKING

from trainer.common.errors import UserError
from trainer.data.bad_examples import NAMES_SHOWN, check_limit, skip_counted
from trainer.data.checks import EVALUATION_SPLITS, check_columns, split_names
from trainer.data.sources import FILES, LocalLayout, table_column
from trainer.data.streams import is_stream
from trainer.tasks.base import named_files_layout
from trainer.tasks.classification import ClassificationTask, LabelSet
from trainer.tasks.text_classification.serving import top_label
from trainer.tasks.text_classification.spec import SPEC, TextArguments

if TYPE_CHECKING:
    from datasets import Dataset

SENTENCE_PAIRS = (
    ("sentence1", "sentence2"),  # GLUE's MRPC, RTE, WNLI, STS-B; PAWS
    ("question1", "question2"),  # GLUE's QQP
    ("question", "sentence"),  # GLUE's QNLI
    ("premise", "hypothesis"),  # GLUE's MNLI, SNLI, XNLI
    ("question", "passage"),  # SuperGLUE's BoolQ
)
"""Column pairs that are the two texts of one example, in their order."""

GLUE = ("nyu-mll/glue", "glue")
GLUE_UNLABELLED_SPLITS = ("test", "test_matched", "test_mismatched")
"""GLUE's test splits: their labels are hidden (every one is -1)."""
GLUE_TEXT_COLUMNS = {
    "cola": ("sentence",), "sst2": ("sentence",), "mrpc": ("sentence1", "sentence2"),
    "qqp": ("question1", "question2"), "stsb": ("sentence1", "sentence2"),
    "mnli": ("premise", "hypothesis"), "mnli_matched": ("premise", "hypothesis"),
    "mnli_mismatched": ("premise", "hypothesis"), "qnli": ("question", "sentence"),
    "rte": ("sentence1", "sentence2"), "wnli": ("sentence1", "sentence2"),
    "ax": ("premise", "hypothesis"),
}  # fmt: skip
"""GLUE's configs -> their text columns (run_glue.py's task_to_keys); each also has `label`
and `idx`. Known without loading the dataset, so its columns are checked before launch."""


class TextClassificationTask(ClassificationTask):
    spec = SPEC
    input_column = "text"
    input_flag = "text_column_name"
    predicted_top_k = 1
    options: TextArguments

    def file_layout(self) -> LocalLayout | None:
        return named_files_layout(self.options.data_files(), self.data_args.dataset_name)

    @classmethod
    def settled_options(cls, options: TextArguments) -> TextArguments:
        return options.settled()

    def check_inputs(self) -> list[str]:
        return super().check_inputs() + self.check_glue()

    def check_glue(self) -> list[str]:
        """GLUE's test splits have no labels: evaluating on one (`--eval_split_name` defaults
        to test) would fail in every training process, or score nothing. A config's columns
        are known (`GLUE_TEXT_COLUMNS`): a column it lacks is refused here rather than in
        every training process, and one half of its pair is a notice."""
        name, config = self.data_args.dataset_name, self.data_args.dataset_config_name
        if name not in GLUE:
            return []
        hidden = [s for s in split_names(self.data_args.eval_split_name)
                  if s in GLUE_UNLABELLED_SPLITS]  # fmt: skip
        if hidden:
            held_out = "validation_matched" if config == "mnli" else "validation"
            raise UserError(
                f'Split "{hidden[0]}" of {name} has no labels (GLUE hides them: every one is '
                f"-1): evaluate on --eval_split_name {held_out}."
            )
        if config not in GLUE_TEXT_COLUMNS:
            return []  # the Hub says what it lacks when it is loaded
        columns = {*GLUE_TEXT_COLUMNS[config], "label", "idx"}
        check_columns(columns, self.column_flags(), f"{name} {config}", self.column_hint)
        return self.column_notices(columns)

    def check_evaluation_labels(self, layout: LocalLayout, where: object) -> None:
        """An evaluation split of local tables whose labels are all missing (a benchmark's
        test split saved to a file: -1, empty cells, no label column) is refused before
        launch, naming a split that has labels: the training processes would refuse it
        only after the nodes started, or a -1 read as a class would score nothing."""
        spec = self.data_args.eval_split_name
        tables = Labels(layout, self.options.label_column_name, self.data_args.train_split_name)
        hidden = next(((s, why) for s in split_names(spec) if (why := tables.missing(s))), None)
        if hidden is None:
            return
        split, why = hidden
        read = {*split_names(spec), *split_names(self.data_args.train_split_name)}
        others = [s for s in (*EVALUATION_SPLITS, *sorted(layout.splits)) if s not in read]
        labelled = next((s for s in others if s in layout.splits and tables.present(s)), None)
        instead = (
            f"evaluate on --eval_split_name {labelled}"
            if labelled
            else "--train_val_split 0.15 evaluates on a part of the training split; "
            "--eval_strategy no trains without"
        )
        raise UserError(f'Split "{split}" of {where} has no labels ({why}): {instead}.')

    def column_hint(self, flag: str, columns: list[str]) -> str:
        """A text column not found where the dataset has a known sentence pair: how to
        name the pair."""
        pairs = [pair for pair in SENTENCE_PAIRS if set(pair) <= set(columns)]
        if flag != self.input_flag or not pairs:
            return ""
        return f" Its sentence pair: --text_column_name {','.join(pairs[0])}."

    def column_warning(self, columns: list[str]) -> str | None:
        """One text column that is half of a known sentence pair the dataset has: the model
        would learn from one sentence of each pair, without a word; say so."""
        text = self.options.text_columns()
        halves = [pair for pair in SENTENCE_PAIRS if set(pair) <= set(columns) and text[0] in pair]
        if len(text) != 1 or not halves:
            return None
        other = next(column for column in halves[0] if column != text[0])
        return (
            f"warning: --text_column_name {text[0]} trains on one text of each example, but "
            f"the dataset also has {other}, the other half of the pair: "
            f"--text_column_name {','.join(halves[0])} trains on both"
        )

    prediction_value = staticmethod(top_label)

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

    def prepare_split(self, dataset: Dataset, spec: str) -> Dataset:
        """Also skips, and counts, the examples with a missing text (an empty CSV cell, a
        JSON null), up to `--max_bad_examples`, as undecodable clips and images are: the
        collator's tokenizer would fail the batch that holds one, mid-training."""
        dataset = super().prepare_split(dataset, spec)
        missing = dataset.map(
            _missing_texts,
            batched=True,
            input_columns=list(self.input_renames().values()),
            remove_columns=dataset.column_names,
            num_proc=self.data_args.preprocessing_num_workers,
            desc="Checking that every example has its text",
        )["missing"]
        bad = [index for index, gone in enumerate(missing) if gone]
        if not bad:
            return dataset
        where = f"split {spec} of {self.data_args.dataset_name or FILES}"
        names = ", ".join(f"example {index}" for index in bad[:NAMES_SHOWN])
        names += ", ..." if len(bad) > NAMES_SHOWN else ""
        allowed = self.data_args.max_bad_examples
        limit = check_limit(len(bad), len(dataset), f"examples in {where}", allowed, names,
                            "have no text", "has a text")  # fmt: skip
        training = where if spec == self.data_args.train_split_name else None
        skipped = f"examples in {where} without a text (first: {names})"
        return dataset.select(skip_counted(len(dataset), bad, skipped, allowed, limit, training))

    def load_datasets(self, processor) -> tuple[Dataset, Dataset | None]:
        """The classification splits, with each example's token count where
        `--train_sampling_strategy` groups by length (`--group_by_length`): the Trainer's
        samplers would look for `input_ids`, which raw rows lack (the collator tokenises)."""
        train, evaluation = super().load_datasets(processor)
        if self.length_column is None or is_stream(train):  # a stream is refused at launch
            return train, evaluation
        train = self._with_token_counts(train, processor)
        if evaluation is not None:  # the Trainer groups evaluation batches by length too
            evaluation = self._with_token_counts(evaluation, processor)
        return train, evaluation

    def _with_token_counts(self, dataset: Dataset, tokenizer) -> Dataset:
        """The tokens the collator will give each example (truncated to `--max_seq_length`,
        special tokens and a pair's two texts included), in the length column."""
        encode = self.input_encoder(tokenizer, padded=False)
        columns = list(self.input_renames().values())

        def token_counts(*texts: list) -> dict[str, list[int]]:
            inputs = texts[0] if len(texts) == 1 else list(zip(*texts, strict=True))
            return {self.length_column: [len(ids) for ids in encode(inputs)["input_ids"]]}

        return dataset.map(
            token_counts, batched=True, input_columns=columns, desc="Counting tokens"
        )

    def input_renames(self) -> dict[str, str]:
        """One column is `text`; more are `text`, `text_pair`, `text_2`... in their order."""
        names = ["text", "text_pair", *(f"text_{i}" for i in range(2, 64))]
        return dict(zip(self.options.text_columns(), names, strict=False))

    def input_encoder(self, tokenizer, padded: bool = True):
        """Collator-shaped inputs (texts, or tuples of a row's texts) -> token ids, as a batch
        (padded tensors), or unpadded lists to count each example's tokens."""
        tokenize = partial(
            tokenizer,
            truncation=True,
            max_length=self.options.max_seq_length,
            **({"padding": True, "return_tensors": "pt"} if padded else {}),
        )
        delimiter = self.options.text_column_delimiter
        if len(self.options.text_columns()) == 1:
            return tokenize
        if delimiter is not None:
            return lambda texts: tokenize([delimiter.join(map(str, row)) for row in texts])
        # A pair: the tokenizer marks the two (BERT: [SEP] and token type ids), and
        # truncation takes tokens from the longer one, as run_glue.py's tokenisation does.
        return lambda pairs: tokenize([a for a, _ in pairs], [b for _, b in pairs])


def _missing_texts(*columns: list) -> dict[str, list[bool]]:
    """Per example of a batch (its text columns' values): whether one of them is no text."""
    rows = zip(*columns, strict=True)
    return {"missing": [any(not isinstance(text, str) for text in row) for row in rows]}


class Labels:
    """The label column of a layout's tables, read split by split when asked (only the
    evaluation split, and the others only when it has no labels)."""

    def __init__(self, layout: LocalLayout, column: str, train_spec: str) -> None:
        self.layout, self.column, self.train_spec = layout, column, train_spec
        self.read: dict[str, list | None] = {}

    def values(self, split: str) -> list | None:
        """The split's labels; None when its tables cannot be read here."""
        if split not in self.read:
            columns = [table_column(path, self.column) for path in self.layout.splits[split]]
            unread = any(column is None for column in columns)
            self.read[split] = None if unread else [v for column in columns for v in column]
        return self.read[split]

    def missing(self, split: str) -> str | None:
        """Why the split has no labels (for the error line), or None when it has them, has
        no examples, or cannot be read here (the training processes judge those)."""
        if self.column not in self.layout.columns_of([split]):
            return f'no "{self.column}" column'
        values = self.values(split)
        if not values:
            return None
        empty = [unset(value) for value in values]
        if all(empty):
            return "every one is empty"
        minus_one = all(e or value == -1 for e, value in zip(empty, values, strict=True))
        if not minus_one or self.minus_one_is_a_class():
            return None
        return "every one is -1" + (" or empty" if any(empty) else "")

    def present(self, split: str) -> bool:
        """The split has labels: read here, with examples, not all missing."""
        return bool(self.values(split)) and self.missing(split) is None

    def minus_one_is_a_class(self) -> bool:
        """-1 is datasets' "no label", unless the training split has it (a -1/0/1 scale)."""
        train = [self.values(split) for split in split_names(self.train_spec)]
        return any(values is None or -1 in values for values in train)


def unset(value: object) -> bool:
    """An empty label: None, NaN or blank text."""
    if isinstance(value, float):
        return math.isnan(value)
    return value is None or (isinstance(value, str) and not value.strip())
