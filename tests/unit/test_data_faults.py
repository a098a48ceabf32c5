"""Damaged training data (issue 20's data faults), in this process: a shard that disagrees
with its index (read directly and through a DataLoader worker), undecodable streamed clips
counted against --max_bad_examples. Each is either skipped and counted, or stopped with a
line naming the file, never trained on silently. The real command line on damaged data is
tests/processes/test_data_faults_runs.py's (and the map-style skipped clips
tests/processes/test_two_process_speech_run.py's)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from torch.utils.data import DataLoader

from tests.support.faulty_data import (
    BAD_SAMPLES,
    STREAMED_CLIPS,
    damaged,
    speech_shards_with_bad_clips,
)
from tests.support.helpers import speech_task
from tests.support.shard_sets import make_sentiment_shards
from trainer.common.errors import UserError
from trainer.data.bad_examples import UNDECODABLE, StreamSkips
from trainer.data.damaged_data import DataFault
from trainer.data.shard_index import INDEX, ShardIndex, read_index
from trainer.data.shard_reader import shard_split
from trainer.data.sources import check_shard_set
from trainer.data.streams import (
    POSITION,
    SKIPPED,
    PositionCollator,
    ResumableStream,
    StreamPositions,
    prepare_stream,
    stream_start,
)
from trainer.storage.store import open_store

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
            check_shard_set(index, str(location), "train", "", {})
    else:
        check_shard_set(index, str(location), "train", "", {})  # same size: seen when read
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

    from tests.support.gcs_emulator import BUCKET

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
        check_shard_set(index, uri, "train", "", {})


def test_loader_workers_skip_undecodable_streamed_clips_and_carry_their_names(
    demo_assets, tmp_path
):
    """Two loader worker processes decode the streamed clips; the bad ones reach the
    training process only as names in the batches, and the limit counts them."""
    shards = speech_shards_with_bad_clips(demo_assets, tmp_path)
    task, _, processor = speech_task(
        demo_assets.model_dir, shards, "--text_column_name", "transcription", "--streaming",
        "--max_steps", "1", "--max_bad_examples", "1",
    )  # fmt: skip
    stream, evaluation = task.load_datasets(processor)
    assert len(evaluation) == STREAMED_CLIPS, "the evaluation split's garbage clip is skipped"
    loader = DataLoader(
        prepare_stream(stream, seed=1, buffer_size=4, start=None), batch_size=3, num_workers=2,
        collate_fn=PositionCollator(task.data_collator(processor)),
    )  # fmt: skip
    skips = StreamSkips("1", "split train of D")
    batches = list(loader)
    for batch in batches:
        skips.trained(len(batch[POSITION]), batch[SKIPPED])
    assert sum(len(batch["labels"]) for batch in batches) == STREAMED_CLIPS
    assert {worker for batch in batches for worker, *_ in batch[POSITION]} == {0, 1}
    with pytest.raises(UserError, match=rf"^2 of the {STREAMED_CLIPS + 2} examples read from the "
                       r"training stream \(split train of D\) cannot be decoded, more than "
                       rf"--max_bad_examples 1 allows \(1\); first: ({BAD_SAMPLES}), "
                       rf"({BAD_SAMPLES})$"):  # fmt: skip
        skips.agree(lambda mine: mine)


def test_stream_skips_count_each_file_once_against_a_count_or_a_share():
    skips = StreamSkips("1%", "train")
    skips.trained(0, ["a.wav"])
    assert skips.agree(lambda mine: mine), "the first names are news"
    assert skips.limit() == 10, "1% of at least 1000: one bad first example stops nothing"
    skips.trained(498, [])
    other_rank = [(["a.wav", "b.wav"], 1500)]  # a.wav again: read there in a later epoch
    assert not skips.agree(lambda mine: mine + other_rank)
    assert (list(skips.names), skips.read, skips.limit()) == (["a.wav", "b.wav"], 1999, 19)
    assert StreamSkips("1%", "train", rows=300).limit() == 3, "the index's count, when known"
    exact = StreamSkips("2", "train")
    exact.trained(5, ["a", "b"])
    exact.agree(lambda mine: mine)
    exact.trained(5, ["c"])
    with pytest.raises(UserError, match=r"^3 of the 13 examples .* allows \(2\); first: a, b, c$"):
        exact.agree(lambda mine: mine)


def test_a_resumed_stream_counts_on_from_its_checkpoint(tmp_path):
    """The names skipped before a checkpoint are not read again after it: the checkpoint's
    stream state keeps them, agreed and not yet agreed."""
    skips = StreamSkips("2", "train")
    skips.trained(5, ["a", "b"])
    skips.agree(lambda mine: mine)
    skips.trained(5, ["c"])
    StreamPositions(epoch=1, consumed={0: 4}).save(tmp_path, 0, 1, skips.state())
    start = stream_start(str(tmp_path), 0, 1)
    resumed = StreamSkips("2", "train")
    resumed.resume(start.skipped)
    with pytest.raises(UserError, match=r"^3 of the 13 examples .*; first: a, b, c$"):
        resumed.agree(lambda mine: mine)


def _rows(rows: list[dict]):
    yield from rows


def test_a_stream_hands_the_names_it_drops_to_a_neighbouring_example():
    """Names go with the next example, and those after the last one with the last one; a
    part where nothing decodes is a DataFault naming it."""
    from datasets import IterableDataset

    def stream(*names):
        rows = [{"n": n, UNDECODABLE: name} for n, name in enumerate(names)]
        return IterableDataset.from_generator(_rows, gen_kwargs={"rows": rows})

    examples = list(ResumableStream(stream("a", None, "b", None, "c")))
    assert [(example["n"], example[SKIPPED]) for example in examples] == [(1, ["a", "b"]),
                                                                          (3, ["c"])]  # fmt: skip
    assert [example[POSITION][2] for example in examples] == [1, 3]
    with pytest.raises(DataFault, match=r"^none of the 2 examples loader worker 0 read from "
                       r"the training stream in epoch 0 decodes \(first: a, b\)$"):  # fmt: skip
        list(ResumableStream(stream("a", "b")))
