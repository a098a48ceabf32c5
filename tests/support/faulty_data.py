"""Damaged data for the data-fault tests (tests/unit/test_data_faults.py and
tests/processes/test_data_faults_runs.py): a shard damaged in place, and WebDataset shards
of tone clips with undecodable ones among them."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

from tests.support.helpers import few_clips
from tests.support.shard_sets import make_shards
from trainer.data.shard_index import read_index
from trainer.storage.store import open_store


def damaged(location: Path, shard_format: str, damage: str) -> str:
    """The first training shard of `location`, damaged in place; its file name."""
    index = read_index(open_store(str(location)))
    shard = location / index.splits["train"][0].file
    data = shard.read_bytes()
    if damage == "random bytes":
        middle, size = len(data) // 2, min(4096, len(data) // 4)  # the 4 KB, if it fits
        shard.write_bytes(data[:middle] + os.urandom(size) + data[middle + size :])
    else:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            members = tar.getmembers()
        third = members[5]  # samples are .json members only: the 6th member is sample 6's
        end = third.offset_data + -(-third.size // 512) * 512
        inside = third.offset_data + third.size // 2  # in the middle of its JSON
        shard.write_bytes(data[:end] if damage == "at a sample boundary" else data[:inside])
    return shard.name


STREAMED_CLIPS = 6
"""Good clips per split of `speech_shards_with_bad_clips`."""


def speech_shards_with_bad_clips(demo_assets, root: Path) -> Path:
    """WebDataset shards (one clip each) of a few tone clips per split, plus a garbage and
    an empty clip in train (samples `train/6` and `train/7`) and a garbage one in test."""
    source = few_clips(demo_assets, root / "speech", per_split=STREAMED_CLIPS)
    for split, names in (("train", ("garbage.wav", "empty.wav")), ("test", ("garbage.wav",))):
        (source / split / "garbage.wav").write_bytes(b"RIFF, but no audio " * 40)
        (source / split / "empty.wav").write_bytes(b"")
        with (source / split / "metadata.csv").open("a") as handle:
            handle.writelines(f"{name},red cats\n" for name in names)
    make_shards(source, root / "shards", "--task", "speech-recognition", "--text_column_name",
                "transcription", "--format", "webdataset", "--shard_size_mb", "0.01")  # fmt: skip
    return root / "shards"


BAD_SAMPLES = rf"train/{STREAMED_CLIPS}\.wav|train/{STREAMED_CLIPS + 1}\.wav"
"""A regex of the two bad training samples' names in `speech_shards_with_bad_clips`."""
