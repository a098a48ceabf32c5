"""`python -m trainer recipe.yaml --learning_rate 3e-5`: flags from a YAML file.

The file maps flag names to values. Its flags are placed before the command line's, so
argparse lets the command line win: the file holds a recipe, the command line tweaks it.
A bare file name that does not exist locally is looked up among the recipes shipped in
`trainer/recipes/`, so `docker run IMAGE whisper-small.yaml` works without mounting files.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from trainer.common.errors import UserError

RECIPES_DIR = Path(__file__).parent.parent / "recipes"
CONFIG_SUFFIXES = (".yaml", ".yml")


def shipped_recipes() -> list[str]:
    return sorted(path.name for path in RECIPES_DIR.glob("*.yaml"))


def expand_config_file(argv: list[str]) -> list[str]:
    """Replace a leading YAML file argument by the flags it holds."""
    if not argv or argv[0].startswith("-"):
        return list(argv)
    if not argv[0].endswith(CONFIG_SUFFIXES):
        raise UserError(
            f'Unexpected argument "{argv[0]}": flags start with "--", and only the first '
            "argument may be a .yaml config file."
        )
    return config_file_flags(locate_config_file(argv[0])) + list(argv[1:])


def command_line(argv: list[str]) -> list[str]:
    """The flags typed after the recipe (all of `argv` when there is none)."""
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
    try:
        content = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        message = " ".join(str(error).split())
        raise UserError(f"Config file {path} is not valid YAML: {message}") from None
    if content is None:
        return []
    if not isinstance(content, dict):
        raise UserError(f"Config file {path} must map flag names to values.")
    flags: list[str] = []
    for key, value in content.items():
        if value is None:
            continue
        flags.append(f"--{key}")
        flags.extend(_flag_values(value))
    return flags


def _flag_values(value: object) -> list[str]:
    if isinstance(value, bool):
        return [str(value).lower()]
    if isinstance(value, list):
        return [str(item) for item in value]
    if isinstance(value, dict):
        return [json.dumps(value)]
    return [str(value)]
