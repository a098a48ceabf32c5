"""Flags of the training program: Hugging Face's own names, read with HfArgumentParser.

The groups: the task selector, the model, the dataset, the task's own flags (e.g. Whisper's
language), the outputs and the Trainer's `TrainingArguments`; each but the last is a dataclass
of trainer/settings, so what is parsed here is what the run configuration holds. Every way in
parses them before anything starts: a typo costs a second, not a GPU start-up.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from transformers import HfArgumentParser

from trainer.command_line.example_flags import translate_example_flags, typed_spellings
from trainer.command_line.foreign_flags import FOREIGN_FLAGS, canonical
from trainer.common.errors import UserError
from trainer.settings.data_flags import DataArguments
from trainer.settings.launcher_flags import LauncherArguments
from trainer.settings.model_flags import ModelArguments
from trainer.settings.output_flags import OutputArguments
from trainer.tasks.base import Task
from trainer.tasks.registry import DEFAULT_TASK, load_task, task_names


class FlagParser(HfArgumentParser):
    """HfArgumentParser whose complaints are one-line UserErrors instead of a usage dump.
    Abbreviations are off: with two parsers sharing one command line, a prefix such as `--dry`
    must not silently match another parser's flag."""

    def __init__(self, dataclass_types, **kwargs) -> None:
        super().__init__(dataclass_types, allow_abbrev=False, **kwargs)

    def error(self, message: str) -> None:  # argparse calls this and expects no return
        raise UserError(f"{message} (see python -m trainer --help).")


def task_arguments() -> type:
    """The `--task` selector, its help listing the tasks registered now."""
    return _task_arguments(tuple(task_names()))


@functools.cache
def _task_arguments(tasks: tuple[str, ...]) -> type:
    @dataclass
    class TaskArguments:
        task: str = field(
            default=DEFAULT_TASK,
            metadata={"help": f"What to fine-tune for: one of {', '.join(tasks)}."},
        )

    return TaskArguments


@dataclass(frozen=True)
class ParsedFlags:
    """One command line's training flags in their groups: what resolution starts from."""

    task: str
    model: ModelArguments
    data: DataArguments
    task_options: Any
    """The task's own flags (its spec's `flags` dataclass)."""
    outputs: OutputArguments
    training: dict[str, Any]
    """TrainingArguments values by name; the object itself is built in each training
    process, because building it sets up the distributed state."""

    def build_task(self) -> Task:
        return load_task(self.task)(self.model, self.data, self.task_options, self.training)


TRAINING_DEFAULTS = {
    "output_dir": "outputs",
    "report_to": ["tensorboard"],
    "disable_tqdm": True,  # trainer.training.progress prints plain log lines instead of bars
}
"""Where this product's defaults differ from the Trainer's (explicit flags still win)."""


def build_parser(task_class: type[Task]) -> FlagParser:
    parser = FlagParser(
        [
            task_arguments(),
            ModelArguments,
            DataArguments,
            task_class.spec.flags,
            OutputArguments,
            task_class.training_arguments_class,
        ]
    )
    parser.set_defaults(**TRAINING_DEFAULTS, metric_for_best_model=task_class.default_metric)
    return parser


def selected_task_name(argv: list[str]) -> str:
    selector = FlagParser([task_arguments()], add_help=False)
    known, _ = selector.parse_known_args(translate_example_flags(argv)[0])
    return known.task


def parse_flags(argv: list[str]) -> ParsedFlags:
    """Parse and check the training program's flags (no model, data or device touched), the HF
    example scripts' spellings too (trainer/command_line/example_flags.py)."""
    return parse_training_flags(translate_example_flags(argv)[0], typed_spellings(argv))


def parse_training_flags(
    argv: list[str], typed: Mapping[str, str] | None = None, task_inferred: bool = False
) -> ParsedFlags:
    """The flags of `argv` (already in this trainer's spelling), in their groups. For the
    message about an unknown flag: `typed`, our flag -> the foreign flag the user typed for it
    (example_flags.typed_spellings); `task_inferred`, whether resolution added argv's --task."""
    name = selected_task_name(argv)
    task_class = load_task(name)
    namespace, unknown = build_parser(task_class).parse_known_args(argv)
    if unknown:
        task_given = _gives_task(argv) and not task_inferred
        raise UserError(unknown_flags_message(unknown, task_class, typed or {}, task_given))
    values = vars(namespace)

    def take(dtype: type):
        try:
            return dtype(
                **{f.name: values.pop(f.name) for f in dataclasses.fields(dtype) if f.init}
            )
        except ValueError as error:
            raise UserError(str(error)) from None

    model, data = take(ModelArguments), take(DataArguments)
    options, outputs = take(task_class.spec.flags), take(OutputArguments)
    values.pop("task")
    if isinstance(values.get("report_to"), str) and "," in values["report_to"]:
        # several integrations, as TRL's list (`--report_to tensorboard wandb`, a file's list)
        values["report_to"] = [part.strip() for part in values["report_to"].split(",")]
    return ParsedFlags(name, model, data, options, outputs, training=values)


def unknown_flags_message(
    unknown: list[str],
    task_class: type[Task],
    typed: Mapping[str, str] | None = None,
    task_given: bool = False,
) -> str:
    """Names the task whose flags these are, if another task knows them (an example script's
    command line selects its task by the script's name, ours by --task); else each unknown flag
    with the nearest known one. Each is named as typed (`--max_length (read as
    --max_seq_length)`): the user looks for what they wrote. Names only: a value can be a
    secret (`--hub_tokn ...`)."""
    names = list(dict.fromkeys(token.split("=", 1)[0] for token in unknown if _is_flag(token)))
    if not names:  # values argparse could not place, e.g. after a switch
        return (
            f"{len(unknown)} argument(s) that are no flag's value (flags start with --; "
            "see python -m trainer --help)."
        )
    typed = typed or {}
    knowing = _tasks_knowing(unknown, task_class)
    if knowing:
        shown = " ".join(_as_typed(name, typed) for name in names)
        return _another_tasks_flags(shown, knowing, task_class, task_given)
    suggested = ", ".join(did_you_mean(name, task_class, typed.get(name)) for name in names)
    return f"Unknown flag(s): {suggested} (see python -m trainer --help)."


def _tasks_knowing(unknown: list[str], task_class: type[Task]) -> list[str]:
    """The other tasks that know every flag of `unknown`."""
    return [
        other
        for other in task_names()
        if load_task(other) is not task_class
        and not [
            token
            for token in build_parser(load_task(other)).parse_known_args(unknown)[1]
            if _is_flag(token)
        ]
    ]


def _another_tasks_flags(
    shown: str, knowing: list[str], task_class: type[Task], task_given: bool
) -> str:
    """Another task's flags on this line: add that --task where the line gives none (the task
    was inferred or is the default); where it gives one, a second --task would be refused as
    given twice, so: that task in its place, or the flags left out."""
    choices = " or ".join(f"--task {other}" for other in knowing)
    head = f"{shown}: flag(s) of {choices}, not of --task {task_class.spec.name}"
    if task_given:
        return (
            f"{head}, the --task given: give {choices} in its place, or leave them out "
            "(see python -m trainer --help)."
        )
    return f"{head}; add {choices} (see python -m trainer --help)."


def _as_typed(name: str, typed: Mapping[str, str]) -> str:
    """`--max_length (read as --max_seq_length)` for a flag the user typed in a foreign
    spelling; our own flag as itself."""
    return f"{typed[name]} (read as {name})" if name in typed else name


def _gives_task(argv: list[str]) -> bool:
    """Whether `argv` gives --task (`--task X` or `--task=X`)."""
    return any(canonical(token.split("=", 1)[0]) == "--task" for token in argv)


def _is_flag(token: str) -> bool:
    """`--name`, `--name=value` or `-x`; not a value such as `-1` or `-0.5`."""
    return token.startswith("-") and not token.lstrip("-").replace(".", "", 1).isdigit()


SUGGESTION_CUTOFF = 0.8
"""How alike (difflib's ratio, the names without their dashes) a typed name and a flag must be
for a suggestion: a misspelling (`learning_rte`, 0.96) passes; a different flag that shares
words (`sampling_rate` and `train_sampling_strategy`, 0.72) does not."""


def did_you_mean(name: str, task_class: type[Task], typed: str | None = None) -> str:
    """`--learning_rte (did you mean --learning_rate?)`: the nearest of all the flags known
    here, when this task accepts it (ours, or a foreign spelling the table reads as ours,
    named as what it is read as: command_line/foreign_flags.py). When the nearest is one the
    table refuses, what to do instead (`--wandb_keys (like --wandb_key, refused: ... a key is
    never given on the command line ...)`): the user meant that flag, and its answer is
    theirs. Nothing when the nearest is ignored by the table or read by another task only
    (`--max_seq_length` on a speech line): a suggestion that does nothing points the wrong
    way. `typed`: the foreign flag the user typed for `name`, named instead (it was not
    mistyped)."""
    if typed is not None:
        return _as_typed(name, {name: typed})
    known = [flag[2:] for flag in known_flags()]
    close = difflib.get_close_matches(canonical(name)[2:], known, n=1, cutoff=SUGGESTION_CUTOFF)
    if not close:
        return name
    suggestion = accepted_spellings(task_class).get(close[0])
    if suggestion:
        return f"{name} (did you mean {suggestion}?)"
    foreign = FOREIGN_FLAGS.get(f"--{close[0]}")
    if foreign is not None and foreign.kind == "refused":
        return f"{name} (like --{close[0]}, refused: {foreign.answer})"
    return name


@functools.cache
def accepted_spellings(task_class: type[Task]) -> dict[str, str]:
    """Every name (without `--`) a command line for `task_class` may use, with the flag to
    suggest for it: ours as themselves, a renamed foreign one as our flag it stands for, a
    switch or mapped one as itself; each only when all the flags it sets are this task's."""
    ours = _flag_names([FlagParser([LauncherArguments]), build_parser(task_class)])
    spellings = {flag[2:]: flag for flag in ours}
    for name, foreign in FOREIGN_FLAGS.items():
        if foreign.kind in ("renamed", "switch", "mapped") and foreign.flags_set() <= ours:
            spellings[name[2:]] = foreign.answer if foreign.kind == "renamed" else name
    return spellings


def known_flags() -> tuple[str, ...]:
    """Every flag known here: the launcher's, every task's, the foreign ones answered."""
    return _known_flags(tuple(task_names()))


@functools.cache
def _known_flags(tasks: tuple[str, ...]) -> tuple[str, ...]:
    parsers = [FlagParser([LauncherArguments])]
    parsers += [build_parser(load_task(name)) for name in tasks]
    return tuple(sorted(_flag_names(parsers) | set(FOREIGN_FLAGS)))


def _flag_names(parsers: list[FlagParser]) -> set[str]:
    """The parsers' `--flag` names, in their underscore spelling only."""
    return {
        option
        for parser in parsers
        for option in parser._option_string_actions  # argparse's registry of flag names
        if option.startswith("--") and "-" not in option[2:]
    }
