"""Flags as dataclass fields: each one's default and the help `--help` shows, which
HfArgumentParser turns into a command-line flag."""

from __future__ import annotations

from dataclasses import field


def flag(default, help: str, **metadata):
    """A dataclass field for a flag with this default and help (`metadata` for argparse,
    e.g. `action="extend"`). A list default is copied for every instance."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help, **metadata})
    return field(default=default, metadata={"help": help, **metadata})
