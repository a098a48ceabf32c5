"""The real command line `python -m trainer.shards`, in a subprocess: an imagefolder
written as shards into Cloud Storage (the emulator) with its label names, and bad input as
one error line. The other cases call `trainer.shards.main` in this process:
tests/unit/test_shards.py."""

from __future__ import annotations

import io
import subprocess
import sys
import uuid

import pyarrow.parquet as pq
from PIL import Image

from tests.support.gcs_emulator import BUCKET
from tests.support.helpers import REPO_ROOT, trainer_env
from tests.support.tiny_assets import (
    COLOURS,
    IMAGE_SPLITS,
    write_colour_images,
    write_sentiment_csv,
)
from trainer.data.shard_index import INDEX, read_index
from trainer.storage.store import open_store


def make_shards(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The real command line, `python -m trainer.shards ARGS`, in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "trainer.shards", *map(str, args)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_imagefolder_goes_to_cloud_storage_with_its_label_names(tmp_path, gcs):
    """Through the real command line (a subprocess), as tests/unit/test_shards.py's cases are
    not."""
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


def test_the_real_command_line_says_bad_input_in_one_error_line(tmp_path):
    """tests/unit/test_shards.py's bad inputs in-process; this one through
    `python -m trainer.shards`."""
    source = tmp_path / "sentiment"
    write_sentiment_csv(source)
    done = make_shards(source, tmp_path / "out", "--task", "text-classification")
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f'error: Column "text" (--text_column_name) not found in {source}')
    assert not (tmp_path / "out" / INDEX).exists()
