"""Preprocessing cost: the seed recipe's `datasets.map` pass vs the project's collator.

The classic Whisper fine-tuning recipe decodes every clip, resamples it and computes its
log-mel features in one `ds.map(prepare_dataset, num_proc=W)` pass, on every node, before the
first training step; a small collator then pads the stored features. This project instead
decodes and resamples a clip when it is read and computes the features of a whole batch in
`SpeechCollator`, inside the data loader's workers, so training starts at once.

Both paths start from the same raw audiofolder (48 kHz MP3 clips of a few seconds, as
Common Voice ships them), both use W worker processes, and both feed a DataLoader with
batch size B. For each path we time the first batch and the whole epoch, alternating the
paths over R repeats in one process (the order flips every repeat), each run with a fresh
datasets cache, and assert that all paths produce the same batches.

A third row runs the seed recipe with one torch thread per map worker: as written, the
recipe's forked map workers inherit one torch thread per core and oversubscribe the CPU
(DataLoader workers get one thread each), so this row shows how much of the gap is that.

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
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from itertools import product
from pathlib import Path
from statistics import median
from types import SimpleNamespace

import datasets
import numpy as np
import torch
import transformers
from datasets import Audio, load_dataset
from torch.utils.data import DataLoader
from transformers import WhisperFeatureExtractor, WhisperProcessor

from trainer.tasks.speech_recognition.demo import build_whisper_tokenizer, synthesize_speech_dataset
from trainer.tasks.speech_recognition.training import SpeechCollator, filter_by_duration

# 8 x 6 x 6 x 5 = 1,440 distinct sentences of 10-14 words (3-5 s of speech), as in Common Voice.
SUBJECTS = "the old farmer|my younger sister|a tired student|the village doctor|our new neighbour|the quiet librarian|a young sailor|the city mayor"  # noqa: E501
VERBS = "carried|painted|repaired|found|sold|described"
OBJECTS = "a wooden chair|the broken window|an old green bicycle|two heavy boxes|the small red boat|a letter from home"  # noqa: E501
PLACES = "before the storm began|early on a sunday morning|near the busy harbour|at the end of the long summer|behind the railway station"  # noqa: E501


def build_corpus(root: Path, clips: int) -> Path:
    """An audiofolder of distinct spoken sentences: 48 kHz MP3s and `file_name,sentence`."""
    parts = (part.split("|") for part in (SUBJECTS, VERBS, OBJECTS, PLACES))
    combos = random.Random(0).sample(list(product(*parts)), clips)
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


def describe_corpus(root: Path, clips: int) -> str:
    megabytes = sum(mp3.stat().st_size for mp3 in root.glob("corpus/*.mp3")) / 1e6
    seconds = sum((wav.stat().st_size - 44) / 44_100 for wav in root.glob("wav/*/*.wav"))
    return f"{clips} MP3 clips at 48 kHz, mean {seconds / clips:.1f} s, {megabytes:.1f} MB"


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


@contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """Run with `count` intra-op threads (forked map workers inherit it); None: unchanged."""
    before = torch.get_num_threads()
    torch.set_num_threads(count or before)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def seed_loader(raw, processor: WhisperProcessor, args, map_threads: int | None) -> DataLoader:
    """The seed recipe: cast, a corpus-wide `map` computing features and labels, then load.

    The recipe as written leaves each map worker torch's default thread count (one per core);
    `map_threads=1` gives them one thread each, as DataLoader workers get, to tell the cost of
    that oversubscription apart from the cost of the pass itself.
    """
    feature_extractor, tokenizer = processor.feature_extractor, processor.tokenizer

    def prepare_dataset(batch):
        audio = batch["audio"]
        batch["input_features"] = feature_extractor(
            audio["array"], sampling_rate=audio["sampling_rate"]
        ).input_features[0]
        batch["labels"] = tokenizer(batch["sentence"]).input_ids
        return batch

    ds = raw.cast_column("audio", Audio(sampling_rate=16000))
    with torch_threads(map_threads):
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
    workers = SimpleNamespace(preprocessing_num_workers=args.workers)
    ds = filter_by_duration(ds, 0.0, window, workers)
    collator = SpeechCollator(
        processor=processor, normalize_target=lambda t: t.strip(), max_label_length=448
    )
    return DataLoader(ds, batch_size=args.batch_size, num_workers=args.workers, collate_fn=collator)


PATHS = {
    "seed": partial(seed_loader, map_threads=None),
    "seed, 1 thread/worker": partial(seed_loader, map_threads=1),
    "project": project_loader,
}


def run_once(path: str, corpus: Path, cache: Path, processor, args) -> dict:
    """Load the raw audiofolder (untimed, reported apart), then time raw -> batches."""
    begin = time.perf_counter()
    raw = load_dataset("audiofolder", data_dir=str(corpus), split="train", cache_dir=str(cache))
    loaded = time.perf_counter()
    first_s, first_features, summary = None, None, []  # summary: labels, per-clip means
    for batch in PATHS[path](raw, processor, args):
        # numpy, not torch, in this process: a multi-threaded torch op here would leave an
        # OpenMP pool that deadlocks the seed path's forked map workers (datasets#5094).
        features, labels = batch["input_features"].numpy(), batch["labels"].numpy()
        if first_features is None:
            first_s, first_features = time.perf_counter() - loaded, features
        assert features.shape[1:] == (80, 3000), f"{path}: features {features.shape}"
        summary.append((labels, features.mean(axis=(1, 2), dtype=np.float64)))
    epoch_s = time.perf_counter() - loaded
    return {
        "load": loaded - begin,
        "first": first_s,
        "epoch": epoch_s,
        "features": first_features,
        "summary": summary,
    }


def check_equivalent(seed: dict, project: dict) -> float:
    """Same first batch (features within 1e-4, identical labels), same labels everywhere."""
    a, b = seed["features"], project["features"]
    assert a.shape == b.shape, f"first batch: {a.shape} vs {b.shape}"
    max_diff = float(np.abs(a - b).max())
    assert max_diff <= 1e-4, f"first-batch features differ by {max_diff}"
    pairs = zip(seed["summary"], project["summary"], strict=True)  # same batch count
    for (labels_a, means_a), (labels_b, means_b) in pairs:
        assert np.array_equal(labels_a, labels_b), "labels differ"
        assert np.allclose(means_a, means_b, rtol=0, atol=1e-5), "per-clip feature means differ"
    return max_diff


def run_alternating(corpus: Path, tmp: Path, processor, args) -> tuple[dict, float]:
    """Every path once per repeat, the order flipping each repeat; check outputs agree."""
    results: dict[str, list[dict]] = {path: [] for path in PATHS}
    max_diff = 0.0
    for repeat in range(args.repeats):
        order = list(PATHS) if repeat % 2 == 0 else list(PATHS)[::-1]
        for index, path in enumerate(order):
            cache = tmp / f"cache-{repeat}-{index}"  # fresh: nothing is reused
            run = run_once(path, corpus, cache, processor, args)
            results[path].append(run)
            shutil.rmtree(cache)
            print(
                f"repeat {repeat} {path:>21}: first batch {run['first']:.2f} s, "
                f"epoch {run['epoch']:.2f} s",
                flush=True,
            )
        for path in list(PATHS)[:-1]:  # each seed variant against the project
            max_diff = max(max_diff, check_equivalent(results[path][-1], results["project"][-1]))
    return results, max_diff


def spread(values: list[float]) -> str:
    return f"{median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


def report(results: dict[str, list[dict]], args, max_diff: float, corpus_info: str) -> None:
    print(f"\ncommand: {shlex.join(['python', *sys.argv])}")
    print(f"date: {datetime.now().astimezone().isoformat(timespec='seconds')}")
    cpu = platform.processor() or platform.machine()
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"machine: {cpu}, {os.cpu_count()} CPUs, load average now {load} (1, 5, 15 min)")
    print(
        f"versions: torch {torch.__version__}, transformers {transformers.__version__}, "
        f"datasets {datasets.__version__}"
    )
    print(
        f"corpus: {corpus_info}; batch {args.batch_size}, workers {args.workers}, "
        f"repeats {args.repeats}"
    )
    loads = [run["load"] for runs in results.values() for run in runs]
    print(f"load_dataset (every path, not in the times below): {spread(loads)}")
    print(f"equivalence: max |feature diff| in first batches {max_diff:.1e}, labels identical\n")
    print("| path | time to first batch | full epoch | clips/s (epoch) |")
    print("|---|---|---|---|")
    medians = {
        path: {key: median(run[key] for run in runs) for key in ("first", "epoch")}
        for path, runs in results.items()
    }
    for path, runs in results.items():
        firsts, epochs = [run["first"] for run in runs], [run["epoch"] for run in runs]
        rate = args.clips / medians[path]["epoch"]
        print(f"| {path} | {spread(firsts)} | {spread(epochs)} | {rate:.1f} |")
    project = medians["project"]
    for path in (path for path in results if path != "project"):
        first, epoch = (medians[path][key] / project[key] for key in ("first", "epoch"))
        print(f"| ratio {path} / project | {first:.1f}x | {epoch:.1f}x | |")
    print("\nmedian over repeats (min-max); ratios of the medians")


def corpus_loader_parser(description: str) -> argparse.ArgumentParser:
    """The flags of the loader benchmarks over one synthetic corpus (this one and
    bench/streaming.py): corpus size, batch size, loader workers, repeats."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--clips", type=int, default=240)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    return parser


def main() -> None:
    args = corpus_loader_parser(__doc__.splitlines()[0]).parse_args()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    transformers.logging.set_verbosity_error()

    with tempfile.TemporaryDirectory(prefix="bench-preprocessing-") as tmp:
        started = time.perf_counter()
        corpus = build_corpus(Path(tmp), args.clips)
        corpus_info = describe_corpus(Path(tmp), args.clips)
        print(f"built corpus in {time.perf_counter() - started:.0f} s: {corpus_info}")
        processor = build_processor()

        results, max_diff = run_alternating(corpus, Path(tmp), processor, args)
        print(f"total {time.perf_counter() - started:.0f} s")
    report(results, args, max_diff, corpus_info)


if __name__ == "__main__":
    main()
