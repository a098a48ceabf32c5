"""Flags of the training program: Hugging Face's own names, read with HfArgumentParser.

The flags come in groups: the task selector, the model, the dataset, the task's own flags
(e.g. Whisper's language) and the Trainer's `TrainingArguments`. The launcher parses them
too, before anything starts, so a typo costs a second instead of a GPU start-up.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import difflib
import functools
from dataclasses import dataclass, field

from transformers import HfArgumentParser

from trainer.common.errors import UserError
from trainer.config.example_flags import translate_example_flags
from trainer.config.foreign_flags import FOREIGN_FLAGS, canonical
from trainer.config.launcher_flags import LauncherArguments
from trainer.data.arguments import DataArguments
from trainer.storage.locations import OutputArguments
from trainer.tasks import DEFAULT_TASK, Task, load_task, task_names
from trainer.tasks.arguments import ModelArguments


class FlagParser(HfArgumentParser):
    """HfArgumentParser whose complaints are one-line UserErrors instead of a usage dump.

    Abbreviations are off: with two parsers sharing one command line, a prefix such as
    `--dry` must not silently match another parser's flag.
    """

    def __init__(self, dataclass_types, **kwargs) -> None:
        super().__init__(dataclass_types, allow_abbrev=False, **kwargs)

    def error(self, message: str) -> None:  # argparse calls this and expects no return
        raise UserError(f"{message} (see python -m trainer --help).")


@dataclass
class TaskArguments:
    task: str = field(
        default=DEFAULT_TASK,
        metadata={"help": f"What to fine-tune for: one of {', '.join(task_names())}."},
    )


@dataclass
class ParsedFlags:
    """Everything the command line said, with TrainingArguments not yet constructed.

    TrainingArguments is built later because building it sets up the distributed state,
    which must happen inside the launched processes and, on CPU, after the gloo workaround.
    """

    task: Task
    model: ModelArguments
    data: DataArguments
    outputs: OutputArguments
    training: argparse.Namespace


TRAINING_DEFAULTS = {
    "output_dir": "outputs",
    "report_to": ["tensorboard"],
    "disable_tqdm": True,  # trainer.training.progress prints plain log lines instead of bars
}
"""Where this product's defaults differ from the Trainer's (explicit flags still win)."""


def build_parser(task_class: type[Task]) -> FlagParser:
    parser = FlagParser(
        [
            TaskArguments,
            ModelArguments,
            DataArguments,
            task_class.arguments_class,
            OutputArguments,
            task_class.training_arguments_class,
        ]
    )
    parser.set_defaults(**TRAINING_DEFAULTS, metric_for_best_model=task_class.default_metric)
    return parser


def selected_task_name(argv: list[str]) -> str:
    selector = FlagParser([TaskArguments], add_help=False)
    known, _ = selector.parse_known_args(translate_example_flags(argv)[0])
    return known.task


FlagValues = dict
"""The training flags as plain, JSON-serialisable values, grouped as `ParsedFlags` holds
them: {"task": name, "model": {...}, "data": {...}, "task_options": {...}, "outputs":
{...}, "training": {...}}. The resolved run configuration carries these."""


def parse_flags(argv: list[str]) -> ParsedFlags:
    """Parse and check the training program's flags (no model, data or device touched).

    The HF example scripts' spellings are accepted too (trainer/config/example_flags.py)."""
    return flags_from_values(parse_flag_values(translate_example_flags(argv)[0]))


def parse_flag_values(argv: list[str]) -> FlagValues:
    """The flags of `argv` (already in this trainer's spelling) as grouped plain values."""
    task_name = selected_task_name(argv)
    task_class = load_task(task_name)
    namespace, unknown = build_parser(task_class).parse_known_args(argv)
    if unknown:
        raise UserError(unknown_flags_message(unknown, task_class))
    values = vars(namespace)

    def take(dtype: type) -> dict:
        return {f.name: values.pop(f.name) for f in dataclasses.fields(dtype) if f.init}

    groups = {
        "model": take(ModelArguments),
        "data": take(DataArguments),
        "task_options": take(task_class.arguments_class),
        "outputs": take(OutputArguments),
    }
    take(TaskArguments)
    return {"task": task_name, **groups, "training": values}


def flags_from_values(values: FlagValues) -> ParsedFlags:
    """The flag objects for `values`, checked; nothing is parsed again. Each call builds new
    objects, so nothing a caller does to them reaches the values."""
    values = copy.deepcopy(values)
    task_class = load_task(values["task"])
    model = _dataclass(ModelArguments, values["model"])
    data = _dataclass(DataArguments, values["data"])
    task_args = _dataclass(task_class.arguments_class, values["task_options"])
    outputs = _dataclass(OutputArguments, values["outputs"])
    training = argparse.Namespace(**values["training"])
    if data.streaming:
        check_streaming(data, training)
    if data.interleave_probabilities:
        check_interleaving(data)
    task = task_class(model, data, task_args)
    task.seed = training.seed
    return ParsedFlags(task=task, model=model, data=data, outputs=outputs, training=training)


def check_streaming(data: DataArguments, training: argparse.Namespace) -> None:
    """What a stream, which has no length and no random access, cannot do."""
    if training.max_steps is None or training.max_steps <= 0:
        raise UserError(
            "--streaming needs --max_steps: a stream has no length, so --num_train_epochs "
            "cannot say when training ends (a shard set's index.json gives the examples "
            "per epoch: max_steps = examples / (batch size x processes) per epoch)."
        )
    if training.train_sampling_strategy in ("group_by_length", "batch_rebalance"):
        raise UserError(
            f"--train_sampling_strategy {training.train_sampling_strategy} needs every "
            "example's length before training, which a stream does not have: leave it out."
        )
    if data.shuffle_buffer_size < 1:
        raise UserError("--shuffle_buffer_size must be at least 1.")


def check_interleaving(data: DataArguments) -> None:
    """Several datasets need one probability each (and one config each, if any)."""
    if not data.streaming:
        raise UserError("--interleave_probabilities mixes streams: add --streaming true.")
    names = (data.dataset_name or "").split(",")
    probabilities = data.probabilities()
    if len(names) < 2 or len(probabilities) != len(names):
        raise UserError(
            f"--interleave_probabilities gives {len(probabilities)} probabilities for "
            f"{len(names)} dataset(s) in --dataset_name: give two or more datasets, "
            "separated by commas, and one probability each."
        )
    configs = data.dataset_config_name.split(",") if data.dataset_config_name else []
    if len(configs) not in (0, 1, len(names)):
        raise UserError(
            f"--dataset_config_name gives {len(configs)} configs for {len(names)} datasets: "
            "give one, or one per dataset (separated by commas)."
        )


def unknown_flags_message(unknown: list[str], task_class: type[Task]) -> str:
    """Names the task whose flags these are, if another task knows them (an example
    script's command line selects its task by the script's name, ours by --task); else
    each unknown flag with the nearest known one. Names only: a value can be a secret
    (`--wandb_key=...`, `--hub_tokn ...`)."""
    names = list(dict.fromkeys(token.split("=", 1)[0] for token in unknown if _is_flag(token)))
    if not names:  # values argparse could not place, e.g. after a switch
        return (
            f"{len(unknown)} argument(s) that are no flag's value (flags start with --; "
            "see python -m trainer --help)."
        )
    knowing = [
        other
        for other in task_names()
        if load_task(other) is not task_class
        and not [
            token
            for token in build_parser(load_task(other)).parse_known_args(unknown)[1]
            if _is_flag(token)
        ]
    ]
    if knowing:
        choices = " or ".join(f"--task {other}" for other in knowing)
        return (
            f"{' '.join(names)}: flag(s) of {choices}, not of --task "
            f"{selected_name(task_class)}; add {choices} (see python -m trainer --help)."
        )
    return f"Unknown flag(s): {', '.join(map(did_you_mean, names))} (see python -m trainer --help)."


def _is_flag(token: str) -> bool:
    """`--name`, `--name=value` or `-x`; not a value such as `-1` or `-0.5`."""
    return token.startswith("-") and not token.lstrip("-").replace(".", "", 1).isdigit()


def did_you_mean(name: str) -> str:
    """`--learning_rte (did you mean --learning_rate?)`, from every flag this trainer knows:
    its launcher's, every task's, and the foreign ones it answers (trainer/config/
    foreign_flags.py)."""
    close = difflib.get_close_matches(canonical(name), known_flags(), n=1, cutoff=0.75)
    return f"{name} (did you mean {close[0]}?)" if close else name


@functools.cache
def known_flags() -> tuple[str, ...]:
    parsers = [FlagParser([LauncherArguments])]
    parsers += [build_parser(load_task(name)) for name in task_names()]
    names = {
        option
        for parser in parsers
        for option in parser._option_string_actions  # argparse's registry of flag names
        if option.startswith("--") and "-" not in option[2:]
    }
    return tuple(sorted(names | set(FOREIGN_FLAGS)))


def selected_name(task_class: type[Task]) -> str:
    return next(name for name in task_names() if load_task(name) is task_class)


def greater_is_better(flags: ParsedFlags) -> bool:
    """Whether a larger `metric_for_best_model` is better: `--greater_is_better` if given,
    else from the metric. The Trainer assumes bigger is better unless the name ends in
    "loss", which is wrong for WER; the task names its lower-is-better metrics."""
    training = flags.training
    if training.greater_is_better is not None:
        return training.greater_is_better
    metric = tuning_metric(flags)
    return not (metric in flags.task.lower_is_better or metric.endswith("loss"))


def tuning_metric(flags: ParsedFlags) -> str:
    """The metric name reported to hyperparameter tuning (`metric_for_best_model`)."""
    return (flags.training.metric_for_best_model or flags.task.default_metric).removeprefix("eval_")


def _dataclass(dtype: type, values: dict):
    try:
        return dtype(**values)
    except ValueError as error:
        raise UserError(str(error)) from None
