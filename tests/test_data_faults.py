"""Damaged training data (issue 20's data faults): a shard that disagrees with its index,
undecodable clips, a CSV that is not UTF-8. Each is either skipped and counted, or stopped
with one `error:` line naming the file, never trained on silently."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import tarfile
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from tests.helpers import DEMO_SPEECH_FLAGS, run_trainer, trainer_env
from tests.test_speech_task import BAD_CLIPS, tone_speech_with_bad_clips
from tests.test_streaming import COLUMNS, make_sentiment_shards
from tests.tiny_assets import TONE_CLIPS, write_sentiment_csv
from trainer.common.errors import UserError
from trainer.data.faults import DataFault
from trainer.data.shard_index import INDEX, ShardIndex, read_index
from trainer.data.shard_reader import shard_split
from trainer.data.sources import check_shard_set
from trainer.storage.store import open_store


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("error:")]


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


DAMAGES = [("webdataset", "at a sample boundary"), ("webdataset", "mid-sample"),
           ("parquet", "random bytes"), ("webdataset", "random bytes")]  # fmt: skip


@pytest.mark.parametrize(("shard_format", "damage"), DAMAGES)
def test_a_damaged_shard_is_one_line_naming_it_at_launch_or_when_read(
    tmp_path, shard_format, damage
):
    location = tmp_path / "shards"
    index = make_sentiment_shards(tmp_path, str(location), 0.00097, shard_format=shard_format)
    name = damaged(location, shard_format, damage)
    if damage != "random bytes":  # a different size shows in a listing, before launch
        with pytest.raises(UserError, match=rf"Shard {location}/{name} holds \d+ bytes but"):
            check_shard_set(index, str(location), ["train"], {})
    else:
        check_shard_set(index, str(location), ["train"], {})  # same size: seen when read
    stream = shard_split(str(location), index, "train", streaming=True)
    with pytest.raises(DataFault, match=rf"^shard {location}/{name} (holds|has CRC32C)"):
        list(stream)
    # torch re-raises a loader worker's exception with its traceback as the message
    with pytest.raises(DataFault, match=rf"^shard {location}/{name} .*\(in a DataLoader worker\)$"):
        list(DataLoader(stream, batch_size=None, num_workers=1))


def test_an_index_without_checksums_still_reads_and_counts(tmp_path):
    """Indexes written before CRC32C was recorded: read as before, with sizes and counts
    still checked."""
    location = tmp_path / "shards"
    index = make_sentiment_shards(tmp_path, str(location), 0.00097, shard_format="webdataset")
    old = json.loads(index.to_json())
    for shards in old["splits"].values():
        for shard in shards:
            del shard["crc32c"]
    (location / INDEX).write_text(json.dumps(old))
    old_index = read_index(open_store(str(location)))
    assert len(list(shard_split(str(location), old_index, "train", streaming=True))) == 60
    first = old_index.splits["train"][0]
    lying = dataclasses.replace(first, rows=first.rows + 1)
    splits = {**old_index.splits, "train": [lying, *old_index.splits["train"][1:]]}
    miscounted = ShardIndex(old_index.task, old_index.features, splits, old_index.labels)
    with pytest.raises(DataFault, match=rf"{first.file} held 15 examples but {INDEX} says 16"):
        list(shard_split(str(location), miscounted, "train", streaming=True))


def test_a_gs_shard_set_is_checked_against_the_checksums_the_bucket_reports(tmp_path, gcs):
    import uuid

    from tests.gcs_emulator import BUCKET

    uri = f"gs://{BUCKET}/{uuid.uuid4().hex}/shards"
    index = make_sentiment_shards(tmp_path, uri, 0.00097)
    shard = index.splits["train"][1]
    local = tmp_path / "copy"
    open_store(uri).download(local)
    data = bytearray((local / shard.file).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (local / shard.file).write_bytes(bytes(data))
    open_store(uri).upload(local, [shard.file])
    with pytest.raises(UserError, match=rf"Shard {uri}/{shard.file} has CRC32C \S+ but"):
        check_shard_set(index, uri, ["train"], {})


def test_the_launcher_refuses_a_shard_of_the_wrong_size_and_a_csv_that_is_not_utf8(
    tmp_path,
    text_assets,  # noqa: F811 - the fixture
):
    """The real command line: one error line each, exit 2, nothing launched."""
    model_dir, _ = text_assets
    location = tmp_path / "shards"
    index = make_sentiment_shards(tmp_path, str(location), 0.00097)
    shard = location / index.splits["test"][0].file
    shard.write_bytes(shard.read_bytes()[:-100])
    latin = tmp_path / "latin"
    write_sentiment_csv(latin)
    text = (latin / "train.csv").read_bytes()
    offset = text.index(b"\n", 100) + 1
    (latin / "train.csv").write_bytes(
        text[:offset] + "Caf\xe9 sales".encode("latin-1") + text[offset:]
    )
    env = trainer_env(tmp_path / "cache")
    base = ["--task", "text-classification", "--model_name_or_path", str(model_dir), *COLUMNS,
            "--max_steps", "1", "--output_dir", "out"]  # fmt: skip
    for dataset, expected in [
        (location, f"error: Shard {shard} holds {index.splits['test'][0].bytes - 100} bytes"),
        (latin, f"error: {latin / 'train.csv'} is not UTF-8: byte 0xe9 at offset {offset + 3}"),
    ]:
        extra = ["--streaming", "true"] if dataset == location else []
        code, output = run_trainer([*base, "--dataset_name", str(dataset), *extra], tmp_path, env)
        assert code == 2, output[-3000:]
        assert len(error_lines(output)) == 1 and error_lines(output)[0].startswith(expected), (
            output[-3000:]
        )


@pytest.mark.slow
def test_a_run_streaming_a_damaged_parquet_shard_stops_naming_it(tmp_path, text_assets):  # noqa: F811
    """Random bytes inside a Parquet shard (same size: the launch check passes): the run
    stops when the shard has been read, with one error line naming it."""
    model_dir, _ = text_assets
    location = tmp_path / "shards"
    make_sentiment_shards(tmp_path, str(location), 0.00097)
    name = damaged(location, "parquet", "random bytes")
    code, output = run_trainer(
        ["--task", "text-classification", "--model_name_or_path", str(model_dir),
         "--dataset_name", str(location), *COLUMNS, "--streaming", "true", "--max_steps", "40",
         "--per_device_train_batch_size", "4", "--eval_strategy", "no", "--save_strategy", "no",
         "--max_seq_length", "16", "--output_dir", "out"],
        tmp_path, trainer_env(tmp_path / "cache"),
    )  # fmt: skip
    assert code == 1, output[-3000:]
    lines = error_lines(output)
    assert len(lines) == 1 and f"DataFault: shard {location}/{name} has CRC32C" in lines[0], output[
        -3000:
    ]
    assert "final model and processor saved" not in output


@pytest.mark.slow
def test_a_speech_run_skips_a_garbage_an_empty_and_a_missing_clip(tmp_path, demo_assets):
    dataset = tone_speech_with_bad_clips(demo_assets, tmp_path / "speech")
    code, output = run_trainer(
        ["--model_name_or_path", str(demo_assets.model_dir), "--dataset_name", dataset,
         *DEMO_SPEECH_FLAGS, "--max_bad_examples", "3", "--max_steps", "4",
         "--per_device_train_batch_size", "4", "--logging_steps", "2", "--eval_strategy", "no",
         "--save_strategy", "no", "--max_eval_samples", "2", "--generation_max_length", "4",
         "--output_dir", "out"],
        tmp_path, trainer_env(tmp_path / "cache"),
    )  # fmt: skip
    assert code == 0, output[-3000:]
    total = TONE_CLIPS["train"] + len(BAD_CLIPS)
    assert f"warning: skipped 3 of {total} clips in split train of {dataset}" in output
    steps = [line for line in output.splitlines() if line.startswith("step ")]
    assert steps and all(line.endswith("| skipped 3 undecodable per epoch") for line in steps)
    assert "| skipped 3 undecodable per epoch" in next(
        line for line in output.splitlines() if line.startswith("training done")
    )
    assert (tmp_path / "out" / "model" / "model.safetensors").exists()
