"""Tiny Whisper checkpoints of every family users fine-tune, built offline from each
family's real files.

A test suite with one tiny multilingual model stays green while a real English-only
checkpoint crashes. So each family here keeps what its published config.json,
generation_config.json, preprocessor_config.json and tokenizer carry: the tokenizer
(rebuilt from openai-whisper's `gpt2.tiktoken` or `multilingual.tiktoken`, 99 or 100
languages), the token ids in the configs (including the quirks: large-v3's config says
`pad_token_id` 50256 while its tokenizer pads with 50257; the multilingual config.json
files still force English with `forced_decoder_ids`), `is_multilingual`,
`lang_to_id`/`task_to_id` only where the family has them, the mel-bin count, and the
layer ratio (turbo's 4-layer decoder, distil's 2-layer one). Only the widths, layer counts
and the audio window are shrunk, so a model trains in seconds on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from transformers import WhisperConfig

from trainer.tasks.speech_recognition.demo import (
    ENDOFTEXT,
    TINY_DIMENSIONS,
    begin_suppress_tokens,
    build_whisper_tokenizer,
    save_random_whisper,
    suppress_tokens,
    whisper_generation_config,
)

CHUNK_SECONDS = 6
"""The tiny models' audio window (released models: 30 s); the demo clips are 1-3 s."""


@dataclass(frozen=True)
class WhisperFamily:
    name: str
    multilingual: bool
    num_languages: int = 99
    num_mel_bins: int = 80
    layers: dict = field(default_factory=dict)
    """Encoder/decoder layer counts where the family's ratio differs from the tiny default."""
    config_pad_token_id: int | None = None
    """config.json's pad_token_id where it differs from the tokenizer's (large-v3)."""


FAMILIES = {
    family.name: family
    for family in (
        WhisperFamily("tiny.en", multilingual=False),
        WhisperFamily("small", multilingual=True),
        WhisperFamily("large-v3", True, num_languages=100, num_mel_bins=128,
                      config_pad_token_id=50256),
        WhisperFamily("large-v3-turbo", True, num_languages=100, num_mel_bins=128,
                      layers={"encoder_layers": 2, "decoder_layers": 4},
                      config_pad_token_id=50256),
        WhisperFamily("distil-large-v3", True, num_languages=100, num_mel_bins=128,
                      layers={"encoder_layers": 4, "decoder_layers": 2},
                      config_pad_token_id=50256),
    )
}  # fmt: skip


def build_family_checkpoint(family: WhisperFamily, model_dir: Path) -> Path:
    """Save a random tiny checkpoint of `family`, shaped like its hub folder."""
    tokenizer = build_whisper_tokenizer(family.multilingual, family.num_languages)
    ids = tokenizer.convert_tokens_to_ids
    eot, start = ids(ENDOFTEXT), ids("<|startoftranscript|>")
    if family.multilingual:
        # config.json of openai/whisper-tiny...medium: still forcing English transcription
        forced = [[1, ids("<|en|>")], [2, ids("<|transcribe|>")], [3, ids("<|notimestamps|>")]]
        token_ids = {"bos_token_id": eot, "eos_token_id": eot, "pad_token_id": eot}
    else:
        forced = [[1, ids("<|notimestamps|>")]]
        token_ids = {"bos_token_id": start, "eos_token_id": eot, "pad_token_id": eot}
    if family.config_pad_token_id is not None:
        token_ids["pad_token_id"] = family.config_pad_token_id
        forced = None  # large-v3's config.json has none
    config = WhisperConfig(
        vocab_size=len(tokenizer),
        num_mel_bins=family.num_mel_bins,
        **(TINY_DIMENSIONS | family.layers),
        max_source_positions=CHUNK_SECONDS * 50,
        max_target_positions=448,
        decoder_start_token_id=start,
        **token_ids,
        forced_decoder_ids=forced,
        suppress_tokens=suppress_tokens(tokenizer, family.multilingual),
        begin_suppress_tokens=begin_suppress_tokens(tokenizer),
    )
    generation = whisper_generation_config(tokenizer, family.multilingual)
    save_random_whisper(model_dir, config, generation, tokenizer, CHUNK_SECONDS)
    return model_dir
