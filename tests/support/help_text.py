"""Reading `python -m trainer --help`: the flags it lists, and flags only the speech or
only the image task has (tests/unit/test_help.py and tests/processes/test_help_runs.py)."""

from __future__ import annotations

import re

ENTRY = re.compile(r"^  (--[A-Za-z0-9][\w-]*)", re.MULTILINE)
"""The flag that starts a help entry (wrapped help lines are indented further)."""

WHISPER_FLAGS = ("--language", "--whisper_task", "--audio_column_name", "--freeze_encoder")
IMAGE_FLAGS = ("--image_column_name", "--augment", "--label_column_name", "--class_weights")


def listed(text: str) -> list[str]:
    return ENTRY.findall(text)
