"""`python -m trainer.shards`: local layouts become Parquet shards with embedded media and an
index, locally and in Cloud Storage (the emulator); bad input is one error line."""

from __future__ import annotations

import csv
import io
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from PIL import Image

from tests.conftest import REPO_ROOT, trainer_env
from tests.gcs_emulator import BUCKET
from trainer.shards import INDEX, KEY_COLUMN, read_index
from trainer.storage import open_store
from trainer.streams import shard_split
from trainer.tiny_assets import COLOURS, IMAGE_SPLITS, write_colour_images, write_sentiment_csv


def make_shards(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainer.shards", *map(str, args)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def error_lines(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.startswith("error:")]


def test_audiofolder_becomes_parquet_shards_with_the_audio_inside(demo_assets, tmp_path):
    target = tmp_path / "shards"
    done = make_shards(demo_assets.dataset_dir, target, "--task", "speech-recognition",
                       "--text_column_name", "transcription", "--shard_size_mb", "0.1",
                       env=trainer_env(tmp_path / "cache"))  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]

    index = read_index(open_store(str(target)))
    for split in ("train", "test"):
        with (demo_assets.dataset_dir / split / "metadata.csv").open() as handle:
            rows = list(csv.DictReader(handle))
        assert index.rows(split) == len(rows)
        assert len(index.splits[split]) > 1, "0.1 MB shards: the clips need several"
        keys, transcripts = [], []
        for shard in index.splits[split]:
            table = pq.read_table(target / shard.file)
            assert table.num_rows == shard.rows
            audio = table.column("audio").to_pylist()
            assert all(a["bytes"] and a["bytes"][:4] == b"RIFF" for a in audio), "not embedded"
            keys += table.column(KEY_COLUMN).to_pylist()
            transcripts += table.column("transcription").to_pylist()
        assert keys == [f"{split}/{i}" for i in range(len(rows))]
        assert transcripts == [row["transcription"] for row in rows]
    assert {"audio", "transcription", KEY_COLUMN} <= set(index.columns)
    assert index.task == "speech-recognition" and index.labels is None


def test_imagefolder_goes_to_cloud_storage_with_its_label_names(tmp_path, gcs):
    source = tmp_path / "images"
    write_colour_images(source)
    uri = f"gs://{BUCKET}/{uuid.uuid4().hex}/images"
    done = make_shards(source, uri, "--task", "image-classification", "--shard_size_mb", "0.05",
                       env=trainer_env(tmp_path / "cache", STORAGE_EMULATOR_HOST=gcs))  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"wrote {uri}/{INDEX}" in done.stdout

    store = open_store(uri)
    index = read_index(store)
    assert index.features["label"]["names"] == sorted(COLOURS)
    assert index.rows("train") == IMAGE_SPLITS["train"] * len(COLOURS)
    stored = store.list_files()
    assert set(stored) == {INDEX} | {s.file for shards in index.splits.values() for s in shards}
    first = index.splits["train"][0]
    assert stored[first.file].size == first.bytes
    local = tmp_path / "one-shard"
    store.download(local, [stored[first.file]])
    image = pq.read_table(local / first.file).column("image").to_pylist()[0]
    assert Image.open(io.BytesIO(image["bytes"])).size[0] > 0


def test_text_labels_are_recorded_for_streams(tmp_path):
    source = tmp_path / "sentiment"
    write_sentiment_csv(source)
    columns = ["--text_column_name", "sentence", "--label_column_name", "sentiment"]
    done = make_shards(source, tmp_path / "shards", "--task", "text-classification", *columns)
    assert done.returncode == 0, done.stderr[-3000:]
    index = read_index(open_store(str(tmp_path / "shards")))
    assert index.labels == {"sentiment": ["negative", "neutral", "positive"]}
    assert set(index.splits) == {"train", "test"}


def test_common_voice_directory(common_voice_dir, tmp_path):
    done = make_shards(common_voice_dir, tmp_path / "cv", "--task", "speech-recognition",
                       "--text_column_name", "sentence")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    index = read_index(open_store(str(tmp_path / "cv")))
    assert set(index.splits) == {"train", "validation", "test"}
    assert "path" not in index.columns and "audio" in index.columns


@pytest.mark.parametrize(
    ("layout", "args", "message"),
    [
        ("empty-dir", ["--task", "image-classification"], "is not an imagefolder"),
        ("sentiment", ["--task", "text-classification"], 'Column "text" (--text_column_name)'),
        ("header-only", ["--task", "text-classification"], "corresponds to no data"),
        ("sentiment", ["--task", "text-classification", "--shard_size_mb", "0"], "positive"),
    ],
)
def test_bad_input_is_one_error_line(tmp_path, layout, args, message):
    source = tmp_path / layout
    source.mkdir()
    if layout == "sentiment":
        write_sentiment_csv(source)
    if layout == "header-only":
        (source / "train.csv").write_text("text,label\n")
    done = make_shards(source, tmp_path / "out", *args)
    assert done.returncode == 2
    assert len(error_lines(done)) == 1 and message in error_lines(done)[0], done.stderr
    assert not (tmp_path / "out" / INDEX).exists()


def streamed(location: Path, split: str) -> list[dict]:
    index = read_index(open_store(str(location)))
    return list(shard_split(str(location), index, split, streaming=True))


def few_clips(demo_assets, target: Path, per_split: int) -> Path:
    """An audiofolder of the demo speech's first `per_split` clips of each split."""
    for split in ("train", "test"):
        with (demo_assets.dataset_dir / split / "metadata.csv").open() as handle:
            rows = list(csv.DictReader(handle))[:per_split]
        (target / split).mkdir(parents=True)
        with (target / split / "metadata.csv").open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        for row in rows:
            (target / split / row["file_name"]).hardlink_to(
                demo_assets.dataset_dir / split / row["file_name"]
            )
    return target


def test_webdataset_shards_hold_the_clips_as_files_and_stream_as_parquet_does(
    demo_assets, tmp_path
):
    """Demo speech as tars: `KEY.wav` (the source file) + `KEY.json` per sample, KEY the
    example's `__key__`; the same examples, audio and texts as the Parquet shards of the
    same source; a second run writes the same bytes."""
    source = few_clips(demo_assets, tmp_path / "speech", per_split=30)
    flags = ["--task", "speech-recognition", "--text_column_name", "transcription",
             "--shard_size_mb", "0.5"]  # fmt: skip
    for name, shard_format in (
        ("parquet", "parquet"),
        ("tar", "webdataset"),
        ("again", "webdataset"),
    ):
        done = make_shards(source, tmp_path / name, *flags, "--format", shard_format,
                           env=trainer_env(tmp_path / "cache"))  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
    parquet, tars = (read_index(open_store(str(tmp_path / name))) for name in ("parquet", "tar"))
    assert tars.features == parquet.features and tars.labels is None

    for split, shards in tars.splits.items():
        assert [s.rows for s in shards] == [s.rows for s in parquet.splits[split]]
        assert len(shards) > 1
        members = []
        for shard in shards:
            path = tmp_path / "tar" / shard.file
            assert shard.file.endswith(".tar") and path.stat().st_size == shard.bytes
            assert path.read_bytes() == (tmp_path / "again" / shard.file).read_bytes()
            with tarfile.open(path) as tar:
                members += tar.getmembers()
        with tarfile.open(tmp_path / "tar" / shards[0].file) as tar:
            first_clip = tar.extractfile(f"{split}/0.wav").read()
        assert first_clip == (source / split / "0000.wav").read_bytes()
        assert [m.name for m in members] == [
            f"{split}/{row}{extension}" for row in range(tars.rows(split))
            for extension in (".wav", ".json")
        ]  # fmt: skip
        assert {(m.mtime, m.uid, m.gid, m.uname, m.mode) for m in members} == {(0, 0, 0, "", 0o644)}

        expected, examples = (
            streamed(tmp_path / "parquet", split),
            streamed(tmp_path / "tar", split),
        )
        assert [(e["__key__"], e["transcription"]) for e in examples] == [
            (e["__key__"], e["transcription"]) for e in expected
        ]
        for mine, theirs in zip(examples, expected, strict=True):
            mine, theirs = mine["audio"].get_all_samples(), theirs["audio"].get_all_samples()
            assert mine.sample_rate == theirs.sample_rate and (mine.data == theirs.data).all()
