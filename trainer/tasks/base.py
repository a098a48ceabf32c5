"""The face every training task shows to the training program.

`trainer/training/run.py` knows tasks only through this class: it asks a task for its datasets,
its model and processor, how to batch examples and how to score predictions. A task never
imports the training program, the launcher or storage.
"""

from __future__ import annotations

import copy
import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from transformers import TrainingArguments

from trainer.common.errors import UserError
from trainer.data.checks import check_columns, check_splits, evaluation_hint, split_names
from trainer.data.sources import (
    FILES,
    TABLE_FORMATS,
    LocalLayout,
    check_metadata_files,
    check_shard_set,
    local_directory,
    looks_like_path,
    shard_index_of,
    table_layout,
)
from trainer.settings.mixtures import MixedDataset, mixture_of
from trainer.tasks.lora_adapters import weightless, with_lora

if TYPE_CHECKING:
    from pathlib import Path

    from datasets import Dataset, IterableDataset
    from transformers import EvalPrediction, PreTrainedModel, Trainer

    from trainer.common.step_time import ForwardFlops
    from trainer.data.sources import LocalLayout
    from trainer.settings.data_flags import DataArguments
    from trainer.settings.model_flags import ModelArguments
    from trainer.tasks.task_spec import TaskSpec

LENGTH_SAMPLING_STRATEGIES = ("group_by_length", "batch_rebalance")
"""`--train_sampling_strategy` values whose Trainer samplers read each example's length: from the
dataset's `--length_column_name` column, else from the model's input column, which no task's
raw rows have (inputs are made in the collator), so a task that takes them writes the column."""


class Task(ABC):
    spec: ClassVar[TaskSpec]
    """The task's spec (its flags, how it recognises models and data, how it serves)."""
    training_arguments_class: ClassVar[type[TrainingArguments]] = TrainingArguments
    default_metric: ClassVar[str]
    """The metric used for `metric_for_best_model` and hyperparameter tuning by default."""
    metric_names: ClassVar[tuple[str, ...]]
    """The names `compute_metrics` returns (the Trainer logs them with an `eval_` prefix):
    with `loss`, what `--metric_for_best_model` may name. The launcher checks the flag
    against them; the Trainer would find a wrong name only at the first evaluation."""
    lower_is_better: ClassVar[frozenset[str]] = frozenset()
    """Metric names for which smaller values are better (the Trainer assumes otherwise)."""
    mixed_columns: tuple[str, ...] = ()
    """A mixture's dataset read by this copy (`mixed_source`): the columns its entry keeps,
    which its launch check requires."""
    reference_free_flag: ClassVar[str | None] = None
    """The flag with which a task's frozen reference model (`reference_parameters`) is not
    kept while training, its outputs computed before (the plan names it when a step does not
    fit); None: the task keeps no reference, or cannot do without it."""

    def __init__(
        self,
        model: ModelArguments,
        data: DataArguments,
        options: Any,
        training: Mapping[str, Any] | None = None,
    ) -> None:
        self.model_args = model
        self.data_args = data
        self.options = self.settled_options(options)
        self.training = training or {}
        """The resolved TrainingArguments values (trainer/settings/run_config.py)."""

    @property
    def seed(self) -> int:
        """The training seed (`--seed`), for data orders that need one."""
        return self.training.get("seed", 42)

    def sources(self) -> list[Task]:
        """This task once per dataset of `--dataset_name`: several when they are interleaved
        (`--interleave_probabilities`) or mixed (text-generation's `--dataset_mixture`), each
        copy reading only its own dataset, config and splits."""
        data = self.data_args
        mixture = mixture_of(data, self.options)
        if mixture is not None:
            return [self.mixed_source(entry, mixture.eval_split) for entry in mixture.datasets]
        if not data.interleave_probabilities:
            return [self]
        names = data.dataset_name.split(",")
        configs = data.dataset_config_name.split(",") if data.dataset_config_name else [None]
        configs = configs * len(names) if len(configs) == 1 else configs
        copies = []
        for name, config in zip(names, configs, strict=True):
            task = copy.copy(self)
            task.data_args = dataclasses.replace(
                data, dataset_name=name, dataset_config_name=config, interleave_probabilities=None
            )
            copies.append(task)
        return copies

    def mixed_source(self, entry: MixedDataset, eval_split: str) -> Task:
        """This task reading one dataset of a mixture (its launch checks, its Hub id, its
        splits)."""
        task = copy.copy(self)
        task.data_args = dataclasses.replace(
            self.data_args, dataset_name=entry.path, dataset_config_name=entry.config,
            train_split_name=entry.split, eval_split_name=eval_split,
        )  # fmt: skip
        task.options = dataclasses.replace(self.options, dataset_mixture=None)
        task.mixed_columns = entry.columns or ()
        return task

    def interleaved(self, load: Callable[[Task], Any]) -> Any:
        """`load` applied to every source; several streams are mixed by their probabilities,
        each example of each read once per epoch (`all_exhausted_without_replacement`)."""
        from datasets import interleave_datasets

        parts = [load(task) for task in self.sources()]
        if len(parts) == 1:
            return parts[0]
        try:
            return interleave_datasets(
                parts,
                probabilities=self.data_args.probabilities(),
                seed=self.seed,
                stopping_strategy="all_exhausted_without_replacement",
            )
        except ValueError as error:
            raise UserError(f"--dataset_name {self.data_args.dataset_name}: {error}") from None

    @property
    def length_column(self) -> str | None:
        """The column each example's length goes in, when `--train_sampling_strategy` asks
        for lengths (the training and evaluation splits; a test split is predicted in its
        own order); None otherwise."""
        if self.training.get("train_sampling_strategy") in LENGTH_SAMPLING_STRATEGIES:
            return self.training["length_column_name"]
        return None

    @property
    def trainer_class(self) -> Callable[..., Trainer]:
        """The Trainer to build. Imported only here: `transformers.Trainer` takes seconds to
        import, and the launcher, which parses the same flags, never trains."""
        from transformers import Trainer

        return Trainer

    def check_inputs(self) -> list[str]:
        """Cheap checks of the data's splits and columns, run before any launch on a node
        (trainer/preflight/run_checks.py): a shard set's from its index, a local directory's
        or named files' from their layout (and its metadata tables' encoding); a hub dataset
        is checked when it is loaded. Returns notice lines about what the columns show (a
        text task: half of a sentence pair), for the launcher to print."""
        data, name = self.data_args, self.data_args.dataset_name
        index = shard_index_of(name)
        if index is not None:
            check_shard_set(index, name, data.train_split_name, data.eval_split_name,
                            self.column_flags(), self.column_hint)  # fmt: skip
            self.check_test_split(index.splits, name)
            return self.column_notices(index.columns)
        layout, directory = self.file_layout(), FILES
        if layout is None:
            if name is None or not looks_like_path(name):
                return []
            directory = local_directory(name)
            layout = self.detect_local_layout(directory)
            check_metadata_files(layout)
        check_splits(layout.splits, data.train_split_name, directory)
        if data.eval_split_name:
            hint = evaluation_hint(layout.splits)
            check_splits(layout.splits, data.eval_split_name, directory, hint)
        self.check_test_split(layout.splits, directory)
        # the splits read are checked, not the others (a test file without labels is read
        # only by --do_predict); the training split first, whose columns the line lists
        train = layout.columns_of(split_names(data.train_split_name))
        check_columns(train, self.column_flags(), str(directory), self.column_hint)
        self.check_evaluation_labels(layout, directory)
        read = layout.columns_of(self.splits_read())
        check_columns(read, self.column_flags(), str(directory), self.column_hint)
        return self.column_notices(train)

    def splits_read(self) -> list[str]:
        """The splits a run reads: training, evaluation and, with --do_predict, test."""
        data = self.data_args
        test = data.test_split_name if self.training.get("do_predict") else ""
        return [name for spec in (data.train_split_name, data.eval_split_name, test)
                for name in split_names(spec)]  # fmt: skip

    def check_evaluation_labels(self, layout: LocalLayout, where: object) -> None:
        """Refuse an evaluation split of a local layout that has no labels (a task with
        labels read from tables); nothing by default."""

    def column_notices(self, columns: Iterable[str]) -> list[str]:
        """`column_warning`'s line for a dataset with `columns`, if any, as a list."""
        warning = self.column_warning(sorted(columns))
        return [warning] if warning else []

    def check_test_split(self, splits: Iterable[str], where: object) -> None:
        """With --do_predict, the split it predicts must be among `splits`."""
        if self.training.get("do_predict"):
            hint = " (--test_split_name names the split --do_predict predicts)"
            check_splits(splits, self.data_args.test_split_name, where, hint)

    def column_warning(self, columns: list[str]) -> str | None:
        """A warning line about the columns the flags leave unread in a training split with
        `columns` (a text task: half of a sentence pair): a notice of the launcher where it
        knows the columns, and printed once by the first training process when the split is
        loaded (a hub dataset's are known only then); None by default."""
        return None

    def column_hint(self, flag: str, columns: list[str]) -> str:
        """What ends the error line of a column `--flag` names that is not among `columns`
        (a text task says how to name a sentence pair it sees); nothing by default."""
        return ""

    def file_layout(self) -> LocalLayout | None:
        """The layout of data named file by file (`--train_file` ...), for tasks that take
        such flags; None when the data is `--dataset_name`."""
        return None

    def check_model(self) -> None:
        """Cheap checks of the model against the task's flags, from its files on this
        machine (a local folder or the Hub cache), run before any launch."""

    @classmethod
    def settled_options(cls, options: Any) -> Any:
        """The task's flags as training reads them (spellings normalised), UserError for unusable
        values; resolution applies it, so run configuration and tasks agree."""
        return options

    @classmethod
    def required_training_arguments(cls, training: Mapping[str, Any]) -> dict[str, Any]:
        """TrainingArguments values the task needs whatever the flags say (resolution
        applies them to the flags' `training` values)."""
        return {}

    @classmethod
    def check_training_values(cls, training: Mapping[str, Any]) -> None:
        """UserError for TrainingArguments values the task cannot train with; resolution
        calls it, so every way in refuses them before launch, not the Trainer after it."""

    @abstractmethod
    def load_datasets(self, processor: Any) -> tuple[Dataset, Dataset | None]:
        """Training and evaluation datasets with only the columns the collator needs; called after
        `build_model_and_processor`, to apply limits of the model (Whisper's input window)."""

    @abstractmethod
    def load_test_split(self, processor: Any) -> Dataset:
        """The `--test_split_name` split that `--do_predict` predicts once the model is
        delivered, prepared as the evaluation split is, with each example's id in
        trainer/data/example_ids.py's column."""

    @abstractmethod
    def references(self, dataset: Dataset) -> list:
        """The reference of each example of the test split (None where it has none), as
        `python -m trainer.predict` writes them: a transcript, a label's name."""

    @abstractmethod
    def predicted_values(self, predictions: Any, processor: Any) -> list[dict]:
        """The Trainer's predictions over the test split, one value per example in the
        answer format of its spec's predictor (trainer/tasks/predictor.py), so that one reader
        reads both."""

    @classmethod
    def detect_local_layout(cls, directory: Path) -> LocalLayout:
        """Recognise the task's local dataset directory (splits, columns) from its files."""
        return cls.spec.detect_layout(directory)

    @abstractmethod
    def column_flags(self) -> dict[str, str]:
        """Flag name -> the source column it names (checked against every source)."""

    def label_column(self) -> str | None:
        """The source column holding the labels, for tasks whose model needs the label set
        before a stream could show it (a shard index records its values); None otherwise."""
        return None

    def source_label_values(self, dataset: Dataset) -> dict[str, list] | None:
        """`label_column()` -> its distinct values in `dataset`, unless its feature carries
        them (a ClassLabel); None for tasks without one."""
        return None

    @abstractmethod
    def load_source(self, spec: str, streaming: bool = False) -> Dataset | IterableDataset:
        """A split (or `a+b`) with all the source's columns, media undecoded: what `python -m
        trainer.shards` writes and training selects from (with `streaming`, as a stream)."""

    @abstractmethod
    def build_model_and_processor(self) -> tuple[PreTrainedModel, Any]:
        """The model to fine-tune and the processor saved next to it."""

    def model_class(self) -> type[PreTrainedModel]:
        """The transformers class `build_model_and_processor` loads, for a weightless copy
        (`weightless_model`); imported when called, as the task modules load without it."""
        raise NotImplementedError

    def weightless_model(self, local_only: bool = False) -> PreTrainedModel:
        """The model to train, as `trained_model` will make it, on the meta device: module
        names and parameter counts for the launcher's checks and memory estimate, in a
        second and without a weight loaded (classification heads get two labels).
        `local_only`: its config from a local path or the local cache, never the Hub."""
        path, cache_dir = self.model_args.model_name_or_path, self.model_args.cache_dir
        model = weightless(
            self.model_class(), path, cache_dir, local_only, **self.weightless_config()
        )
        return self.trained_model(model)

    def weightless_config(self) -> dict:
        """Config values the weightless copy needs beyond the checkpoint's own."""
        return {}

    def head_modules(self, model: PreTrainedModel) -> list[str]:
        """Modules trained in full beside LoRA adapters: a head the task gave the model
        fresh (the pretrained weights have nothing to adapt)."""
        return []

    def trained_model(self, model: PreTrainedModel) -> PreTrainedModel:
        """What trains: `model` itself, or with `--peft lora` a PEFT model of frozen
        weights and adapters (trainer/tasks/lora_adapters.py)."""
        if self.model_args.peft != "lora":
            return model
        return with_lora(model, self.model_args, self.spec.lora_targets, self.head_modules(model))

    def model_to_merge_into(self) -> PreTrainedModel:
        """The pretrained model as `build_model_and_processor` (called first) loaded it, in full
        precision (never 8-bit), to merge the trained adapter into at delivery."""
        raise NotImplementedError

    @abstractmethod
    def data_collator(self, processor: Any) -> Callable[[list[dict]], dict]:
        """Turns a list of raw examples into a model batch (feature extraction happens here)."""

    def activation_values_per_sample(self, model: PreTrainedModel) -> tuple[int, int]:
        """Activation values a sample keeps for backward, without and with gradient checkpointing;
        (0, 0): no estimate, so training never turns checkpointing on itself."""
        return 0, 0

    def forward_flops_per_sample(self, model: PreTrainedModel) -> ForwardFlops | None:
        """One sample's forward FLOPs, over the positions the task feeds each weight, for the
        plan's micro-batch time (trainer/common/step_time.py); None: no estimate."""
        return None

    def reference_parameters(self, model: PreTrainedModel) -> int:
        """Weights of a frozen second model the task keeps beside the trained one on each GPU
        (a preference-tuning reference: as many as the model's in full fine-tuning; none with
        LoRA, whose reference is the base with the adapter disabled, nor when its outputs are
        computed before training), counted by the plan like frozen weights and partitioned
        like them under ZeRO-3 (trainer/tasks/step_memory.py). Its forward pass goes into
        `forward_flops_per_sample`'s `reference`. 0: the task trains one model."""
        return 0

    @abstractmethod
    def compute_metrics(self, processor: Any) -> Callable[[EvalPrediction], dict[str, float]]:
        """Scores evaluation predictions."""


FILE_FLAGS = {"train": "--train_file", "validation": "--validation_file", "test": "--test_file"}
"""The HF example scripts' data file flags (run_glue.py's, run_clm.py's) by the split each names."""


def named_files_layout(files: Mapping[str, Path], dataset_name: str | None) -> LocalLayout | None:
    """The layout of data named file by file (`--train_file` ..., split -> file), for the tasks
    that take such flags; None when there are none (the data is --dataset_name)."""
    if not files:
        return None
    if dataset_name is not None:
        given = ", ".join(FILE_FLAGS[split] for split in files)
        raise UserError(
            f"{given} and --dataset_name name the data twice: give --dataset_name alone "
            "(its own splits), or --train_file with the other files."
        )
    for path in files.values():
        if path.suffix not in TABLE_FORMATS or not path.is_file():
            raise UserError(
                f"Data file {path} not found, or not one of {', '.join(TABLE_FORMATS)}."
            )
    shown = ", ".join(FILE_FLAGS[split] for split in files)
    return table_layout(dict(files), f"the files of {shown}")
