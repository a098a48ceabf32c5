"""Offline test assets: tiny random ViT and BERT and data they learn, and a small speech set
in the demo's layout that needs no speech synthesizer.

Like the speech demo's assets, everything is built locally so that the tasks run end to
end (tests, smoke tests in an image) without a model hub or network: the models are
randomly initialised from small configs with a fixed seed, BERT's WordPiece tokenizer is
trained on the text set itself, and the data is synthesized.

- Images: coloured squares whose class is their dominant colour, with a distractor shape,
  noise and varying brightness; a few stored as JPEG or palette PNG, so decoding and RGB
  conversion are exercised. A ViT of ~30 k parameters learns them in a few dozen steps.
- Texts: short financial-news-style sentences whose class is their sentiment.
- Speech (`write_tone_speech`): the demo's three-word sentences as an `audiofolder` at
  22,050 Hz, each word a tone burst of its own pitch: the demo set's layout, columns,
  sample rate and clip lengths, written in milliseconds by numpy, with no espeak-ng. For
  tests that need audio files and transcripts, not a model that learns English speech.
"""

from __future__ import annotations

import csv
import random
import wave
import zlib
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw
from tokenizers import BertWordPieceTokenizer
from transformers import (
    BertConfig,
    BertModel,
    BertTokenizer,
    ViTConfig,
    ViTImageProcessorPil,
    ViTModel,
)

from tests.support.helpers import few_clips

COLOURS = {"red": (200, 40, 40), "green": (40, 170, 60), "blue": (40, 60, 200)}
"""Class name -> base colour of the synthetic images."""
IMAGE_SPLITS = {"train": 40, "test": 12}
"""Images per class in each split."""

SENTIMENT_WORDS = {
    "positive": ["rose", "grew strongly", "beat expectations", "reached a record high", "jumped"],
    "negative": ["fell", "dropped sharply", "missed expectations", "hit a record low", "slumped"],
    "neutral": ["was unchanged", "was reported", "was announced", "remained stable", "was filed"],
}
SUBJECTS = ["Operating profit", "Net sales", "The share price", "Quarterly revenue", "Demand"]
PERIODS = ["in the first quarter", "last year", "in 2024", "this month", "in the period"]
TEXT_SPLITS = {"train": 20, "test": 6}
"""Sentences per class in each split."""
IMAGE_SIZE = 32
"""The ViT's input size."""
PICTURE_SIZE = 40
"""The synthetic images' size: larger than the input, so the processor has to resize."""
SEED = 0


def build_tiny_vit(model_dir: Path) -> None:
    """Save a random ViT without a classification head, like the in21k checkpoint the seed
    recipe starts from, plus its image processor."""
    config = ViTConfig(
        image_size=IMAGE_SIZE,
        patch_size=8,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
    )
    with torch.random.fork_rng():
        torch.manual_seed(SEED)
        model = ViTModel(config, add_pooling_layer=False)
    model.save_pretrained(model_dir)
    # The PIL backend works without torchvision; it saves as a plain ViTImageProcessor.
    processor = ViTImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    processor.save_pretrained(model_dir)


def build_tiny_bert(model_dir: Path, texts: list[str]) -> None:
    """Save a random BERT encoder and a WordPiece tokenizer trained on `texts`."""
    wordpiece = BertWordPieceTokenizer(lowercase=True)
    wordpiece.train_from_iterator(texts, vocab_size=400, min_frequency=1, show_progress=False)
    tokenizer = BertTokenizer(vocab=wordpiece.get_vocab(), do_lower_case=True, model_max_length=128)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(SEED)
        model = BertModel(config)
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)


def write_colour_images(dataset_dir: Path) -> None:
    """An imagefolder: `<split>/<colour>/NNNN.png` (some `.jpg`), 40 x 40 pixels."""
    rng = np.random.default_rng(SEED)
    for split, count in IMAGE_SPLITS.items():
        for name, colour in COLOURS.items():
            folder = dataset_dir / split / name
            folder.mkdir(parents=True)
            for index in range(count):
                image = _colour_image(np.array(colour), rng)
                if index % 5 == 1:
                    image.save(folder / f"{index:04d}.jpg", quality=90)
                elif index % 5 == 2:
                    image.quantize(64).save(folder / f"{index:04d}.png")  # palette mode
                else:
                    image.save(folder / f"{index:04d}.png")


def _colour_image(colour: np.ndarray, rng: np.random.Generator) -> Image.Image:
    size = PICTURE_SIZE
    shade = colour * rng.uniform(0.6, 1.2) + rng.normal(0, 12, (size, size, 3))
    image = Image.fromarray(np.clip(shade, 0, 255).astype(np.uint8))
    left, top = rng.integers(0, size // 2, 2)
    extent = rng.integers(6, size // 2, 2)
    box = (int(left), int(top), int(left + extent[0]), int(top + extent[1]))
    distractor = tuple(int(v) for v in rng.integers(0, 256, 3))
    draw = ImageDraw.Draw(image)
    (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=distractor)
    return image


def sentiment_sentences() -> dict[str, list[tuple[str, str]]]:
    """Split -> (sentence, sentiment) pairs, shuffled; no sentence is in two splits."""
    rng = random.Random(SEED)
    pools = {
        label: rng.sample(
            [f"{s} {w} {p} ." for s in SUBJECTS for w in words for p in PERIODS],
            sum(TEXT_SPLITS.values()),
        )
        for label, words in SENTIMENT_WORDS.items()
    }
    splits, start = {}, 0
    for split, count in TEXT_SPLITS.items():
        rows = [
            (text, label) for label, pool in pools.items() for text in pool[start : start + count]
        ]
        rng.shuffle(rows)
        splits[split] = rows
        start += count
    return splits


def write_sentiment_csv(dataset_dir: Path) -> None:
    """`train.csv` and `test.csv` with `sentence` and `sentiment` (string) columns, as in
    the financial phrasebank."""
    dataset_dir.mkdir(parents=True, exist_ok=True)
    for split, rows in sentiment_sentences().items():
        with (dataset_dir / f"{split}.csv").open("w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(["sentence", "sentiment"])
            writer.writerows(rows)


def write_paraphrase_csv(
    dataset_dir: Path, splits: tuple[str, ...] = ("train", "validation")
) -> None:
    """GLUE MRPC's shape: `sentence1`, `sentence2`, `label` (1: the two say the same, here:
    the same sentiment; 0: they do not), one CSV per split, made from the sentiment set."""
    dataset_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(SEED)
    for split, rows in zip(splits, sentiment_sentences().values(), strict=False):
        pairs = [
            (a, b, int(la == lb))
            for (a, la), (b, lb) in zip(rows, rng.sample(rows, len(rows)), strict=True)
        ]
        with (dataset_dir / f"{split}.csv").open("w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(["sentence1", "sentence2", "label"])
            writer.writerows(pairs)


TONE_CLIPS = {"train": 48, "test": 24}
"""Clips per split of `write_tone_speech`'s default set."""
TONE_SAMPLE_RATE = 22_050
"""espeak-ng's rate, as in the demo set: the training pipeline must resample to 16 kHz."""


def write_tone_speech(
    dataset_dir: Path, sentences_per_split: dict[str, list[str]] | None = None
) -> None:
    """An `audiofolder` like the demo's speech set: `<split>/NNNN.wav` (16-bit mono,
    22,050 Hz) and `<split>/metadata.csv` with `file_name,transcription`.

    Each word is a tone of its own pitch (0.2-0.6 s, with a little noise), between short
    pauses: a three-word clip lasts about 0.9 to 2.3 s, as the demo's spoken ones do.
    Without `sentences_per_split`, TONE_CLIPS clips of the demo's sentences (seeded)."""
    from trainer.tasks.speech_recognition.demo import DEMO_SENTENCES

    rng = np.random.default_rng(SEED)
    if sentences_per_split is None:
        sentences = list(DEMO_SENTENCES)
        sentences_per_split = {
            split: [sentences[i] for i in rng.choice(len(sentences), count)]
            for split, count in TONE_CLIPS.items()
        }
    for split, texts in sentences_per_split.items():
        folder = dataset_dir / split
        folder.mkdir(parents=True)
        rows = []
        for index, text in enumerate(texts):
            name = f"{index:04d}.wav"
            _write_wav(folder / name, _tone_words(text, rng))
            rows.append((name, text))
        with (folder / "metadata.csv").open("w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(["file_name", "transcription"])
            writer.writerows(rows)


def _tone_words(text: str, rng: np.random.Generator) -> np.ndarray:
    rate = TONE_SAMPLE_RATE
    pieces = [np.zeros(int(rate * rng.uniform(0.05, 0.15)))]
    for word in text.split():
        pitch = 150 + zlib.crc32(word.lower().encode()) % 1500
        seconds = rng.uniform(0.2, 0.6)
        t = np.arange(int(rate * seconds)) / rate
        envelope = np.minimum(1, np.minimum(t, seconds - t) / 0.02)  # no clicks
        pieces.append(0.4 * envelope * np.sin(2 * np.pi * pitch * t))
        pieces.append(np.zeros(int(rate * rng.uniform(0.05, 0.15))))
    samples = np.concatenate(pieces)
    return samples + rng.normal(0, 0.01, samples.shape)


def _write_wav(path: Path, samples: np.ndarray) -> None:
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(TONE_SAMPLE_RATE)
        out.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())


BAD_CLIPS = ("garbage.wav", "empty.wav", "missing.wav")


def tone_speech_with_bad_clips(demo_assets, target) -> str:
    """A copy of the tone set (hard links) whose training metadata also lists a garbage
    clip, an empty one and one that does not exist: what a real corpus may carry."""
    few_clips(demo_assets, target, per_split=TONE_CLIPS["train"])
    folder = target / "train"
    (folder / "garbage.wav").write_bytes(b"RIFF, but no audio " * 40)
    (folder / "empty.wav").write_bytes(b"")
    with (folder / "metadata.csv").open("a") as handle:
        handle.writelines(f"{name},red cats\n" for name in BAD_CLIPS)  # missing.wav: no file
    return str(target)
