"""The released Whisper sizes' dimensions, to build a randomly initialised model of a real
size without a download (the throughput benchmark, memory estimates in tests)."""

from __future__ import annotations

WHISPER_SIZES = {
    "tiny": (384, 4, 6, 1536, 80, 51865),
    "base": (512, 6, 8, 2048, 80, 51865),
    "small": (768, 12, 12, 3072, 80, 51865),
    "medium": (1024, 24, 16, 4096, 80, 51865),
    "large-v3": (1280, 32, 20, 5120, 128, 51866),
}
"""name: (d_model, layers (encoder = decoder), heads, FFN width, mel bins, vocabulary), from
the released checkpoints' config.json files (openai/whisper-*)."""


def whisper_config(size: str, **overrides):
    """A `WhisperConfig` with the dimensions of the released `size` (1500 audio positions,
    448 label positions); `overrides` set the token ids and the like."""
    from transformers import WhisperConfig

    d_model, layers, heads, ffn, mels, vocab = WHISPER_SIZES[size]
    return WhisperConfig(
        vocab_size=vocab,
        num_mel_bins=mels,
        d_model=d_model,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=ffn,
        decoder_ffn_dim=ffn,
        max_source_positions=1500,
        max_target_positions=448,
        **overrides,
    )
