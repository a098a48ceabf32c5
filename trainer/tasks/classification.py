"""What image and text classification share: sources, the label set, metrics, class weights.

A classification task reads (input, label) pairs from a hub dataset or a local directory,
fine-tunes an `AutoModelFor...Classification` whose head is sized and named from the label
set, and scores predictions by accuracy and macro F1. The subclasses say only how their
local directories look, which model and processor to load, and how to batch inputs.

The label set has to exist before the model (its head has one output per label), and the
training program builds the model before it loads the datasets. So the raw training split
is loaded in `build_model_and_processor` on every rank, as the Hugging Face example
scripts do (`datasets` serialises concurrent builds of one cache with a file lock), and
`load_datasets` prepares it further inside `main_process_first`.
"""

from __future__ import annotations

import math
import os
from abc import abstractmethod
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from trainer.common.errors import UserError
from trainer.common.step_time import ForwardFlops, encoder_forward_flops
from trainer.data.example_ids import with_example_ids
from trainer.data.sources import (
    FILES,
    first_examples,
    load_split,
    select_source_columns,
    shard_index_of,
    split_off_evaluation,
)
from trainer.data.streams import is_stream
from trainer.tasks.base import Task
from trainer.tasks.classification_spec import LABEL, ClassificationArguments, parse_class_weights
from trainer.tasks.lora_adapters import eight_bit_loading
from trainer.tasks.metrics import label_metrics

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import EvalPrediction, PreTrainedModel, Trainer

LABELS_SHOWN = 20
"""How many labels the start-up line names (ImageNet has a thousand)."""


def _is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


@dataclass(frozen=True)
class LabelSet:
    """The classes the model predicts, and how a dataset's label values map to their ids: a
    `ClassLabel` feature's names and ids as they are; other label columns (strings such as
    "positive" in a CSV, or integers) the training split's sorted distinct values, which
    evaluation labels must be among."""

    names: tuple[str, ...]
    ids: Mapping[Any, int]
    """Label value as stored in the dataset -> id of the model's output."""
    source: str
    untrained: tuple[str, ...] = ()
    """ClassLabel names the training split has no example of (an imagefolder class folder
    that only an evaluation split has, say): the model gets an output for each, as the
    dataset declares them, but never learns to predict it."""

    @classmethod
    def from_split(cls, dataset: Dataset, source: str) -> LabelSet:
        from datasets import ClassLabel

        feature = dataset.features[LABEL]
        untrained = ()
        if isinstance(feature, ClassLabel):
            names = tuple(feature.names)
            ids = {i: i for i in range(len(names))}
            present = set(dataset.unique(LABEL))
            untrained = tuple(name for i, name in enumerate(names) if i not in present)
        else:
            values = dataset.unique(LABEL)
            if any(_is_missing(value) for value in values):
                raise UserError(f"{source} has examples without a label; fill or drop them.")
            values = sorted(values)
            names = tuple(str(value) for value in values)
            ids = {value: i for i, value in enumerate(values)}
        if len(names) < 2:
            raise UserError(
                f"{source} has {len(names)} label(s) ({', '.join(names)}); "
                "classification needs at least two."
            )
        return cls(names, ids, source, untrained)

    @classmethod
    def from_stream(cls, stream, indexed: list | None, source: str) -> LabelSet:
        """A stream's labels: its ClassLabel, or the values its shard index recorded."""
        from datasets import ClassLabel

        feature = (stream.features or {}).get(LABEL)
        if isinstance(feature, ClassLabel):
            return cls(tuple(feature.names), {i: i for i in range(len(feature.names))}, source)
        if indexed is None:
            raise UserError(
                f"{source} is a stream whose labels are not a ClassLabel, so its label set is "
                "unknown before training: stream it from shards (python -m trainer.shards "
                "records the labels), or leave --streaming out."
            )
        if len(indexed) < 2:
            raise UserError(f"{source} has {len(indexed)} label(s); classification needs two.")
        return cls(tuple(str(v) for v in indexed), {v: i for i, v in enumerate(indexed)}, source)

    def describe(self) -> str:
        """One line naming the ids (as `--class_weights` and predictions use them) and each
        label's origin: the training split, or only the dataset's classes (`untrained`)."""
        trained = [(i, name) for i, name in enumerate(self.names) if name not in self.untrained]
        line = f"labels from {self.source}: {_listed(trained)}"
        if self.untrained:
            others = [(i, name) for i, name in enumerate(self.names) if name in self.untrained]
            line += (
                f"; declared by the dataset but without an example in {self.source} "
                f"(never learnt): {_listed(others)}"
            )
        return line

    @property
    def id2label(self) -> dict[int, str]:
        return dict(enumerate(self.names))

    @property
    def label2id(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.names)}

    def check(self, dataset: Dataset, where: str) -> None:
        """Every label of `dataset` must map to one of ours (also catches -1 "no label")."""
        feature = dataset.features[LABEL]
        self.check_names(feature, where)
        values = dataset.unique(LABEL)
        self.check_labelled(values, feature, where)
        self.check_known(values, where)
        self.warn_of_never_learnt(values, where)

    def check_names(self, feature: Any, where: str) -> None:
        """A ClassLabel column must name our labels, in our order."""
        from datasets import ClassLabel

        if isinstance(feature, ClassLabel) and tuple(feature.names) != self.names:
            raise UserError(
                f"{where} names its labels {', '.join(feature.names)}, but the model was "
                f"built for {', '.join(self.names)} (from {self.source})."
            )

    def check_labelled(self, values: list, feature: Any, where: str) -> None:
        """No example without a label (a benchmark's hidden test labels)."""
        if any(self.no_label(value, feature) for value in values):
            extent = "no labels" if len(values) == 1 else "examples without a label"
            raise UserError(
                f"{where} has {extent} (a benchmark's test split hides them): train and "
                "evaluate on splits with labels (--eval_split_name one that has them, often "
                "validation; or --train_val_split 0.15 takes one from the training split)."
            )

    def check_known(self, values: list, where: str) -> None:
        """No label outside the set the model is built for: it would have no output."""
        unknown = [value for value in values if value not in self.ids]
        if unknown:
            shown = ", ".join(repr(value) for value in unknown[:5])
            raise UserError(
                f"{where} has label(s) {shown} that are not in the label set "
                f"({', '.join(self.names)}) taken from {self.source}: they occur only "
                "outside the training split, and the model would have no output for them."
            )

    def warn_of_never_learnt(self, values: list, where: str) -> None:
        """One warning (from the main process) for classes the training split never shows."""
        never_learnt = [self.names[self.ids[value]] for value in values]
        never_learnt = sorted(set(never_learnt) & set(self.untrained))
        if never_learnt and os.environ.get("RANK", "0") == "0":
            print(
                f"warning: {where} has class(es) {', '.join(never_learnt)} that {self.source} "
                "has no example of: the model never learns them, so their examples are "
                "scored as errors",
                flush=True,
            )

    def no_label(self, value: Any, feature: Any) -> bool:
        """An empty label (None, NaN), or datasets' "no label", -1: in a ClassLabel always, in
        integers unless the training split has -1 as a class (a -1/0/1 scale)."""
        from datasets import ClassLabel

        hidden = isinstance(feature, ClassLabel) or -1 not in self.ids
        return _is_missing(value) or (hidden and value == -1 and not isinstance(value, bool))

    def unlabelled(self, dataset: Dataset) -> bool:
        """Every label of `dataset` is missing (`no_label`): a benchmark's hidden test split."""
        feature = dataset.features[LABEL]
        return all(self.no_label(value, feature) for value in dataset.unique(LABEL))

    def class_weights(self, spec: str, train: Dataset) -> torch.Tensor:
        """`balanced` gives n / (classes * count), as scikit-learn does; else as given."""
        weights = parse_class_weights(spec)
        if weights == "balanced":
            counts = Counter(self.ids[value] for value in train[LABEL])
            total, classes = sum(counts.values()), len(self.names)
            weights = tuple(total / (classes * max(counts[i], 1)) for i in range(classes))
        if len(weights) != len(self.names):
            raise UserError(
                f"--class_weights gives {len(weights)} weight(s) for {len(self.names)} labels "
                f"({', '.join(self.names)}, in this order)."
            )
        return torch.tensor(weights, dtype=torch.float32)


def _listed(labels: list[tuple[int, str]]) -> str:
    shown = ", ".join(f"{i} {name}" for i, name in labels[:LABELS_SHOWN])
    return shown + (f", ... ({len(labels)} in all)" if len(labels) > LABELS_SHOWN else "")


def classification_metrics(prediction: EvalPrediction) -> dict[str, float]:
    """Accuracy, and macro F1 over the classes that occur in labels or predictions (those
    scikit-learn's `f1_score(average="macro")` averages over)."""
    logits = prediction.predictions
    if isinstance(logits, tuple):
        logits = logits[0]
    predicted = np.asarray(logits).argmax(axis=-1)
    return label_metrics(predicted, np.asarray(prediction.label_ids))


@dataclass
class ClassificationCollator:
    """Raw examples -> model inputs (from the task's `encode_inputs`) plus label ids, where
    the examples have labels. With several input columns (a sentence pair), each raw input
    is a tuple of their values."""

    encode_inputs: Callable[[list], Mapping[str, torch.Tensor]]
    input_columns: tuple[str, ...]
    label_ids: Mapping[Any, int]

    def __call__(self, examples: list[dict]) -> dict:
        if len(self.input_columns) == 1:
            inputs = [example[self.input_columns[0]] for example in examples]
        else:
            inputs = [tuple(example[c] for c in self.input_columns) for example in examples]
        batch = dict(self.encode_inputs(inputs))
        if LABEL in examples[0]:  # a test split without labels is predicted, not scored
            batch["labels"] = torch.tensor([self.label_ids[ex[LABEL]] for ex in examples])
        return batch


class ClassificationTask(Task):
    default_metric = "accuracy"
    metric_names = ("accuracy", "macro_f1")  # classification_metrics
    input_column: ClassVar[str]
    """The input column's name once loaded ("image", "text")."""
    input_flag: ClassVar[str]
    """The flag naming the input column in the source data."""
    predicted_top_k: ClassVar[int]
    """How many of the likeliest labels a prediction names, as the server answers."""
    options: ClassificationArguments
    labels: LabelSet
    _train: Dataset
    _class_weights: torch.Tensor | None = None

    @abstractmethod
    def load_model_and_processor(
        self, labels: LabelSet, quantized: bool = True
    ) -> tuple[PreTrainedModel, Any]:
        """The pretrained model with a head for `labels` (see `pretrained_kwargs`)."""

    @abstractmethod
    def input_encoder(self, processor: Any) -> Callable[[list], Mapping[str, torch.Tensor]]:
        """Turns a list of raw inputs (images, texts) into the model's input tensors."""

    def build_model_and_processor(self) -> tuple[PreTrainedModel, Any]:
        spec = self.data_args.train_split_name
        streaming = self.data_args.streaming
        self._train = self.interleaved(lambda source: source._load_split(spec, streaming))
        source = f"split {spec} of {self.data_args.dataset_name}"
        if is_stream(self._train):
            self.labels = LabelSet.from_stream(self._train, self._indexed_labels(), source)
        else:
            self.labels = LabelSet.from_split(self._train, source)
        if os.environ.get("RANK", "0") == "0":
            print(self.labels.describe(), flush=True)
        return self.load_model_and_processor(self.labels)

    def pretrained_kwargs(self, labels: LabelSet, quantized: bool = True) -> dict:
        """`from_pretrained` arguments that give the model a fresh head for our labels
        (loaded in 8 bits with `--load_in_8bit`, unless not `quantized`)."""
        return {
            "cache_dir": self.model_args.cache_dir,
            "attn_implementation": self.model_args.attn_implementation,
            "num_labels": len(labels.names),
            "id2label": labels.id2label,
            "label2id": labels.label2id,
            # a checkpoint fine-tuned on other classes has a head of another size
            "ignore_mismatched_sizes": True,
            **(eight_bit_loading(self.model_args) if quantized else {}),
        }

    def weightless_config(self) -> dict:
        return {"num_labels": 2}

    def head_modules(self, model: PreTrainedModel) -> list[str]:
        """The classifier: every top-level module with weights outside the pretrained
        body (`classifier` for ViT and BERT, `score` for some others)."""
        return [
            name
            for name, module in model.named_children()
            if name != model.base_model_prefix and any(True for _ in module.parameters())
        ]

    def sequence_length(self, config: Any) -> int:
        """The positions each encoder layer sees (at most)."""
        raise NotImplementedError

    def activation_values_per_sample(self, model: PreTrainedModel) -> tuple[int, int]:
        """An encoder layer keeps about 17 s h values for s positions of width h with fused
        attention (Korthikanti et al. 2022, sec. 4.1, as for Whisper in speech.py); with
        checkpointing, each layer's input plus one layer being recomputed."""
        config = model.config
        positions, width = self.sequence_length(config), config.hidden_size
        layer = 17 * positions * width
        full = config.num_hidden_layers * layer
        return full, config.num_hidden_layers * positions * width + layer

    def forward_flops_per_sample(self, model: PreTrainedModel) -> ForwardFlops:
        return encoder_forward_flops(model, self.sequence_length(model.config))

    def model_to_merge_into(self) -> PreTrainedModel:
        return self.load_model_and_processor(self.labels, quantized=False)[0]

    def label_column(self) -> str | None:
        return self.options.label_column_name

    def source_label_values(self, dataset: Dataset) -> dict[str, list] | None:
        from datasets import ClassLabel

        column = self.label_column()
        if isinstance(dataset.features[column], ClassLabel):
            return None  # its names travel with the features
        return {column: sorted(dataset.unique(column))}

    def _indexed_labels(self) -> list | None:
        """The label values the shard sets' indexes recorded for our label column (all of
        them, when streams are interleaved), or None if one did not."""
        values = set()
        for source in self.sources():
            index = shard_index_of(source.data_args.dataset_name)
            labels = (index.labels or {}).get(self.options.label_column_name) if index else None
            if labels is None:
                return None
            values.update(labels)
        return sorted(values)

    def check_inputs(self) -> list[str]:
        if self.data_args.streaming and self.options.class_weights == "balanced":
            raise UserError(
                "--class_weights balanced counts the training split, which a stream cannot "
                "do before training: give one weight per label (e.g. 1,2.5,1)."
            )
        return super().check_inputs()

    @classmethod
    def required_training_arguments(cls, training: Mapping[str, Any]) -> dict[str, Any]:
        # The collator needs the raw input and label columns, which the model does not name.
        return {"remove_unused_columns": False}

    def load_datasets(self, processor: Any) -> tuple[Dataset, Dataset | None]:
        spec = self.data_args.train_split_name
        train, evaluation = self._train, None
        fraction = self.data_args.train_val_split
        if fraction is not None:
            where = f"split {spec} of {self.data_args.dataset_name or FILES}"
            train, evaluation = split_off_evaluation(train, fraction, self.seed, where)
            evaluation = first_examples(evaluation, self.data_args.max_eval_samples)
            evaluation = self.prepare_split(evaluation, f"{spec} (--train_val_split part)")
        train = first_examples(train, self.data_args.max_train_samples)
        if not is_stream(train):  # a stream cannot be checked before it is read
            train = self.prepare_split(train, spec)
        if self.options.class_weights is not None:
            self._class_weights = self.labels.class_weights(self.options.class_weights, train)
        if self.data_args.eval_split_name and fraction is None:
            spec = self.data_args.eval_split_name
            first = self.sources()[0]  # interleaved streams: the first dataset's evaluation
            evaluation = first_examples(first._load_split(spec), self.data_args.max_eval_samples)
            evaluation = self.prepare_split(evaluation, spec)
        return self.for_training(train), evaluation

    def load_test_split(self, processor: Any) -> Dataset:
        """The test split, prepared as the evaluation split is; one whose every label is
        missing (a benchmark's hidden test labels: -1, or empty) loses its label column, so
        that it is predicted without being scored."""
        spec = self.data_args.test_split_name
        first = self.sources()[0]  # interleaved streams: the first dataset's, as evaluation
        source = first.load_source(spec)
        test = with_example_ids(first._selected(source, spec), source, first.input_source())
        if self.labels.unlabelled(test):
            return test.remove_columns(LABEL)
        return self.prepare_split(test, spec)

    def references(self, dataset: Dataset) -> list:
        if LABEL not in dataset.column_names:
            return [None] * len(dataset)
        return [self.labels.names[self.labels.ids[value]] for value in dataset[LABEL]]

    def predicted_values(self, predictions: Any, processor: Any) -> list[dict]:
        """The likeliest `predicted_top_k` labels of each example and their softmax scores,
        shaped by `prediction_value`."""
        logits = predictions[0] if isinstance(predictions, tuple) else predictions
        logits = torch.as_tensor(np.asarray(logits), dtype=torch.float32)
        k = min(self.predicted_top_k, logits.shape[-1])
        scores, ids = logits.softmax(dim=-1).topk(k, dim=-1)
        return [
            self.prediction_value([self.labels.names[i] for i in row], row_scores)
            for row, row_scores in zip(ids.tolist(), scores.tolist(), strict=True)
        ]

    @staticmethod
    @abstractmethod
    def prediction_value(labels: list[str], scores: list[float]) -> dict:
        """One example's prediction, as the server answers it, from its likeliest labels:
        the task's answer (its spec's predictor gives the same)."""

    def prepare_split(self, dataset: Dataset, spec: str) -> Dataset:
        """Check a split's labels; subclasses add their own checks and clean-up."""
        self.labels.check(dataset, f"split {spec} of {self.data_args.dataset_name}")
        return dataset

    def for_training(self, dataset: Dataset) -> Dataset:
        """The training split as the Trainer sees it (where on-the-fly augmentation goes)."""
        return dataset

    def data_collator(self, processor: Any) -> ClassificationCollator:
        return ClassificationCollator(
            encode_inputs=self.input_encoder(processor),
            input_columns=tuple(self.input_renames().values()),
            label_ids=self.labels.ids,
        )

    def compute_metrics(self, processor: Any) -> Callable[[EvalPrediction], dict[str, float]]:
        return classification_metrics

    @property
    def trainer_class(self) -> Callable[..., Trainer]:
        """With `--class_weights`, a Trainer bound to the weights (known once the training
        split is loaded: `balanced` counts it); otherwise the plain Trainer."""
        if self._class_weights is None:
            return super().trainer_class
        # imported when training only, as in Task.trainer_class
        from trainer.tasks.trainers import ClassWeightedTrainer

        return partial(ClassWeightedTrainer, class_weights=self._class_weights)

    def column_flags(self) -> dict[str, str | tuple[str, ...]]:
        inputs = tuple(self.input_renames())
        label = self.options.label_column_name
        if label in inputs:
            raise UserError(f"--{self.input_flag} and --label_column_name name the same column.")
        return {self.input_flag: inputs[0] if len(inputs) == 1 else inputs,
                "label_column_name": label}  # fmt: skip

    def input_renames(self) -> dict[str, str]:
        """Source input column(s) -> the name(s) the collator reads them by."""
        return {getattr(self.options, self.input_flag): self.input_column}

    def input_source(self) -> str:
        """The source column of the inputs (the first, for a sentence pair)."""
        return next(iter(self.input_renames()))

    def _load_split(self, spec: str, streaming: bool = False):
        """One split (or `a+b`), reduced to the input and label columns under fixed names
        (and a shard set's example ids, for `--stream_audit_dir`)."""
        return self._selected(self.load_source(spec, streaming), spec)

    def _selected(self, source, spec: str):
        """`_load_split`'s columns of `source`, the split `spec` of the dataset."""
        warning = self.column_warning(source.column_names or [])
        training = spec == self.data_args.train_split_name  # read once, to build the model
        if warning and training and os.environ.get("RANK", "0") == "0":
            print(warning, flush=True)
        return select_source_columns(
            source,
            self.column_flags(),
            {**self.input_renames(), self.options.label_column_name: LABEL},
            f"dataset {self.data_args.dataset_name} split {spec}",
            self.column_hint,
        )

    def load_source(self, spec: str, streaming: bool = False):
        dataset, _ = load_split(
            self.data_args, self.model_args.cache_dir, spec, self.detect_local_layout, streaming,
            self.file_layout(),
        )  # fmt: skip
        return dataset
