"""The English spelling table of Whisper's WER normaliser, restored where a checkpoint lost it.

`WhisperTokenizer.normalize` (the English normaliser applied before WER) maps British to
American spellings with a table released checkpoints carry as `normalizer.json`. transformers
5's tokenizer save no longer writes it, so an English-only model it saved (this project's
delivered model among them) has none, and `normalize()` raises inside the first evaluation,
after training. The table is openai-whisper's `normalizers/english.json`, the released
checkpoints' file; the image installs openai-whisper for its tokenizer assets.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from trainer.common.errors import UserError

SPELLING_FILE = "normalizer.json"
"""What `WhisperTokenizer.from_pretrained` reads the table from."""

WHISPER_INSTALL_HINT = "install with: pip install --no-deps openai-whisper==20250625"


def whisper_package_dir() -> Path:
    """openai-whisper's installed package folder (its assets, not its code, are used)."""
    spec = importlib.util.find_spec("whisper")
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"openai-whisper's tokenizer files are needed; {WHISPER_INSTALL_HINT}")
    return Path(spec.submodule_search_locations[0])


def openai_spelling_file() -> Path:
    return whisper_package_dir() / "normalizers" / "english.json"


def restore_english_spelling(tokenizer) -> str | None:
    """Give `tokenizer` openai-whisper's table if its checkpoint had none; the notice to
    print when it did, else None."""
    if tokenizer.english_spelling_normalizer is not None:
        return None
    source = openai_spelling_file()
    tokenizer.english_spelling_normalizer = json.loads(source.read_text(encoding="utf-8"))
    return (
        f"notice: the checkpoint has no {SPELLING_FILE} (transformers 5 does not save it); "
        f"English WER uses openai-whisper's spelling table ({source}), and every checkpoint "
        "and the delivered model carry it"
    )


def save_english_spelling(tokenizer, directory: str | Path) -> None:
    """Write the tokenizer's table beside a saved tokenizer, as released checkpoints have it,
    so the folder can be fine-tuned and evaluated again."""
    table = tokenizer.english_spelling_normalizer
    if table is not None:
        text = json.dumps(table, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        (Path(directory) / SPELLING_FILE).write_text(text, encoding="utf-8")
