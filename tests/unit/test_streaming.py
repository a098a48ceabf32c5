"""`--streaming true`: shard sets read as streams, divided among processes and loader
workers exactly once, shuffled reproducibly, resumed at the exact example, interleaved, and
checked before launch, in this process. Real runs through `python -m trainer` reading
from the GCS emulator, and a reader's disk use: tests/processes/test_streaming_runs.py."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from tests.support.gcs_emulator import BUCKET
from tests.support.helpers import image_task, resolved, speech_task, task_of
from tests.support.shard_sets import (
    COLUMNS,
    FORMATS,
    TRAIN_ROWS,
    make_sentiment_shards,
    make_shards,
)
from tests.support.tiny_assets import write_sentiment_csv
from trainer.command_line.parser import parse_flags
from trainer.common.errors import UserError
from trainer.data.shard_index import read_index
from trainer.data.shard_reader import shard_split
from trainer.data.streams import (
    POSITION,
    StreamPositions,
    StreamStart,
    prepare_stream,
)
from trainer.storage.store import open_store


@pytest.fixture(scope="module")
def shard_sets_in(tmp_path_factory) -> Callable[[str], dict[int, str]]:
    """Format -> (number of training shards -> a local sentiment shard set with that many),
    each made once."""
    made = {}

    def shard_sets(shard_format: str) -> dict[int, str]:
        if shard_format not in made:
            root = tmp_path_factory.mktemp(f"stream-shards-{shard_format}")
            made[shard_format] = {}
            for size in (0.00049, 0.00065):  # 8 and 6 shards of the 3.9 kB set
                location = str(root / f"shards-{size}")
                index = make_sentiment_shards(root, location, size, shard_format=shard_format)
                made[shard_format][len(index.splits["train"])] = location
        return made[shard_format]

    return shard_sets


@pytest.fixture(scope="module")
def shard_sets(shard_sets_in) -> dict[int, str]:
    return shard_sets_in("parquet")


def rank_stream(location: str, rank: int, world: int, monkeypatch, seed=3, start=None):
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    stream = shard_split(location, read_index(open_store(location)), "train", streaming=True)
    return prepare_stream(stream, seed=seed, buffer_size=8, start=start)


def keys_of(examples) -> list[str]:
    return [example["__key__"] for example in examples]


@pytest.mark.parametrize("shard_format", FORMATS)
def test_four_ranks_read_every_example_once_whether_or_not_shards_divide(
    shard_sets_in, shard_format, monkeypatch
):
    shard_sets = shard_sets_in(shard_format)
    assert (
        len(shard_sets) == 2
        and any(n % 4 for n in shard_sets)
        and any(n % 4 == 0 for n in shard_sets)
    ), f"want one shard count that 4 divides and one it does not: {sorted(shard_sets)}"
    for shards, location in shard_sets.items():
        parts = [keys_of(rank_stream(location, rank, 4, monkeypatch)) for rank in range(4)]
        seen = Counter(key for part in parts for key in part)
        assert sorted(seen) == sorted(f"train/{i}" for i in range(TRAIN_ROWS)), shards
        assert set(seen.values()) == {1}, f"{shards} shards: repeated {seen.most_common(3)}"
        assert max(map(len, parts)) - min(map(len, parts)) <= TRAIN_ROWS // 4, shards


@pytest.mark.parametrize("shard_format", FORMATS)
def test_loader_workers_split_a_process_part_without_overlap(
    shard_sets_in, shard_format, monkeypatch
):
    shard_sets = shard_sets_in(shard_format)
    location = shard_sets[max(shard_sets)]
    alone = keys_of(rank_stream(location, 1, 2, monkeypatch))
    loader = DataLoader(rank_stream(location, 1, 2, monkeypatch), batch_size=None, num_workers=2)
    examples = list(loader)
    assert sorted(keys_of(examples)) == sorted(alone)
    assert {example[POSITION][0] for example in examples} == {0, 1}, "both workers read"


def test_the_shuffle_is_seeded_and_changes_with_the_epoch(shard_sets, monkeypatch):
    location = shard_sets[max(shard_sets)]
    first = keys_of(rank_stream(location, 0, 1, monkeypatch, seed=3))
    assert first == keys_of(rank_stream(location, 0, 1, monkeypatch, seed=3))
    assert first != keys_of(rank_stream(location, 0, 1, monkeypatch, seed=4))
    stream = rank_stream(location, 0, 1, monkeypatch, seed=3)
    stream.set_epoch(1)
    second_epoch = keys_of(stream)
    assert second_epoch != first and sorted(second_epoch) == sorted(first)


@pytest.mark.parametrize("shard_format", FORMATS)
def test_a_stream_resumes_at_the_example_after_the_last_one_trained(
    shard_sets_in, shard_format, monkeypatch
):
    """Positions recorded from trained batches, saved and read back, restart the stream
    (same seed, same epoch, full shuffle buffer) exactly after them."""
    shard_sets = shard_sets_in(shard_format)
    location = shard_sets[max(shard_sets)]
    stream = rank_stream(location, 0, 1, monkeypatch)
    stream.set_epoch(2)
    whole = list(stream)
    positions = StreamPositions()
    positions.trained([example["stream_position"] for example in whole[:23]])
    assert (positions.epoch, positions.consumed) == (2, {0: 23})

    resumed = rank_stream(location, 0, 1, monkeypatch, start=StreamStart(2, {0: 23}))
    resumed.set_epoch(0)  # the Trainer counts epochs afresh after a resume
    assert keys_of(resumed) == keys_of(whole[23:])
    resumed.set_epoch(1)
    next_epoch = rank_stream(location, 0, 1, monkeypatch)
    next_epoch.set_epoch(3)
    assert keys_of(resumed) == keys_of(next_epoch)


def test_a_checkpoint_at_the_end_of_an_epoch_resumes_at_the_next(shard_sets, monkeypatch):
    location = shard_sets[max(shard_sets)]
    epoch = rank_stream(location, 0, 1, monkeypatch)
    epoch.set_epoch(4)
    size = len(list(epoch))
    resumed = rank_stream(location, 0, 1, monkeypatch, start=StreamStart(3, {0: size}))
    assert (resumed.start.epoch, resumed.start.consumed) == (4, {})
    resumed.set_epoch(0)
    assert keys_of(resumed) == keys_of(epoch)


def test_streaming_flags_are_checked_before_launch(shard_sets):
    location = shard_sets[max(shard_sets)]
    base = ["--task", "text-classification", "--model_name_or_path", "org/model",
            "--dataset_name", location, *COLUMNS, "--streaming"]  # fmt: skip
    for extra, message in [
        ([], "--streaming needs --max_steps"),
        (["--max_steps", "3", "--train_sampling_strategy", "group_by_length"], "group_by_length"),
        (["--max_steps", "3", "--shuffle_buffer_size", "0"], "--shuffle_buffer_size"),
    ]:
        with pytest.raises(UserError, match=message):
            resolved([*base, *extra])
    task = task_of([*base, "--max_steps", "3", "--class_weights", "balanced"])
    with pytest.raises(UserError, match="balanced counts the training split"):
        task.check_inputs()
    task = task_of([*base, "--max_steps", "3", "--train_split_name", "train+dev"])
    with pytest.raises(UserError, match='Split "dev" not found'):
        task.check_inputs()


def test_a_gs_directory_without_shards_is_not_streamed(tmp_path, gcs):
    uri = f"gs://{BUCKET}/{uuid.uuid4().hex}/plain"
    write_sentiment_csv(tmp_path / "plain")
    open_store(uri).upload(tmp_path / "plain")
    task = parse_flags(["--task", "text-classification", "--dataset_name", uri, *COLUMNS,
                        "--streaming", "--max_steps", "3"]).build_task()  # fmt: skip
    with pytest.raises(UserError, match="python -m trainer.shards"):
        task.build_model_and_processor()


def test_an_evaluation_split_of_a_shard_set_is_loaded_whole(shard_sets):
    location = shard_sets[max(shard_sets)]
    evaluation = shard_split(location, read_index(open_store(location)), "test", streaming=False)
    assert len(evaluation) == 18 and evaluation[0]["__key__"] == "test/0"


def test_interleaved_streams_mix_by_probability_and_read_each_example_once(
    tmp_path, shard_sets, monkeypatch
):
    """Two shard sets (the sentiment set, and the same in capitals), 0.8 / 0.2, over two
    processes: every example of both once per epoch, the first mostly from the first set."""
    shouting = tmp_path / "shouting"
    shouting.mkdir()
    for split in ("train", "test"):
        source = Path(shard_sets[max(shard_sets)]).parent / "sentiment" / f"{split}.csv"
        (shouting / f"{split}.csv").write_text(source.read_text().upper().replace(
            "SENTENCE,SENTIMENT", "sentence,sentiment"))  # fmt: skip
    loud = make_sentiment_shards(tmp_path, str(tmp_path / "loud"), 0.00049, source=shouting)
    assert loud.labels == {"sentiment": ["NEGATIVE", "NEUTRAL", "POSITIVE"]}
    names = f"{shard_sets[max(shard_sets)]},{tmp_path / 'loud'}"
    task = task_of(["--task", "text-classification", "--model_name_or_path", "org/model",
                    "--dataset_name", names, *COLUMNS, "--streaming", "--max_steps", "3",
                    "--seed", "5", "--interleave_probabilities", "0.8,0.2"])  # fmt: skip
    for source in task.sources():
        source.check_inputs()
    mixed = task.interleaved(lambda source: source._load_split("train", streaming=True))
    parts = []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        parts.append(list(prepare_stream(mixed, seed=5, buffer_size=8, start=None)))
    seen = Counter((ex["text"].isupper(), ex["__key__"]) for part in parts for ex in part)
    assert len(seen) == 2 * TRAIN_ROWS and set(seen.values()) == {1}
    first = [ex["text"].isupper() for ex in parts[0][:20]]
    assert first.count(False) > first.count(True), first
    assert task._indexed_labels() == sorted(
        ["negative", "neutral", "positive", "NEGATIVE", "NEUTRAL", "POSITIVE"]
    )


STREAM_FLAGS = ["--streaming", "--max_steps", "2"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--interleave_probabilities", "0.5,0.5"], "add --streaming true"),
        ([*STREAM_FLAGS, "--interleave_probabilities", "1"], "1 probabilities for 2"),
        ([*STREAM_FLAGS, "--interleave_probabilities", "1,x"], "positive numbers"),
        ([*STREAM_FLAGS, "--interleave_probabilities", "1,1", "--dataset_config_name", "a,b,c"],
         "3 configs for 2 datasets"),
    ],
)  # fmt: skip
def test_interleaving_flags_are_checked(extra, message):
    with pytest.raises(UserError, match=message):
        resolved(["--task", "text-classification", "--model_name_or_path", "org/model",
                  "--dataset_name", "a/b,c/d", *extra])  # fmt: skip


def test_speech_streams_from_shards_filter_by_duration_and_collate(demo_assets, tmp_path):
    """train+test of the demo's speech as a stream: the duration filter keeps what it keeps
    on the map-style data, and the collator makes Whisper batches from streamed clips."""

    shards = tmp_path / "speech-shards"
    make_shards(demo_assets.dataset_dir, shards, "--task", "speech-recognition",
                "--text_column_name", "transcription", "--shard_size_mb", "0.2")  # fmt: skip
    flags = ["--text_column_name", "transcription", "--max_duration_in_seconds", "1.4",
             "--train_split_name", "train+test", "--eval_split_name", "test"]  # fmt: skip
    task, _, processor = speech_task(demo_assets.model_dir, shards, *flags)
    whole, evaluation = task.load_datasets(processor)
    task, _, processor = speech_task(
        demo_assets.model_dir, shards, *flags, "--streaming", "--max_steps", "1"
    )
    stream, streamed_evaluation = task.load_datasets(processor)
    examples = list(prepare_stream(stream, seed=1, buffer_size=4, start=None))
    assert sorted(keys_of(examples)) == sorted(whole["__key__"])
    assert 0 < len(examples) < read_index(open_store(str(shards))).rows("train") + len(evaluation)
    assert {key.split("/")[0] for key in keys_of(examples)} == {"train", "test"}
    assert len(streamed_evaluation) == len(evaluation), "evaluation stays map-style"
    batch = task.data_collator(processor)([{k: v for k, v in ex.items() if k != POSITION}
                                           for ex in examples[:3]])  # fmt: skip
    assert batch["input_features"].shape[0] == 3 and batch["labels"].shape[0] == 3


def test_image_streams_augment_and_collate(tmp_path):
    from tests.support.tiny_assets import build_tiny_vit, write_colour_images

    write_colour_images(tmp_path / "images")
    build_tiny_vit(tmp_path / "vit")
    make_shards(tmp_path / "images", tmp_path / "s", "--task", "image-classification",
                "--shard_size_mb", "0.1")  # fmt: skip
    task = image_task(tmp_path / "vit", tmp_path / "s", "--streaming", "--max_steps", "1",
                      "--augment", "true")  # fmt: skip
    _, processor = task.build_model_and_processor()
    assert task.labels.names == ("blue", "green", "red")
    train, evaluation = task.load_datasets(processor)
    examples = list(prepare_stream(train, seed=1, buffer_size=4, start=None))
    assert len(examples) == read_index(open_store(str(tmp_path / "s"))).rows("train")
    batch = task.data_collator(processor)([{k: v for k, v in ex.items() if k != POSITION}
                                           for ex in examples[:4]])  # fmt: skip
    assert batch["pixel_values"].shape[0] == 4 and len(evaluation) == 36
