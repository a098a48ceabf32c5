"""What a Whisper checkpoint can do, read from its JSON files (no weights, no network).

The released families differ in ways that crash a run late, after hours of GPU time, if the
training program assumes one shape:
- English-only checkpoints (`openai/whisper-*.en`, `distil-*.en`) say `is_multilingual:
  false` and carry no `lang_to_id`/`task_to_id`: their prompt is `<|startoftranscript|>
  <|notimestamps|>`, and `generate()` raises if a language or task is set on them.
- Multilingual checkpoints before large-v3 know 99 languages; large-v3 and its turbo and
  distil derivatives know 100 (`yue` added) and take 128 mel bins instead of 80.
- The processor's window (`chunk_length`, 30 s when released) bounds the clips' duration.

The launcher reads these files for a local folder, or a hub id already in the local cache,
and refuses a combination that would fail; the training processes apply the same rules to
the loaded model, so a checkpoint the launcher could not read is still checked before step 1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from transformers.models.whisper.tokenization_whisper import LANGUAGES, TO_LANGUAGE_CODE

from trainer.common.errors import UserError

ENGLISH_ONLY_VOCABULARY = 51_864
"""The `*.en` checkpoints' vocabulary (GPT-2's 50,257 ids plus Whisper's special tokens);
what tells an English-only checkpoint apart when its generation config is too old to say."""

CHECKPOINT_FILES = (
    "config.json",
    "generation_config.json",
    "processor_config.json",
    "preprocessor_config.json",
)
"""The small JSON files that describe a checkpoint. The feature extractor's settings are in
`preprocessor_config.json` in released checkpoints, and under `feature_extractor` in
`processor_config.json` in folders saved by transformers 5."""


def language_name(language: str) -> str:
    """Accept a language by name or code, case-insensitively; return Whisper's name."""
    key = language.lower().strip("<|>")
    if key in TO_LANGUAGE_CODE:
        return LANGUAGES[TO_LANGUAGE_CODE[key]]
    if key in LANGUAGES:
        return LANGUAGES[key]
    raise ValueError(
        f'Unknown language "{language}": use a Whisper language name or code (e.g. english, en).'
    )


@dataclass(frozen=True)
class Prompt:
    """The language and task tokens that start every label sequence and generation; None: no such
    token (English-only checkpoints have neither; a multilingual one without a language leaves
    it to `generate()`, which detects each clip's, then forces the task)."""

    language: str | None
    task: str | None
    english: bool
    """Whether transcripts are English (so Whisper's English normaliser applies to WER)."""


def is_multilingual(config: dict, generation: dict) -> bool:
    """What the generation config says, else (an old one) what its language tokens or the
    vocabulary's size say."""
    multilingual = generation.get("is_multilingual")
    if multilingual is None and "lang_to_id" in generation:
        multilingual = True
    if multilingual is None:
        vocabulary = config.get("vocab_size")
        multilingual = vocabulary is None or vocabulary > ENGLISH_ONLY_VOCABULARY
    return bool(multilingual)


@dataclass(frozen=True)
class WhisperCheckpoint:
    name: str
    multilingual: bool
    language_codes: frozenset[str]
    """Codes of the language tokens the checkpoint knows (from `lang_to_id`)."""
    saved_language: str | None
    """The language a fine-tuned checkpoint was saved with (its generation config's)."""
    mel_bins: int
    processor_mel_bins: int | None
    window_seconds: float | None

    @classmethod
    def from_dicts(
        cls, name: str, config: dict, generation: dict | None, preprocessor: dict | None
    ) -> WhisperCheckpoint:
        generation = generation or {}
        preprocessor = preprocessor or {}
        multilingual = is_multilingual(config, generation)
        saved = generation.get("language")
        return cls(
            name=name,
            multilingual=multilingual,
            language_codes=frozenset(
                token.strip("<|>") for token in generation.get("lang_to_id") or {}
            ),
            saved_language=language_name(saved) if multilingual and saved else None,
            mel_bins=int(config.get("num_mel_bins", 80)),
            processor_mel_bins=preprocessor.get("feature_size"),
            window_seconds=preprocessor.get("chunk_length"),
        )

    @classmethod
    def from_loaded(cls, name: str, model, processor) -> WhisperCheckpoint:
        return cls.from_dicts(
            name,
            model.config.to_dict(),
            model.generation_config.to_dict(),
            processor.feature_extractor.to_dict(),
        )

    def prompt(self, language: str | None, task: str) -> Prompt:
        """The prompt for `--language` (a Whisper language name, or None) and
        `--whisper_task`; a UserError for what this checkpoint cannot do."""
        if not self.multilingual:
            if language not in (None, "english"):
                raise UserError(
                    f"--language {language}: {self.name} is an English-only Whisper checkpoint "
                    "(is_multilingual false); leave --language out or use a multilingual "
                    "checkpoint (e.g. openai/whisper-small)."
                )
            if task == "translate":
                raise UserError(
                    f"--whisper_task translate: {self.name} is an English-only Whisper "
                    "checkpoint, which only transcribes; use a multilingual checkpoint."
                )
            return Prompt(language=None, task=None, english=True)
        language = language or self.saved_language
        if language is not None and self.language_codes:
            code = TO_LANGUAGE_CODE[language]
            if code not in self.language_codes:
                raise UserError(
                    f"--language {language}: {self.name} has no <|{code}|> token (it knows "
                    f"{len(self.language_codes)} languages; large-v3 added Cantonese, yue)."
                )
        return Prompt(language=language, task=task, english=language == "english")

    def check_processor(self, max_duration: float | None) -> None:
        """The processor must make the features the model reads, and clips must fit its
        window (longer ones would be cut while their transcripts are not)."""
        if self.processor_mel_bins is not None and self.processor_mel_bins != self.mel_bins:
            raise UserError(
                f"{self.name}: the model takes {self.mel_bins} mel bins (num_mel_bins in "
                f"config.json) but its processor makes {self.processor_mel_bins} (feature_size "
                "in preprocessor_config.json); save the processor that belongs to the model."
            )
        window = self.window_seconds
        if max_duration is not None and window is not None and max_duration > window:
            raise UserError(
                f"--max_duration_in_seconds {max_duration:g} exceeds {self.name}'s {window:g} s "
                "input window; longer clips would be cut while their transcripts are not."
            )


def read_checkpoint(name_or_path: str, cache_dir: str | None) -> WhisperCheckpoint | None:
    """The checkpoint's description from a local folder or the local hub cache, or None
    when its config is not on this machine (the training processes check it after loading)."""
    files = {}
    for filename in CHECKPOINT_FILES:
        path = _local_file(name_or_path, filename, cache_dir)
        if path is not None:
            files[filename] = _read_json(path)
    if "config.json" not in files:
        return None
    model_type = files["config.json"].get("model_type", "whisper")
    if model_type != "whisper":
        raise UserError(
            f"{name_or_path} is a {model_type} model, not Whisper; the speech-recognition "
            "task fine-tunes Whisper checkpoints (--task selects another task)."
        )
    feature_extractor = files.get("processor_config.json", {}).get("feature_extractor")
    return WhisperCheckpoint.from_dicts(
        name_or_path,
        files["config.json"],
        files.get("generation_config.json"),
        feature_extractor or files.get("preprocessor_config.json"),
    )


def _local_file(name_or_path: str, filename: str, cache_dir: str | None) -> Path | None:
    folder = Path(name_or_path)
    if folder.is_dir():
        return folder / filename if (folder / filename).is_file() else None
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(name_or_path, filename, cache_dir=cache_dir)
    except ValueError:  # not a valid repo id: the loader will say so
        return None
    return Path(cached) if isinstance(cached, str) else None


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise UserError(f"{path} is not readable JSON ({error}).") from None
