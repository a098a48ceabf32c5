"""Streaming from Cloud Storage vs a local copy: does `--streaming` cost loader throughput?

The same speech corpus (distinct spoken sentences, 48 kHz MP3 as Common Voice ships them,
built as in bench/preprocessing.py) is read by the training loader four ways, with the
project's own code end to end: the speech task's `_load_split` and duration filter, the
`SpeechCollator` (decode, resample to 16 kHz, log-mel features: all in the loader's
workers), W workers, batch size B.

- **local copy**: `--dataset_name gs://.../corpus` without `--streaming`: the audiofolder is
  copied from the bucket into the node's cache (`fetch_directory`, timed: every node pays
  it on every fresh start), prepared by `datasets` as Arrow, then read from local disk.
- **stream, GCS**: `--streaming true` from the same corpus as Parquet shards
  (`python -m trainer.shards`) in the bucket: shuffled, split for rank 0 of 1, row groups
  fetched by ranged reads through trainer/storage/store.py.
- **stream, GCS tars**: the same, from WebDataset tar shards (`--format webdataset`), each
  read front to back as one stream.
- **stream, local shards**: the Parquet shards on local disk (what the stream costs
  without the network).

The bucket is the GCS emulator (pure Python, on this machine): its throughput is not
Cloud Storage's, so the figures say what streaming costs in CPU and protocol overhead, not
what a real bucket delivers (docs/storage.md puts that on paper). The paths alternate over
R repeats in one process, each with fresh caches; the script checks that every path yields
every clip once. Bytes written to local disk are counted under the fresh caches. The local
copy's first batch and epoch include the copy (what a node pays on every fresh start); the
rate after the first batch leaves it and every path's start-up out.

    python bench/streaming.py [--clips N] [--batch-size B] [--workers W] [--repeats R]
"""

from __future__ import annotations

import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench.preprocessing import (  # noqa: E402
    build_corpus,
    build_processor,
    corpus_loader_parser,
    describe_corpus,
)
from tests.support.gcs_emulator import BUCKET, running_emulator  # noqa: E402

PATHS = ("local copy", "stream, GCS", "stream, GCS tars", "stream, local shards")


def task_for(dataset: str, streaming: bool):
    from trainer.command_line.parser import parse_flags

    extra = ["--streaming", "--max_steps", "1"] if streaming else []
    return parse_flags(
        ["--dataset_name", dataset, "--text_column_name", "sentence", *extra]
    ).build_task()


def loader(path: str, sources: dict[str, str], processor, args):
    """The training loader of one path (the model is not needed to read data)."""
    from torch.utils.data import DataLoader

    from trainer.data.streams import POSITION, prepare_stream
    from trainer.tasks.speech_recognition.training import SpeechCollator, filter_by_duration

    streaming = path.startswith("stream")
    task = task_for(sources[path], streaming)
    dataset = task._load_split("train", None, streaming=streaming)
    dataset = filter_by_duration(dataset, 0.0, 30.0, task.data_args)
    collate = SpeechCollator(processor, lambda text: text.strip(), 448)
    if streaming:
        dataset = prepare_stream(dataset, seed=1, buffer_size=64, start=None)

        def strip_positions(examples: list[dict]) -> dict:
            return collate([{k: v for k, v in ex.items() if k != POSITION} for ex in examples])

        return DataLoader(dataset, batch_size=args.batch_size, num_workers=args.workers,
                          collate_fn=strip_positions)  # fmt: skip
    return DataLoader(dataset, batch_size=args.batch_size, num_workers=args.workers,
                      collate_fn=collate, shuffle=True)  # fmt: skip


def disk_bytes(root: Path) -> int:
    return sum(path.stat().st_size for path in root.rglob("*") if path.is_file())


def run_once(path: str, sources: dict[str, str], processor, args, scratch: Path) -> dict:
    import datasets

    os.environ["TRAINER_CACHE_DIR"] = str(scratch / "trainer-cache")
    datasets.config.HF_DATASETS_CACHE = scratch / "hf-datasets"
    begin = time.perf_counter()
    first, samples = None, 0
    for batch in loader(path, sources, processor, args):
        features = batch["input_features"].numpy()  # numpy here: see bench/preprocessing.py
        assert features.shape[1:] == (80, 3000), features.shape
        first = first or time.perf_counter() - begin
        samples += features.shape[0]
    seconds = time.perf_counter() - begin
    return {"first": first, "seconds": seconds, "samples": samples, "disk": disk_bytes(scratch)}


def main() -> None:
    parser = corpus_loader_parser(__doc__.splitlines()[0])
    parser.add_argument("--shard-size-mb", type=float, default=1.0)
    args = parser.parse_args()

    from trainer.common.quiet import silence_known_noise

    silence_known_noise()
    with tempfile.TemporaryDirectory(prefix="bench-streaming-") as tmp, running_emulator() as url:
        os.environ["STORAGE_EMULATOR_HOST"] = url
        from trainer.command_line.parser import parse_flags
        from trainer.shards import write_shards
        from trainer.storage.store import open_store

        tmp = Path(tmp)
        corpus = build_corpus(tmp, args.clips)
        bucket = f"gs://{BUCKET}/bench"
        open_store(f"{bucket}/corpus").upload(corpus)
        task = parse_flags(
            ["--dataset_name", str(corpus), "--text_column_name", "sentence"]
        ).build_task()
        index = write_shards("speech-recognition", task, str(corpus),
                             open_store(f"{bucket}/shards"), args.shard_size_mb)  # fmt: skip
        write_shards("speech-recognition", task, str(corpus), open_store(str(tmp / "shards")),
                     args.shard_size_mb)  # fmt: skip
        write_shards("speech-recognition", task, str(corpus), open_store(f"{bucket}/tars"),
                     args.shard_size_mb, "webdataset")  # fmt: skip
        sources = {"local copy": f"{bucket}/corpus", "stream, GCS": f"{bucket}/shards",
                   "stream, GCS tars": f"{bucket}/tars",
                   "stream, local shards": str(tmp / "shards")}  # fmt: skip
        processor = build_processor()
        results: dict[str, list[dict]] = {path: [] for path in PATHS}
        for repeat in range(args.repeats):
            order = PATHS if repeat % 2 == 0 else tuple(reversed(PATHS))
            for path in order:
                scratch = tmp / f"scratch-{repeat}-{PATHS.index(path)}"
                result = run_once(path, sources, processor, args, scratch)
                assert result["samples"] == index.rows("train"), (path, result["samples"])
                results[path].append(result)
        shards = index.splits["train"]
        corpus_info = describe_corpus(tmp, args.clips)
    report(results, args, corpus_info, len(shards), sum(s.bytes for s in shards))


def report(results, args, corpus_info: str, shards: int, shard_bytes: int) -> None:
    import datasets
    import torch

    def med(path: str, key: str) -> float:
        return median(result[key] for result in results[path])

    rate = {path: med(path, "samples") / med(path, "seconds") for path in PATHS}
    after_first = {
        path: (med(path, "samples") - args.batch_size) / (med(path, "seconds") - med(path, "first"))
        for path in PATHS
    }
    print(f"\n{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"datasets {datasets.__version__}; {corpus_info}; {shards} shards, "
          f"{shard_bytes / 1e6:.1f} MB; batch {args.batch_size}, {args.workers} workers, "
          f"{args.repeats} repeats (medians)\n")  # fmt: skip
    print(
        "| path | first batch (s) | epoch (s) | samples/s | vs local copy "
        "| samples/s after the first batch | vs local copy | disk written (MB) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for path in PATHS:
        print(f"| {path} | {med(path, 'first'):.2f} | {med(path, 'seconds'):.2f} | "
              f"{rate[path]:.1f} | {rate[path] / rate['local copy']:.2f}x | "
              f"{after_first[path]:.1f} | {after_first[path] / after_first['local copy']:.2f}x | "
              f"{med(path, 'disk') / 1e6:.1f} |")  # fmt: skip


if __name__ == "__main__":
    main()
