"""DeepSpeed configuration: a shipped preset by name, a user's JSON file, or none (DDP).

The presets leave batch sizes, learning rate, precision and clipping as "auto" so the
Hugging Face Trainer fills them from its own flags: one source of truth for each number.
They carry no "optimizer" block (except CPU offload, which needs DeepSpeed's CPU Adam), so
the Trainer's optimizer is used and nothing has to be compiled at start-up.
"""

from __future__ import annotations

import json
from pathlib import Path

from trainer.common.errors import UserError

PRESETS_DIR = Path(__file__).parent.parent / "presets"
NO_DEEPSPEED = "none"


def preset_names() -> list[str]:
    return sorted(path.stem for path in PRESETS_DIR.glob("*.json")) + [NO_DEEPSPEED]


def resolve_deepspeed_config(choice: str) -> Path | None:
    """Return the JSON file for a preset name or user path; None means plain DDP."""
    if choice == NO_DEEPSPEED:
        return None
    preset = PRESETS_DIR / f"{choice}.json"
    if preset.is_file():
        return preset
    path = Path(choice)
    if path.suffix != ".json":
        raise UserError(
            f'Unknown DeepSpeed preset "{choice}": choose one of {", ".join(preset_names())}, '
            "or give the path of a DeepSpeed JSON config."
        )
    if not path.is_file():
        raise UserError(f"DeepSpeed config {choice} not found.")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise UserError(f"DeepSpeed config {choice} is not valid JSON ({error}).") from None
    if not isinstance(config, dict):
        raise UserError(f"DeepSpeed config {choice} must be a JSON object.")
    return path.resolve()
