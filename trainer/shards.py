"""`python -m trainer.shards SRC DEST --task TASK`: a local dataset as Parquet (or WebDataset tar)
shards plus an index, for training with `--streaming true` from Cloud Storage.

A corpus bigger than a node's disk can be read as a stream if it is stored as a few hundred
files of a few hundred MB (the unit processes divide, shuffle and resume in), not millions of
clips. The shards are Parquet files with the media bytes embedded, written as `datasets`'
`push_to_hub` writes them (same size estimate and embedding), so `load_dataset("parquet", ...)`
and the Hub's viewer read them too; or, with `--format webdataset`, WebDataset tars
(trainer/data/tar_shards.py). `index.json`, written last, lists each split's shards with their
row counts, the features and, for classification, the label values: the trainer sizes epochs
and checks columns and labels from it at launch, without opening a shard. A DEST without it is
not a shard set (an interrupted run leaves none).

SRC is any local layout the task reads (audiofolder, Common Voice directory, imagefolder, a
directory of CSV/TSV/JSONL files), or a gs:// copy of one; DEST a local directory, gs:// URI or
/gcs/ path. Each shard is written to a temporary file, uploaded through
trainer/storage/store.py (verified by CRC32C) and deleted: local disk for one shard beyond the
source. `python -m trainer.shards LOCATION --index_only` writes only the index, for WebDataset
tars made elsewhere that already lie there.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from trainer.command_line.parser import parse_flags
from trainer.common.errors import UserError
from trainer.common.quiet import silence_known_noise
from trainer.data.checks import check_columns
from trainer.data.shard_index import INDEX, KEY_COLUMN, Shard, ShardIndex
from trainer.data.sources import check_metadata_files, local_directory
from trainer.data.tar_shards import index_in_place, write_tar
from trainer.storage.store import open_store

if TYPE_CHECKING:
    from datasets import Dataset

    from trainer.storage.store import Store
    from trainer.tasks.base import Task

DEFAULT_SHARD_SIZE_MB = 256


def write_shards(
    task_name: str,
    task: Task,
    source: str,
    store: Store,
    shard_size_mb: float,
    shard_format: str = "parquet",
) -> ShardIndex:
    """Every split of the local dataset `source` as shards of `shard_format` (FORMATS) in `store`;
    the index last."""
    directory = local_directory(source)
    layout = task.detect_local_layout(directory)
    check_metadata_files(layout)  # as the launcher does: a bad byte named, with its file
    splits: dict[str, list[Shard]] = {}
    features = None
    labels = None
    for split in sorted(layout.splits):
        dataset = task.load_source(split)
        if len(dataset) == 0:
            raise UserError(f"Split {split} of {source} holds no examples.")
        check_columns(dataset.column_names, task.column_flags(), f"{source} split {split}")
        if features is None:
            features = dataset.features
        labels = task.source_label_values(dataset) if split == "train" else labels
        splits[split] = _write_split(dataset, split, store, shard_size_mb * 1e6, shard_format)
    assert features is not None  # a layout has at least one split
    features = features.copy()
    features[KEY_COLUMN] = _key_feature()
    index = ShardIndex(task_name, features.to_dict(), splits, labels)
    store.write_text(INDEX, index.to_json())
    return index


def _key_feature():
    from datasets import Value

    return Value("string")


def _write_split(
    dataset: Dataset, split: str, store: Store, shard_bytes: float, shard_format: str
) -> list[Shard]:
    # push_to_hub's own estimate: table bytes, plus the sizes of media files it will embed
    count = max(1, math.ceil(dataset._estimate_nbytes() / shard_bytes))
    count = min(count, len(dataset))
    write, suffix = FORMATS[shard_format]
    shards = []
    offset = 0
    with tempfile.TemporaryDirectory(prefix="shards-") as staging:
        for index in range(count):
            part = dataset.shard(num_shards=count, index=index, contiguous=True)
            part = part.map(
                partial(_keys, f"{split}/", offset),
                with_indices=True,
                batched=True,
                keep_in_memory=True,
            )
            name = f"{split}-{index:05d}-of-{count:05d}{suffix}"
            local = Path(staging) / name
            write(part, local)
            (entry,) = store.upload(Path(staging), [name])
            shards.append(Shard(name, len(part), entry.size, entry.crc32c))
            local.unlink()
            offset += len(part)
    return shards


def write_parquet(part: Dataset, path: Path) -> None:
    from datasets.table import embed_table_storage

    part = part.with_format("arrow").map(embed_table_storage, batched=True, keep_in_memory=True)
    part.with_format(None).to_parquet(str(path))


FORMATS = {"parquet": (write_parquet, ".parquet"), "webdataset": (write_tar, ".tar")}
"""--format -> (writer of one shard file, its suffix)."""


def _keys(prefix: str, offset: int, batch: dict, rows: list[int]) -> dict[str, list[str]]:
    return {KEY_COLUMN: [f"{prefix}{offset + row}" for row in rows]}


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.shards",
        description="Write a local dataset (audiofolder, Common Voice dir, imagefolder, "
        "CSV/TSV/JSONL dir) as Parquet or WebDataset shards plus index.json, locally or in "
        "Cloud Storage, for --streaming true; or, with --index_only, index WebDataset tars "
        "that are already there. Other flags are the task's column flags "
        "(--text_column_name, --label_column_name, ...), checked against the data.",
    )
    parser.add_argument(
        "source",
        help="Local dataset directory (or gs:// copy of one); with --index_only, the "
        "directory, gs:// or /gcs/ location holding the tars.",
    )
    parser.add_argument(
        "destination",
        nargs="?",
        help="Directory, gs://BUCKET/PATH or /gcs/BUCKET/PATH (none with --index_only).",
    )
    parser.add_argument("--task", required=True, help="The training task the data is for.")
    parser.add_argument(
        "--shard_size_mb",
        type=float,
        default=DEFAULT_SHARD_SIZE_MB,
        help=f"Target size of one shard (default {DEFAULT_SHARD_SIZE_MB}).",
    )
    parser.add_argument(
        "--format",
        choices=sorted(FORMATS),
        default="parquet",
        help="parquet (default): SPLIT-0000i-of-0000n.parquet with typed columns, read a row "
        'group at a time, also loadable with load_dataset("parquet"). webdataset: '
        "SPLIT-0000i-of-0000n.tar, for tools that read WebDataset; a sample is the members "
        "KEY.EXT (KEY the __key__ SPLIT/ROW, e.g. train/17.wav + train/17.json): the "
        "audio or image file as it is, under its own extension, and the other columns in "
        "KEY.json. Both train the same; choose webdataset when other tools in your pipeline "
        "read or write tars (docs/storage.md compares them).",
    )
    parser.add_argument(
        "--index_only",
        action="store_true",
        help="Write only SOURCE/index.json, for WebDataset tars already under SOURCE (from "
        "the webdataset library or by hand: KEY.flac + KEY.txt, KEY.jpg + KEY.cls, KEY.wav + "
        "KEY.json, ...), each read once, nothing saved to disk. A tar's split is the first "
        "word of its path that names one (train/, valid-*, dev_*, test-*, eval*, ...), "
        "else train; columns are the member extensions (flac, txt, cls) and the fields of "
        "KEY.json.",
    )
    return parser.parse_known_args(argv)


def main(argv: list[str] | None = None) -> None:
    silence_known_noise()
    args, task_flags = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.shard_size_mb <= 0:
            raise UserError("--shard_size_mb must be positive.")
        if args.index_only == (args.destination is not None):
            raise UserError("Give SOURCE and DESTINATION, or SOURCE alone with --index_only.")
        flags = parse_flags(["--task", args.task, "--dataset_name", args.source, *task_flags])
        task = flags.build_task()
        if args.index_only:
            store = open_store(args.source)
            index = index_in_place(store, args.task, task.label_column(), task.column_flags())
        else:
            store = open_store(args.destination)
            index = write_shards(
                args.task, task, args.source, store, args.shard_size_mb, args.format
            )
    except UserError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        sys.exit(2)
    for split, shards in index.splits.items():
        rows = sum(shard.rows for shard in shards)
        size = sum(shard.bytes for shard in shards) / 1e6
        print(f"{split}: {rows} examples in {len(shards)} shard(s), {size:.1f} MB", flush=True)
    print(f"wrote {store.uri}/{INDEX}", flush=True)


if __name__ == "__main__":
    main()
