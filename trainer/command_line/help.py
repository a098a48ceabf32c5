"""`python -m trainer --help`: the flags in sections, the project's own before the Trainer's.

`--help` shows every flag of this project (launcher, model and data, the selected task's,
outputs) and the Hugging Face training flags most runs touch; `--help-all` shows them all. The
flags are the real parsers' (`build_parser`): help lists what the launcher accepts, with the
defaults this project applies. Nothing heavy is imported until `render_help` runs: the launcher
imports this module before it checks the CUDA driver, before torch loads.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import shutil
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from trainer.command_line.parser import (
    TRAINING_DEFAULTS,
    FlagParser,
    build_parser,
    selected_task_name,
    task_arguments,
)
from trainer.command_line.recipes import (
    command_line,
    config_argument,
    config_file_flags,
    expand_config_file,
    locate_config_file,
)
from trainer.common.errors import UserError
from trainer.settings.data_flags import DataArguments
from trainer.settings.launcher_flags import LauncherArguments
from trainer.settings.model_flags import ModelArguments
from trainer.settings.output_flags import OutputArguments
from trainer.tasks.registry import DEFAULT_TASK, load_task, task_spec

USAGE = "python -m trainer [recipe.yaml] [flags]"
"""The flags that print help instead of launching; `--help-all` lists every flag."""

CURATED_TRAINING_FLAGS = (
    "output_dir",
    "num_train_epochs",
    "max_steps",
    "per_device_train_batch_size",
    "per_device_eval_batch_size",
    "gradient_accumulation_steps",
    "learning_rate",
    "lr_scheduler_type",
    "warmup_steps",
    "weight_decay",
    "eval_strategy",
    "eval_steps",
    "save_strategy",
    "save_steps",
    "save_total_limit",
    "load_best_model_at_end",
    "metric_for_best_model",
    "logging_steps",
    "report_to",
    "bf16",
    "fp16",
    "gradient_checkpointing",
    "seed",
    "dataloader_num_workers",
    "ddp_timeout",
    "push_to_hub",
    "hub_model_id",
    "predict_with_generate",  # Seq2SeqTrainingArguments only, like the next two
    "generation_max_length",
    "generation_num_beams",
)
"""The Hugging Face training flags `--help` shows (those the task's arguments class has), in
this order; `--help-all` shows the rest too."""

LAUNCHER_CHOSEN = {
    "bf16": "true on A100, L4, H100 unless --bf16 or --fp16 is given",
    "fp16": "true on T4 unless --bf16 or --fp16 is given",
    "tf32": "true on GPUs of compute capability 8.0 or newer",
    "dataloader_num_workers": "on a GPU node min(4, CPUs per GPU / 2), fewer if /dev/shm "
    "cannot hold them",
    "dataloader_persistent_workers": "true with the launcher's loader workers",
    "dataloader_pin_memory": "false on a CPU-only node",
    "gradient_checkpointing": "on a GPU, on only when a step would not fit in its memory "
    "without it",
}
"""Flags whose value, when not given, the launcher or the training program picks for the
hardware (trainer/config/hardware_defaults.py, trainer/training/rank.py)."""

MAX_INLINE_CHOICES = 6
"""More choices than this are listed in the flag's help instead of after its name."""


@dataclass(frozen=True)
class Section:
    title: str
    description: str
    actions: list[argparse.Action]
    brief: bool = False
    """Each flag with its type and default only (the Trainer's own flags, whose help is
    transformers' and long): `--help-all` shows their help too."""


def render_help(argv: list[str], everything: bool = False) -> str:
    """The help for `argv` (less its help flags), of the task a recipe or --task in it selects; an
    unreadable recipe or unknown task gives the default task's help and a note (no error)."""
    selected = select_task(argv)
    task_class = load_task(selected.task_name)
    sections, hidden = help_sections(task_class, selected.task_name, everything)
    width = min(shutil.get_terminal_size().columns, 100) - 2
    overridden = {**TRAINING_DEFAULTS, "metric_for_best_model": task_class.default_metric}
    trainer_defaults = {
        name: _dataclass_default(task_class.training_arguments_class, name) for name in overridden
    }
    parts = [header(selected, sections, hidden, width)]
    for number, section in enumerate(sections, 1):
        brief = section.brief and not everything
        formatter = FlagFormatter(USAGE, width, trainer_defaults, selected.recipe, brief)
        formatter.start_section(f"{number}. {section.title}")
        formatter.add_text(section.description)
        formatter.add_arguments(section.actions)
        formatter.end_section()
        parts.append(formatter.format_help())
    if hidden:
        more = f"... and {hidden} more Hugging Face training flags are accepted: --help-all"
        parts.append(_fill(f"{more} lists them all, with the help of each.", width) + "\n")
    return "\n".join(parts)


@dataclass(frozen=True)
class Selection:
    """The task a command line selects, and what help says about how."""

    task_name: str
    source: str
    """Where the task came from: the default, --task, or the recipe."""
    recipe: tuple[str, dict[str, str]] | None
    """The recipe's file name and the flag values it sets (flag name without --)."""
    notes: list[str]
    """What could not be read (a missing recipe, an unknown task), for the reader."""


def select_task(argv: list[str]) -> Selection:
    notes, recipe, name = [], None, None
    try:
        name = config_argument(argv)[0]
        expanded = expand_config_file(argv)
        if name is not None:
            recipe = (Path(name).name, _given_values(config_file_flags(locate_config_file(name))))
    except UserError as error:
        notes.append(f"note: {error} Ignoring {name or 'the config file'}.")
        expanded = command_line(argv)
    source = "the default task"
    if _gives_task(command_line(argv)):
        source = "from --task"
    elif _gives_task(expanded):
        source = f"from {name}"
    try:
        task_name = selected_task_name(expanded)
        load_task(task_name)
    except UserError as error:
        notes.append(f"note: {error} Showing the flags of --task {DEFAULT_TASK}.")
        task_name, source = DEFAULT_TASK, "the default task"
    return Selection(task_name, source, recipe, notes)


def help_sections(task_class: type, task_name: str, everything: bool) -> tuple[list[Section], int]:
    """The sections' flags, grouped by the dataclass each flag's `dest` belongs to, and how
    many Hugging Face training flags are left out (none with `everything`)."""
    launcher = FlagParser([LauncherArguments], add_help=False)
    groups, hf_actions = grouped_actions(task_class)
    order = {name: i for i, name in enumerate(CURATED_TRAINING_FLAGS)}
    curated = sorted((a for a in hf_actions if a.dest in order), key=lambda a: order[a.dest])
    shown = hf_actions if everything else curated
    training_class = task_class.training_arguments_class.__name__
    which = "all of them" if everything else "the most used"
    sections = [
        Section(
            "Launcher flags (once per node)",
            "Read by the launcher on each node, never by the training processes.",
            [action for action in launcher._actions if action.option_strings],
        ),
        Section("Model and data", "", groups[0]),
        Section(f"{task_name} flags", "", groups[1]),
        Section("Outputs and checkpoints", "", groups[2]),
        Section(
            f"Hugging Face training flags ({training_class}, {which})",
            "Passed to every training process, with this project's defaults"
            + ("." if everything else "; --help-all: their help."),
            shown,
            brief=True,
        ),
    ]
    return sections, len(hf_actions) - len(shown)


def grouped_actions(task_class: type) -> tuple[list[list[argparse.Action]], list[argparse.Action]]:
    """The training parser's flags: those of the model and data, of the task and of the
    outputs; then the Trainer's own (the launcher's --deepspeed takes the Trainer's)."""
    own = [
        _field_names(task_arguments(), ModelArguments, DataArguments),
        _field_names(task_class.spec.flags),
        _field_names(OutputArguments),
    ]
    actions = [
        action
        for action in build_parser(task_class)._actions
        if action.option_strings and not isinstance(action, argparse._HelpAction)
    ]
    not_hf = set().union(*own, _field_names(LauncherArguments))
    groups = [[action for action in actions if action.dest in names] for names in own]
    return groups, [action for action in actions if action.dest not in not_hf]


def header(selected: Selection, sections: list[Section], hidden: int, width: int) -> str:
    lines = [f"usage: {USAGE}", ""]
    notes = selected.notes
    lines += [_fill(note, width) for note in notes] + ([""] if notes else [])
    recipes = ", ".join(task_spec(selected.task_name).recipes) or "none yet"
    lines += [
        _fill(
            "Fine-tunes a Hugging Face model; runs once on every node. A first argument "
            "ending in .yaml, or --config FILE.yaml (TRL's), is a recipe: a file of flags, or "
            f"one shipped in trainer/recipes/ (this task's: {recipes}); flags override it. No "
            "model and no dataset runs the built-in demo.",
            width,
        ),
        "",
        _fill(
            f"Flags of --task {selected.task_name} ({selected.source}; --task or a recipe selects "
            "another). --flag VALUE, or --flag=VALUE; a BOOL flag alone means true "
            "(--streaming, --streaming false); dashes work for underscores (--dry-run). See "
            "docs/launching.md.",
            width,
        ),
        "",
        "  -h, --help      these flags"
        + (f" ({hidden} Hugging Face training flags left out)" if hidden else ""),
        "  --help-all      these flags and every Hugging Face training flag",
        "",
    ]
    return "\n".join(lines)


class FlagFormatter(argparse.HelpFormatter):
    """One entry per flag: its underscore name, its type or choices, its help and the
    default this project applies."""

    def __init__(
        self,
        prog: str,
        width: int,
        trainer_defaults: Mapping[str, object],
        recipe: tuple[str, Mapping[str, str]] | None = None,
        brief: bool = False,
    ) -> None:
        super().__init__(prog, width=width, max_help_position=38 if brief else 32)
        self._trainer_defaults = trainer_defaults
        self._recipe = recipe
        self._brief = brief

    def _format_action_invocation(self, action: argparse.Action) -> str:
        name = action.option_strings[0]  # the dashed spelling is an alias
        if action.nargs == 0:
            return name
        return f"{name} {self._format_args(action, _type_metavar(action))}"

    def _metavar_formatter(self, action: argparse.Action, default_metavar: str):
        choices = _choices(action)
        if choices is not None and len(choices) <= MAX_INLINE_CHOICES:
            result = "{" + ",".join(choices) + "}"
        else:
            result = "CHOICE" if choices is not None else default_metavar
        return lambda tuple_size: (result,) * tuple_size

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.nargs == 0 and action.const is False:  # HfArgumentParser's --no_NAME
            return f"Same as --{action.dest} false."
        text = "" if self._brief else (action.help or "").strip()
        choices = _choices(action)
        if choices is not None and len(choices) > MAX_INLINE_CHOICES and not self._brief:
            text += " Choices: " + ", ".join(choices).replace("%", "%%") + "."
        return f"{text} {self._default_text(action)}".strip()

    def _default_text(self, action: argparse.Action) -> str:
        value = action.default
        if action.dest in self._trainer_defaults:
            trainer = self._trainer_defaults[action.dest]
            shown = f"{_show(value)}, set by this project; the Trainer's: {_show(trainer)}"
        elif value is None:
            described = "default" in (action.help or "").lower() and not self._brief
            if described and action.dest not in LAUNCHER_CHOSEN:
                return ""
            shown = "unset"
        else:
            shown = _show(value)
        if action.dest in LAUNCHER_CHOSEN:
            shown += f"; {LAUNCHER_CHOSEN[action.dest]}"
        return f"(default: {shown}{self._recipe_sets(action)})".replace("%", "%%")

    def _recipe_sets(self, action: argparse.Action) -> str:
        """What the recipe on the command line sets this flag to, if it does."""
        if self._recipe is None:
            return ""
        recipe_name, recipe_values = self._recipe
        name = action.option_strings[0].removeprefix("--")
        if name not in recipe_values:
            return ""
        return f"; {recipe_name} sets {recipe_values[name] or 'true'}"


def _type_metavar(action: argparse.Action) -> str:
    from transformers.hf_argparser import string_to_bool

    if action.type is string_to_bool:
        return "BOOL"
    names = {int: "INT", float: "FLOAT", str: "STR"}
    if action.type in names:
        return names[action.type]
    return getattr(action.type, "__name__", "value").upper()


def _choices(action: argparse.Action) -> list[str] | None:
    if action.choices is not None:
        return [_show(choice) for choice in action.choices]
    if isinstance(action.type, type) and issubclass(action.type, enum.Enum):
        return [_show(member) for member in action.type]
    return None


def _show(value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, list | tuple):
        return " ".join(_show(item) for item in value) or "none"
    return str(value)


def _given_values(flags: list[str]) -> dict[str, str]:
    """Flag name (underscores, no dashes in front) -> the value a list of flags gives it."""
    values: dict[str, str] = {}
    name = None
    for token in flags:
        if token.startswith("--"):
            name, _, value = token.removeprefix("--").partition("=")
            name = name.replace("-", "_")
            values[name] = value
        elif name is not None:
            values[name] = f"{values[name]} {token}".strip()
    return values


def _gives_task(argv: list[str]) -> bool:
    return any(token == "--task" or token.startswith("--task=") for token in argv)


def _field_names(*classes: type) -> set[str]:
    return {field.name for cls in classes for field in dataclasses.fields(cls) if field.init}


def _dataclass_default(cls: type, name: str) -> object:
    field = next(field for field in dataclasses.fields(cls) if field.name == name)
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None if field.default is dataclasses.MISSING else field.default


def _fill(text: str, width: int) -> str:
    return textwrap.fill(text, width, break_on_hyphens=False, break_long_words=False)
