"""The project's own flags, with their types and defaults, against tests/unit/flag_snapshot.json.

A flag renamed, removed, retyped or given a new default changes what every recipe, job spec
and command line out there means, so it must be deliberate: this test fails on any change
and says which flags changed. To accept a change, rewrite the snapshot and commit it with
the change:

    UPDATE_FLAG_SNAPSHOT=1 pytest tests/unit/test_flag_snapshot.py

Covered: the launcher's, task selector's, model's, data's and outputs' dataclasses, every
task's own flags, and the defaults this project sets for Hugging Face training flags
(TRAINING_DEFAULTS and each task's metric_for_best_model). The Trainer's own flags are
transformers' business and are not snapshotted.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import types
import typing
from pathlib import Path

import pytest

from trainer.command_line.parser import TRAINING_DEFAULTS, task_arguments
from trainer.settings.data_flags import DataArguments
from trainer.settings.launcher_flags import LauncherArguments
from trainer.settings.model_flags import ModelArguments
from trainer.settings.output_flags import OutputArguments
from trainer.tasks import load_task, task_names

SNAPSHOT = Path(__file__).with_name("flag_snapshot.json")
UPDATE_VARIABLE = "UPDATE_FLAG_SNAPSHOT"

Snapshot = dict[str, dict[str, dict[str, object]]]
"""group -> flag -> {"type": ..., "default": ...}"""


def type_name(annotation: object) -> str:
    """A stable spelling of a type: `int`, `str | None`, `Literal['a', 'b']`, `list[str]`."""
    if annotation is type(None):
        return "None"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(arg) for arg in args)
    if origin is typing.Literal:
        return f"Literal[{', '.join(repr(arg) for arg in args)}]"
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(type_name(arg) for arg in args)}]"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation)


def json_value(value: object) -> object:
    if isinstance(value, enum.Enum):
        return json_value(value.value)
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, list | tuple):
        return [json_value(item) for item in value]
    if isinstance(value, dict):
        return {str(key): json_value(item) for key, item in value.items()}
    return repr(value)


def field_default(field: dataclasses.Field) -> object:
    if field.default_factory is not dataclasses.MISSING:
        return json_value(field.default_factory())
    return "<required>" if field.default is dataclasses.MISSING else json_value(field.default)


def dataclass_flags(cls: type, values: dict[str, object] | None = None) -> dict:
    """Each init field of `cls` as a flag (or only those in `values`, with those defaults)."""
    hints = typing.get_type_hints(cls)
    flags = {}
    for field in dataclasses.fields(cls):
        if not field.init or (values is not None and field.name not in values):
            continue
        default = field_default(field) if values is None else json_value(values[field.name])
        flags[f"--{field.name}"] = {
            "type": type_name(hints.get(field.name, field.type)),
            "default": default,
        }
    return flags


def current_snapshot() -> Snapshot:
    snapshot: Snapshot = {
        cls.__name__: dataclass_flags(cls)
        for cls in (LauncherArguments, task_arguments(), ModelArguments, DataArguments)
    }
    snapshot[OutputArguments.__name__] = dataclass_flags(OutputArguments)
    for name in task_names():
        task_class = load_task(name)
        snapshot[f"task {name}"] = dataclass_flags(task_class.spec.flags)
        overrides = {**TRAINING_DEFAULTS, "metric_for_best_model": task_class.default_metric}
        snapshot[f"task {name}: training defaults set by this project"] = dataclass_flags(
            task_class.training_arguments_class, overrides
        )
    return snapshot


def describe_changes(old: Snapshot, new: Snapshot) -> list[str]:
    """One line per flag added, removed or changed between two snapshots."""

    def flat(snapshot: Snapshot) -> dict[tuple[str, str], dict]:
        return {
            (group, flag): spec for group, flags in snapshot.items() for flag, spec in flags.items()
        }

    before, after = flat(old), flat(new)
    lines = []
    for key in sorted(before.keys() | after.keys()):
        group, flag = key
        if key not in before:
            lines.append(f"added:   [{group}] {flag}: {json.dumps(after[key])}")
        elif key not in after:
            lines.append(f"removed: [{group}] {flag} (was {json.dumps(before[key])})")
        elif before[key] != after[key]:
            changes = ", ".join(
                f"{part} {json.dumps(before[key].get(part))} -> {json.dumps(after[key].get(part))}"
                for part in ("type", "default")
                if before[key].get(part) != after[key].get(part)
            )
            lines.append(f"changed: [{group}] {flag}: {changes}")
    return lines


def test_the_projects_flags_match_the_snapshot(capsys):
    current = current_snapshot()
    json.dumps(current, allow_nan=False)  # every default serialises as plain JSON
    committed = json.loads(SNAPSHOT.read_text()) if SNAPSHOT.exists() else {}
    changes = describe_changes(committed, current)
    if os.environ.get(UPDATE_VARIABLE):
        SNAPSHOT.write_text(json.dumps(current, indent=2) + "\n")
        with capsys.disabled():
            print(
                f"\n{SNAPSHOT.name} rewritten: "
                + (f"{len(changes)} change(s)" if changes else "unchanged")
            )
            print("\n".join(f"  {line}" for line in changes))
        return
    if changes:
        pytest.fail(
            f"The project's flags differ from {SNAPSHOT.relative_to(SNAPSHOT.parent.parent)}:\n"
            + "\n".join(f"  {line}" for line in changes)
            + "\nIf this is deliberate, rewrite the snapshot and commit it with the change:\n"
            f"  {UPDATE_VARIABLE}=1 pytest tests/unit/test_flag_snapshot.py",
            pytrace=False,
        )


def test_a_change_is_described_flag_by_flag():
    old = {
        "DataArguments": {
            "--kept": {"type": "int", "default": 1},
            "--gone": {"type": "str", "default": "x"},
            "--retyped": {"type": "int", "default": 2},
        }
    }
    new = {
        "DataArguments": {
            "--kept": {"type": "int", "default": 1},
            "--retyped": {"type": "float", "default": 2.5},
        },
        "task new": {"--fresh": {"type": "bool", "default": False}},
    }
    assert describe_changes(old, new) == [
        'removed: [DataArguments] --gone (was {"type": "str", "default": "x"})',
        'changed: [DataArguments] --retyped: type "int" -> "float", default 2 -> 2.5',
        'added:   [task new] --fresh: {"type": "bool", "default": false}',
    ]


def test_types_are_stable_strings():
    assert type_name(int | None) == "int | None"
    assert type_name(typing.Optional[str]) == "str | None"  # noqa: UP045 (the old spelling)
    assert type_name(typing.Literal["auto", "never"]) == "Literal['auto', 'never']"
    assert type_name(list[str]) == "list[str]"
