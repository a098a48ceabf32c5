"""Preprocessing cost: the seed recipe's `datasets.map` pass vs the project's collator.

The classic Whisper fine-tuning recipe decodes every clip, resamples it and computes its
log-mel features in one `ds.map(prepare_dataset, num_proc=W)` pass, on every node, before the
first training step; a small collator then pads the stored features. This project instead
decodes and resamples a clip when it is read and computes the features of a whole batch in
`SpeechCollator`, inside the data loader's workers, so training starts at once.

Both paths start from the same raw audiofolder (48 kHz MP3 clips of a few seconds, as
Common Voice ships them), both use W worker processes, and both feed a DataLoader with
batch size B. For each path we time the first batch and the whole epoch, alternating the two
paths over R repeats in one process (the order flips every repeat), each run with a fresh
datasets cache, and check that both produce the same batches.

    python bench/preprocessing.py [--clips N] [--batch-size B] [--workers W] [--repeats R]
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from itertools import product
from pathlib import Path
from statistics import median
from types import SimpleNamespace

import datasets
import torch
import transformers
from datasets import Audio, load_dataset
from torch.utils.data import DataLoader
from transformers import WhisperFeatureExtractor, WhisperProcessor

from trainer.demo_assets import build_whisper_tokenizer, synthesize_speech_dataset
from trainer.tasks.speech import SpeechCollator, _filter_by_duration

SUBJECTS = (
    "the old farmer",
    "my younger sister",
    "a tired student",
    "the village doctor",
    "our new neighbour",
    "the quiet librarian",
    "a young sailor",
    "the city mayor",
)
VERBS = ("carried", "painted", "repaired", "found", "sold", "described")
OBJECTS = (
    "a wooden chair",
    "the broken window",
    "an old green bicycle",
    "two heavy boxes",
    "the small red boat",
    "a letter from home",
)
PLACES = (
    "before the storm began",
    "early on a sunday morning",
    "near the busy harbour",
    "at the end of the long summer",
    "behind the railway station",
)


def build_corpus(root: Path, clips: int) -> Path:
    """An audiofolder of distinct spoken sentences: 48 kHz MP3s and `file_name,sentence`."""
    combos = random.Random(0).sample(list(product(SUBJECTS, VERBS, OBJECTS, PLACES)), clips)
    sentences = [" ".join(words).capitalize() + "." for words in combos]
    synthesize_speech_dataset(root / "wav", {"train": sentences})  # espeak-ng, 22,050 Hz WAVs
    corpus = root / "corpus"
    corpus.mkdir()
    names = [f"{index:04d}.mp3" for index in range(clips)]

    def to_mp3(index: int) -> None:
        wav = root / "wav" / "train" / f"{index:04d}.wav"
        command = ["ffmpeg", "-loglevel", "error", "-i", str(wav), "-ar", "48000", "-b:a", "64k"]
        subprocess.run([*command, str(corpus / names[index])], check=True)

    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(to_mp3, range(clips)))
    with (corpus / "metadata.csv").open("w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows(
            [("file_name", "sentence"), *zip(names, sentences, strict=True)]
        )
    return corpus


def build_processor() -> WhisperProcessor:
    """whisper-small's processor: 80 mel bins over a 30 s window (3000 frames)."""
    tokenizer = build_whisper_tokenizer()
    tokenizer.set_prefix_tokens(language="english", task="transcribe")
    return WhisperProcessor(WhisperFeatureExtractor(), tokenizer)


@dataclass
class SeedCollator:
    """The recipe's DataCollatorSpeechSeq2SeqWithPadding: pads features already computed."""

    processor: WhisperProcessor
    decoder_start_token_id: int

    def __call__(self, features: list[dict]) -> dict:
        inputs = [{"input_features": feature["input_features"]} for feature in features]
        batch = self.processor.feature_extractor.pad(inputs, return_tensors="pt")
        labels_batch = self.processor.tokenizer.pad(
            [{"input_ids": feature["labels"]} for feature in features], return_tensors="pt"
        )
        labels = labels_batch["input_ids"].masked_fill(labels_batch.attention_mask.ne(1), -100)
        if (labels[:, 0] == self.decoder_start_token_id).all().cpu().item():
            labels = labels[:, 1:]
        batch["labels"] = labels
        return batch


def seed_loader(raw, processor: WhisperProcessor, args) -> DataLoader:
    """The seed recipe: cast, a corpus-wide `map` computing features and labels, then load."""
    feature_extractor, tokenizer = processor.feature_extractor, processor.tokenizer

    def prepare_dataset(batch):
        audio = batch["audio"]
        batch["input_features"] = feature_extractor(
            audio["array"], sampling_rate=audio["sampling_rate"]
        ).input_features[0]
        batch["labels"] = tokenizer(batch["sentence"]).input_ids
        return batch

    ds = raw.cast_column("audio", Audio(sampling_rate=16000))
    ds = ds.map(
        prepare_dataset,
        remove_columns=ds.column_names,
        num_proc=args.workers,
        load_from_cache_file=False,
    )
    start = tokenizer.convert_tokens_to_ids("<|startoftranscript|>")
    collator = SeedCollator(processor, decoder_start_token_id=start)
    return DataLoader(ds, batch_size=args.batch_size, num_workers=args.workers, collate_fn=collator)


def project_loader(raw, processor: WhisperProcessor, args) -> DataLoader:
    """The project: `_load_split`'s column selection and cast, the duration filter that
    `load_datasets` applies (reads file headers only), then `SpeechCollator` in the loader."""
    ds = raw.select_columns(["audio", "sentence"]).rename_columns({"sentence": "text"})
    ds = ds.cast_column("audio", Audio(sampling_rate=16000))
    window = processor.feature_extractor.chunk_length
    ds = _filter_by_duration(
        ds, 0.0, window, SimpleNamespace(preprocessing_num_workers=args.workers)
    )
    collator = SpeechCollator(
        processor=processor, normalize_target=lambda t: t.strip(), max_label_length=448
    )
    return DataLoader(ds, batch_size=args.batch_size, num_workers=args.workers, collate_fn=collator)


PATHS = {"seed": seed_loader, "project": project_loader}


def run_once(path: str, corpus: Path, cache: Path, processor, args) -> dict:
    """Load the raw audiofolder (untimed, reported apart), then time raw -> batches."""
    begin = time.perf_counter()
    raw = load_dataset("audiofolder", data_dir=str(corpus), split="train", cache_dir=str(cache))
    loaded = time.perf_counter()
    first_s, first_batch, fingerprint = None, None, []
    for batch in PATHS[path](raw, processor, args):
        if first_batch is None:
            first_s, first_batch = time.perf_counter() - loaded, batch
        features = batch["input_features"]
        assert features.shape[1:] == (80, 3000), f"{path}: features {tuple(features.shape)}"
        fingerprint.append((batch["labels"], features.double().mean(dim=(1, 2))))
    epoch_s = time.perf_counter() - loaded
    return {
        "load": loaded - begin,
        "first": first_s,
        "epoch": epoch_s,
        "batch": first_batch,
        "fingerprint": fingerprint,
    }


def check_equivalent(seed: dict, project: dict) -> float:
    """Same first batch (features within 1e-4, identical labels), same labels everywhere."""
    a, b = seed["batch"], project["batch"]
    assert a["input_features"].shape == b["input_features"].shape
    max_diff = (a["input_features"] - b["input_features"]).abs().max().item()
    assert max_diff <= 1e-4, f"first-batch features differ by {max_diff}"
    pairs = zip(seed["fingerprint"], project["fingerprint"], strict=True)  # same batch count
    for (labels_a, means_a), (labels_b, means_b) in pairs:
        assert torch.equal(labels_a, labels_b), "labels differ"
        assert torch.allclose(means_a, means_b, atol=1e-5), "per-clip feature means differ"
    return max_diff


def spread(values: list[float]) -> str:
    return f"{median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


def report(results: dict[str, list[dict]], args, max_diff: float, corpus_info: str) -> None:
    print(f"\ncommand: {shlex.join(['python', *sys.argv])}")
    print(f"date: {datetime.now().astimezone().isoformat(timespec='seconds')}")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs")
    print(
        f"versions: torch {torch.__version__}, transformers {transformers.__version__}, "
        f"datasets {datasets.__version__}"
    )
    print(
        f"corpus: {corpus_info}; batch {args.batch_size}, workers {args.workers}, "
        f"repeats {args.repeats}"
    )
    loads = [run["load"] for runs in results.values() for run in runs]
    print(f"load_dataset (both paths, not in the times below): {spread(loads)}")
    print(f"equivalence: first-batch max |feature diff| {max_diff:.2e}, labels identical\n")
    print("| path | time to first batch | full epoch | clips/s (epoch) |")
    print("|---|---|---|---|")
    for path, runs in results.items():
        rate = args.clips / median(run["epoch"] for run in runs)
        firsts, epochs = [r["first"] for r in runs], [r["epoch"] for r in runs]
        print(f"| {path} | {spread(firsts)} | {spread(epochs)} | {rate:.1f} |")
    ratio = {
        key: median(r[key] for r in results["seed"]) / median(r[key] for r in results["project"])
        for key in ("first", "epoch")
    }
    print(f"| seed / project | {ratio['first']:.1f}x | {ratio['epoch']:.2f}x | |")
    print("\nmedian over repeats, (min-max) in brackets")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clips", type=int, default=240)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    transformers.logging.set_verbosity_error()

    with tempfile.TemporaryDirectory(prefix="bench-preprocessing-") as tmp:
        started = time.perf_counter()
        corpus = build_corpus(Path(tmp), args.clips)
        megabytes = sum(f.stat().st_size for f in corpus.glob("*.mp3")) / 1e6
        corpus_info = f"{args.clips} MP3 clips at 48 kHz, {megabytes:.1f} MB"
        print(f"built corpus in {time.perf_counter() - started:.0f} s: {corpus_info}")
        processor = build_processor()

        results: dict[str, list[dict]] = {"seed": [], "project": []}
        for repeat in range(args.repeats):
            order = list(PATHS) if repeat % 2 == 0 else list(PATHS)[::-1]
            for path in order:
                cache = Path(tmp) / f"cache-{repeat}-{path}"  # fresh: nothing is reused
                run = run_once(path, corpus, cache, processor, args)
                results[path].append(run)
                shutil.rmtree(cache)
                print(
                    f"repeat {repeat} {path:>7}: first batch {run['first']:.2f} s, "
                    f"epoch {run['epoch']:.2f} s",
                    flush=True,
                )
            max_diff = check_equivalent(results["seed"][-1], results["project"][-1])
        print(f"total {time.perf_counter() - started:.0f} s")
    report(results, args, max_diff, corpus_info)


if __name__ == "__main__":
    main()
