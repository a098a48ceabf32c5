"""Damaged training data (issue 20's data faults): a shard that disagrees with its index,
undecodable clips (map-style and streamed), a CSV that is not UTF-8. Each is either
skipped and counted, or stopped with one `error:` line naming the file, never trained on
silently."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import tarfile
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from tests.support.helpers import (
    DEMO_SPEECH_FLAGS,
    few_clips,
    run_trainer,
    speech_task,
    trainer_env,
)
from tests.support.shard_sets import COLUMNS, make_sentiment_shards, make_shards
from tests.support.tiny_assets import (
    BAD_CLIPS,
    TONE_CLIPS,
    tone_speech_with_bad_clips,
    write_sentiment_csv,
)
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


DECODER_IMPORTED = """
import pickle, sys
from datasets import Audio, Features, IterableDataset
from trainer.data.bad_examples import DecodedOrNamed, mark_undecodable
from trainer.tasks.speech import _decoder_seconds

assert "torchcodec" not in sys.modules, "imported before: the check below would prove nothing"
if sys.argv[1] == "made":
    rows = [{"audio": {"path": "a.wav", "bytes": b""}}]
    features = Features({"audio": Audio(decode=False)})
    stream = IterableDataset.from_generator(lambda: iter(rows), features=features)
    mark_undecodable(stream, "audio", _decoder_seconds)
else:
    pickle.loads(bytes.fromhex(sys.argv[2]))
print(sorted(name for name in ("torchcodec.decoders", "PIL.Image") if name in sys.modules))
"""


def test_a_streams_decoder_is_imported_before_its_threads_read_it(tmp_path):
    """`datasets` reads a stream's sources in threads that race on importing the decoder
    (bad_examples.DecodedOrNamed says how it fails); the module is imported where the
    stream's decoding is made, and where its pickle is loaded (a spawned loader worker),
    each in a fresh process that had not imported it."""
    import pickle
    import subprocess
    import sys

    from datasets import Audio

    from trainer.data.bad_examples import DecodedOrNamed
    from trainer.tasks.speech import _decoder_seconds

    pickled = pickle.dumps(DecodedOrNamed("audio", Audio(), _decoder_seconds)).hex()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_DATASETS_CACHE": str(tmp_path)}
    for how in (["made"], ["unpickled", pickled]):
        done = subprocess.run([sys.executable, "-c", DECODER_IMPORTED, *how], env=env,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        assert "torchcodec.decoders" in done.stdout.splitlines()[-1], (how[0], done.stdout)


@pytest.mark.slow
def test_a_streamed_speech_run_skips_a_garbage_clip_up_to_the_limit(demo_assets, tmp_path):
    """The real command line, two loader workers per process: with room for the two bad
    training clips, two processes finish, the chief's lines counting both processes'
    skips from when they were read; with --max_bad_examples 0 the run stops with one line
    naming them, exit code 78."""
    shards = speech_shards_with_bad_clips(demo_assets, tmp_path)
    run = ["--model_name_or_path", str(demo_assets.model_dir), "--dataset_name", str(shards),
           *DEMO_SPEECH_FLAGS, "--streaming", "true", "--dataloader_num_workers", "2",
           "--max_steps", "4", "--per_device_train_batch_size", "4", "--logging_steps", "1",
           "--save_strategy", "no", "--generation_max_length", "4"]  # fmt: skip
    env = trainer_env(tmp_path / "cache")
    code, output = run_trainer(
        [*run, "--nproc_per_node", "2", "--max_bad_examples", "2", "--eval_strategy", "no",
         "--do_eval", "true", "--stream_audit_dir", "audit", "--output_dir", "kept"],
        tmp_path, env,
    )  # fmt: skip
    assert code == 0, output[-3000:]
    assert f"warning: skipped 1 of {STREAMED_CLIPS + 1} clips in split test of" in output
    lines = output.splitlines()
    steps = [line for line in lines if line.startswith(("step ", "training done"))]
    found = [re.search(r"\| skipped (\d) undecodable of (\d+) streamed$", line) for line in steps]
    counts = [int(match[1]) if match else 0 for match in found]
    assert len(steps) == 5 and counts == sorted(counts) and counts[-1] == 2, steps
    trained = sum(len(path.read_text().splitlines()) for path in (tmp_path / "audit").iterdir())
    # both processes' reads: what they trained on, and each skipped clip at least once
    assert int(found[-1][2]) >= trained + 2, (steps[-1], trained)
    assert any(re.match(rf"warning: skipped undecodable examples in the training stream "
                        rf"\(split train of {shards}\): ({BAD_SAMPLES})", line)
               for line in lines), output[-3000:]  # fmt: skip

    code, output = run_trainer(
        [*run, "--max_bad_examples", "0", "--eval_strategy", "no", "--output_dir", "stopped"],
        tmp_path, env,
    )  # fmt: skip
    assert code == 78, output[-3000:]
    (line,) = error_lines(output)
    assert re.match(
        rf"error: [12] of the \d+ examples read from the training stream .* "
        rf"--max_bad_examples 0 allows \(0\); first: ({BAD_SAMPLES}).*; (the newest complete "
        rf"checkpoint is stopped/checkpoint-\d+, where a restart resumes|there is no "
        rf"complete checkpoint in stopped)",
        line,
    ), line
    assert "final model and processor saved" not in output
