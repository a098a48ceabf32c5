"""`python -m trainer recipe.yaml --learning_rate 3e-5`: flags from a YAML file.

The file maps flag names to values. Its flags are placed before the command line's, so
argparse lets the command line win: the file holds a recipe, the command line tweaks it.
A bare file name that does not exist locally is looked up among the recipes shipped in
`trainer/recipes/`, so `docker run IMAGE whisper-small.yaml` works without mounting files.
`--config FILE.yaml` anywhere on the line is the same file as TRL's `TrlParser` reads it
(`trl sft --config recipe.yaml`, the alignment-handbook's and open-r1's launches).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import yaml

from trainer.command_line.foreign_files import known_names, translate_file
from trainer.common.errors import UserError
from trainer.settings.launcher_flags import LauncherArguments
from trainer.settings.output_flags import OutputArguments

RECIPES_DIR = Path(__file__).parent.parent / "recipes"
CONFIG_SUFFIXES = (".yaml", ".yml")
REPEATABLE_FLAGS = {
    f"--{field.name}"
    for arguments in (LauncherArguments, OutputArguments)
    for field in dataclasses.fields(arguments)
    if field.metadata.get("action") == "extend"
}
"""Flags whose repeats add up rather than replace each other: a file's list for one of them is
several values; any other flag's list is one comma-separated value (`report_to: [tensorboard,
wandb]`, `lora_target_modules: [q_proj, v_proj]`)."""
HARDWARE_DECIDES = {"bf16", "fp16", "tf32"}
"""Precision keys whose value `auto` (Axolotl's `bf16: auto`) asks for what a left-out flag
gets here: the hardware decides."""


def shipped_recipes() -> list[str]:
    return sorted(path.name for path in RECIPES_DIR.glob("*.yaml"))


def expand_config_file(argv: list[str]) -> list[str]:
    """Replace a leading YAML file argument, or TRL's `--config FILE`, by the flags it holds."""
    recipe, rest = config_argument(argv)
    if recipe is None:
        return rest
    return config_file_flags(locate_config_file(recipe)) + rest


def config_argument(argv: list[str]) -> tuple[str | None, list[str]]:
    """(the recipe file named by a leading argument or by `--config FILE`, the other tokens);
    UserError for a stray argument, a `--config` without a file, or two files."""
    leading, rest = _leading_recipe(argv)
    given = [i for i, token in enumerate(rest) if token.split("=", 1)[0] == "--config"]
    if not given:
        return leading, rest
    if leading is not None or len(given) > 1:
        raise UserError("Two config files are given (a leading recipe or --config FILE): "
                        "give one, and the other's settings as flags.")  # fmt: skip
    i = given[0]
    token = rest[i]
    if "=" in token:
        return token.split("=", 1)[1], rest[:i] + rest[i + 1 :]
    if i + 1 >= len(rest) or rest[i + 1].startswith("-"):
        raise UserError("--config needs a YAML file: --config recipe.yaml (TRL's TrlParser).")
    return rest[i + 1], rest[:i] + rest[i + 2 :]


def _leading_recipe(argv: list[str]) -> tuple[str | None, list[str]]:
    if not argv or argv[0].startswith("-"):
        return None, list(argv)
    if not argv[0].endswith(CONFIG_SUFFIXES):
        raise UserError(
            f'Unexpected argument "{argv[0]}": flags start with "--", and only the first '
            "argument may be a .yaml config file (or give it as --config FILE.yaml)."
        )
    return argv[0], list(argv[1:])


def command_line(argv: list[str]) -> list[str]:
    """The flags typed besides the recipe (all of `argv` when there is none)."""
    try:
        return config_argument(argv)[1]
    except UserError:
        return list(argv[1:] if argv and not argv[0].startswith("-") else argv)


def locate_config_file(name: str) -> Path:
    path = Path(name)
    if path.is_file():
        return path
    shipped = RECIPES_DIR / path.name
    if path.parent == Path(".") and shipped.is_file():
        return shipped
    raise UserError(
        f"Config file {name} not found (shipped recipes: {', '.join(shipped_recipes())})."
    )


def config_file_flags(path: Path) -> list[str]:
    """The flags a recipe file gives (an Axolotl or LLaMA-Factory file's keys translated:
    trainer/command_line/foreign_files.py)."""
    return _file_flags(path)[0]


def config_file_notices(argv: list[str]) -> list[str]:
    """The notices of the recipe file `argv` names (an Axolotl or LLaMA-Factory file's keys
    ignored), for the launcher to print; none without one."""
    name = config_argument(argv)[0]
    return [] if name is None else _file_flags(locate_config_file(name))[1]


def _file_flags(path: Path) -> tuple[list[str], list[str]]:
    try:
        content = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        message = " ".join(str(error).split())
        raise UserError(f"Config file {path} is not valid YAML: {message}") from None
    if content is None:
        return [], []
    if not isinstance(content, dict):
        raise UserError(f"Config file {path} must map flag names to values.")
    content, notices = translate_file(content, known_names)
    if "env" in content:
        raise UserError(f"Config file {path}: env (TRL's environment variables) is not read: "
                        "set them in the job's environment (docker run -e, or the job "
                        "spec's env).")  # fmt: skip
    flags: list[str] = []
    for key, value in content.items():
        if value is None or (key in HARDWARE_DECIDES and value == "auto"):
            continue
        flags.append(f"--{key}")
        flags.extend(_flag_values(f"--{key}", value))
    return flags, notices


def _flag_values(name: str, value: object) -> list[str]:
    if isinstance(value, bool):
        return [str(value).lower()]
    if isinstance(value, list) and name in REPEATABLE_FLAGS:
        return [str(item) for item in value]
    if isinstance(value, list):
        return [",".join(_flag_values(name, item)[0] for item in value)]
    if isinstance(value, dict):
        return [json.dumps(value)]
    return [str(value)]
