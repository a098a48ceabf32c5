"""`python -m trainer --help` and `--help-all`, in-process: the project's flags in
sections, then the Hugging Face training flags (the most used ones, or all of them), every
flag listed once (the entry point itself: tests/processes/test_help_runs.py)."""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections import Counter

import pytest

from tests.support.help_text import IMAGE_FLAGS, WHISPER_FLAGS, listed
from trainer.command_line.help import CURATED_TRAINING_FLAGS
from trainer.command_line.parser import FlagParser, build_parser
from trainer.launcher.main import main
from trainer.settings.launcher_flags import LauncherArguments
from trainer.tasks import DEFAULT_TASK, load_task, task_names


def help_output(capsys, *argv: str) -> str:
    main(list(argv))
    captured = capsys.readouterr()
    assert captured.err == ""
    return captured.out


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [action for action in parser._actions if action.option_strings]


def all_options(task_name: str) -> list[argparse.Action]:
    """Every option of the launcher's parser and of the task's full training parser."""
    launcher = FlagParser([LauncherArguments], add_help=False)
    return options(launcher) + options(build_parser(load_task(task_name)))


def project_and_curated(task_name: str) -> set[str]:
    """What --help must list: every flag of this project, and the curated Trainer flags."""
    task_class = load_task(task_name)
    hf_fields = {field.name for field in dataclasses.fields(task_class.training_arguments_class)}
    launcher_fields = {field.name for field in dataclasses.fields(LauncherArguments)}
    return {"--help-all"} | {
        action.option_strings[0]
        for action in all_options(task_name)
        if action.dest != "help"
        and (
            action.dest not in hf_fields
            or action.dest in launcher_fields  # --deepspeed: the launcher's
            or action.dest in CURATED_TRAINING_FLAGS
        )
    }


@pytest.mark.parametrize(
    ("argv", "task_name"),
    [((), DEFAULT_TASK), (("vit-beans.yaml",), "image-classification")],
)
@pytest.mark.parametrize("help_flag", ["--help", "--help-all"])
def test_sections_come_in_order(capsys, argv, task_name, help_flag):
    text = help_output(capsys, *argv, help_flag)
    assert text.startswith("usage: python -m trainer [recipe.yaml] [flags]\n")
    assert "docs/launching.md" in text
    headings = [
        "1. Launcher flags (once per node):",
        "2. Model and data:",
        f"3. {task_name} flags:",
        "4. Outputs and checkpoints:",
        "5. Hugging Face training flags (",
    ]
    positions = [text.find(f"\n{heading}") for heading in headings]
    assert -1 not in positions, headings
    assert positions == sorted(positions)
    # each section holds its own flags
    sections = dict(zip(headings, re.split(r"\n\d\. ", text)[1:], strict=True))
    assert "--rdzv_timeout" in listed(sections[headings[0]])
    assert {"--task", "--model_name_or_path", "--dataset_name"} <= set(
        listed(sections[headings[1]])
    )
    assert "--resume" in listed(sections[headings[3]])
    assert {"--learning_rate", "--metric_for_best_model"} <= set(listed(sections[headings[4]]))


def test_a_recipe_selects_its_task(capsys):
    image = listed(help_output(capsys, "vit-beans.yaml", "--help"))
    speech = listed(help_output(capsys, "--help"))
    assert set(IMAGE_FLAGS) <= set(image)
    assert not set(WHISPER_FLAGS) & set(image)
    assert set(WHISPER_FLAGS) <= set(speech)
    assert not {"--image_column_name", "--augment"} & set(speech)


def test_defaults_are_the_ones_the_project_applies(capsys):
    text = " ".join(help_output(capsys, "vit-beans.yaml", "--help").split())
    assert "--output_dir STR (default: outputs, set by this project" in text  # TRAINING_DEFAULTS
    assert "(default: accuracy, set by this project" in text  # the task's default metric
    assert "(default: 5e-05; vit-beans.yaml sets 2e-05)" in text  # what the recipe says
    assert "--lr_scheduler_type CHOICE (default: linear)" in text
    assert "--eval_strategy {no,steps,epoch}" in text
    everything = " ".join(help_output(capsys, "vit-beans.yaml", "--help-all").split())
    assert "--output_dir STR The output directory" in everything  # the Trainer's own help
    assert "Choices: linear, cosine," in everything
    speech = " ".join(help_output(capsys, "--help").split())
    assert "(default: wer, set by this project" in speech


@pytest.mark.parametrize("task_name", task_names())
def test_help_fits_in_230_lines_of_a_terminal(capsys, monkeypatch, task_name):
    monkeypatch.setenv("COLUMNS", "80")
    text = help_output(capsys, "--task", task_name, "--help")
    assert len(text.splitlines()) <= 230
    assert max(len(line) for line in text.splitlines()) <= 80


@pytest.mark.parametrize("argv", [(), ("vit-beans.yaml",), ("--task", "text-classification")])
@pytest.mark.parametrize("help_flag", ["--help", "--help-all", "-h"])
def test_no_flag_is_listed_twice(capsys, argv, help_flag):
    counts = Counter(listed(help_output(capsys, *argv, help_flag)))
    assert counts, "no flags found"
    assert [name for name, count in counts.items() if count > 1] == []


@pytest.mark.parametrize("task_name", task_names())
def test_help_all_lists_every_option_and_help_the_project_flags(capsys, task_name):
    everything = help_output(capsys, "--task", task_name, "--help-all")
    short = help_output(capsys, "--task", task_name, "--help")
    assert "\n  -h, --help " in everything
    full = set(listed(everything))
    for action in all_options(task_name):
        if action.dest == "help":
            continue
        primary, *aliases = action.option_strings
        assert primary in full, primary
        assert all(alias == primary.replace("_", "-") for alias in aliases), aliases
    expected_short = project_and_curated(task_name)
    assert set(listed(short)) == expected_short
    hidden = len(full) - len(expected_short)
    assert hidden > 60, "--help should leave most of the Trainer's flags to --help-all"
    assert f"... and {hidden} more Hugging Face training flags are accepted" in short
    assert "more Hugging Face training flags are accepted" not in everything
    assert len(listed(short)) <= len(listed(everything)) / 2  # at most half


def test_a_missing_recipe_still_gives_help_for_the_default_task(capsys):
    text = help_output(capsys, "no-such-recipe.yaml", "--help")
    assert "note: Config file no-such-recipe.yaml not found" in text
    assert f"3. {DEFAULT_TASK} flags:" in text
    assert "error:" not in text
    assert set(WHISPER_FLAGS) <= set(listed(text))


def test_an_unknown_task_gives_help_for_the_default_task(capsys):
    text = help_output(capsys, "--task", "no-such-task", "--help")
    assert 'note: Unknown task "no-such-task"' in text
    assert f"3. {DEFAULT_TASK} flags:" in text
