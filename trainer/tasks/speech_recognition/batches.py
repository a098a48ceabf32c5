"""Speech batches: decoded clips and transcripts become Whisper's inputs and labels, with
the log-mel features computed in the data loader (`SpeechCollator`) or on the training
process's device (`LogMelOnDevice`, used by trainer/tasks/trainers.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

SAMPLING_RATE = 16_000
"""Whisper's feature extractor expects 16 kHz audio; every source is resampled to it."""

AUDIO_BATCH_KEY = "input_audio"
"""Batch key of padded waveforms whose log-mel features the training process computes."""


@dataclass
class SpeechCollator:
    """Decoded waveforms + transcripts -> Whisper's log-mel features and padded label ids. With
    `extract_features`, feature extraction runs here, batched, in the loader workers of every
    rank (no corpus-wide preprocessing pass); without, the batch carries the waveforms padded
    to the model's window under `AUDIO_BATCH_KEY`, for `LogMelOnDevice`."""

    processor: Any
    normalize_target: Callable[[str], str]
    max_label_length: int
    extract_features: bool = True

    def __call__(self, examples: list[dict]) -> dict:
        waveforms = [_mono_waveform(example["audio"]) for example in examples]
        if self.extract_features:
            inputs = {
                "input_features": log_mel_features(self.processor.feature_extractor, waveforms)
            }
        else:
            inputs = {
                AUDIO_BATCH_KEY: _padded(waveforms, self.processor.feature_extractor.n_samples)
            }
        tokenizer = self.processor.tokenizer
        encoded = tokenizer(
            [self.normalize_target(example["text"]) for example in examples],
            padding=True,
            truncation=True,
            max_length=self.max_label_length,
            return_tensors="pt",
        )
        labels = encoded.input_ids.masked_fill(encoded.attention_mask.ne(1), -100)
        # The model prepends the start-of-transcript token itself when it shifts labels.
        start = tokenizer.convert_tokens_to_ids("<|startoftranscript|>")
        if bool((labels[:, 0] == start).all()):
            labels = labels[:, 1:]
        return {**inputs, "labels": labels}


def log_mel_features(feature_extractor, waveforms: list[np.ndarray]):
    """Whisper's log-mel features of a batch of 16 kHz waveforms, on the CPU, in one call."""
    return feature_extractor(
        waveforms, sampling_rate=SAMPLING_RATE, return_tensors="pt"
    ).input_features


class LogMelOnDevice:
    """Log-mel features of padded waveforms (a float32 tensor), computed on `device`: the feature
    extractor's own torch path (`WhisperFeatureExtractor._torch_extract_fbank_features`; a test
    checks they agree), but tensor in, tensor out: that path takes NumPy arrays and hands its
    result back on the CPU, a copy that would make training wait for the GPU every step. The
    STFT window and mel filters are put on the device once."""

    def __init__(self, feature_extractor, device) -> None:
        import torch

        self.n_fft, self.hop_length = feature_extractor.n_fft, feature_extractor.hop_length
        self.dither = feature_extractor.dither
        self.window = torch.hann_window(self.n_fft, device=device)
        filters = torch.as_tensor(feature_extractor.mel_filters, dtype=torch.float32)
        self.mel_filters_t = filters.T.contiguous().to(device)

    def __call__(self, audio):
        import torch

        if self.dither:
            audio = audio + self.dither * torch.randn_like(audio)
        stft = torch.stft(
            audio, self.n_fft, self.hop_length, window=self.window, return_complex=True
        )
        log_spec = torch.clamp(self.mel_filters_t @ stft[..., :-1].abs() ** 2, min=1e-10).log10()
        log_spec = torch.maximum(log_spec, log_spec.amax(dim=(1, 2), keepdim=True) - 8.0)
        return (log_spec + 4.0) / 4.0


def _padded(waveforms: list[np.ndarray], length: int):
    """Zero-padded (or cut) to `length` samples, as the feature extractor pads them."""
    import torch

    batch = torch.zeros(len(waveforms), length)
    for row, waveform in zip(batch, waveforms, strict=True):
        clip = torch.from_numpy(waveform[:length])
        row[: len(clip)] = clip
    return batch


def _mono_waveform(audio) -> np.ndarray:
    samples = audio.get_all_samples()
    if samples.sample_rate != SAMPLING_RATE:
        raise ValueError(f"audio decoded at {samples.sample_rate} Hz, expected {SAMPLING_RATE}")
    return samples.data.mean(dim=0).numpy()
