"""`--streaming true`: shard sets read as streams, divided among processes and loader
workers exactly once, shuffled reproducibly, resumed at the exact example; and real runs
through `python -m trainer` on two simulated nodes with two processes each, reading from
the GCS emulator."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from tests.support.gcs_emulator import BUCKET
from tests.support.helpers import (
    DEMO_SPEECH_FLAGS,
    REPO_ROOT,
    few_clips,
    final_weights,
    finish_all,
    image_task,
    node_stalls_after,
    resolved,
    run_trainer,
    speech_task,
    start_nodes,
    task_of,
    trainer_env,
    vertex_outputs,
    wait_while_running,
    with_start_hook,
)
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


# Two simulated nodes x two processes, ZeRO-2, the sentiment set as 4 shards of 15 in the
# GCS emulator: one shard per process per epoch, 5 examples per batch, so 3 steps are one
# epoch.
STEPS_PER_EPOCH = 3
MAX_STEPS = 30
STREAM_RUN = [
    "--task", "text-classification", *COLUMNS, "--nproc_per_node", "2",
    "--streaming", "true", "--shuffle_buffer_size", "8", "--deepspeed", "zero2",
    "--max_steps", str(MAX_STEPS), "--per_device_train_batch_size", "5",
    "--save_steps", "4", "--save_total_limit", "2", "--logging_steps", "4",
    "--eval_strategy", "no", "--eval_split_name", "", "--max_seq_length", "16",
    "--learning_rate", "3e-3", "--seed", "7", "--ddp_timeout", "60", "--output_dir", "out",
]  # fmt: skip


def audit(directory: Path, up_to_step: int | None = None) -> dict[int, list[str]]:
    """rank -> keys it trained on, in order (only steps <= up_to_step)."""
    consumed = {}
    for path in sorted(directory.glob("rank-*.txt")):
        rank = int(path.stem.split("-")[1])
        lines = [line.split() for line in path.read_text().splitlines()]
        consumed[rank] = [
            (int(step), key) for step, key in lines if up_to_step is None or int(step) <= up_to_step
        ]
    return consumed


def assert_every_epoch_sees_every_example_once(consumed: dict[int, list], epochs: int) -> None:
    assert sorted(consumed) == [0, 1, 2, 3], "one audit per process"
    for epoch in range(epochs):
        steps = range(epoch * STEPS_PER_EPOCH + 1, (epoch + 1) * STEPS_PER_EPOCH + 1)
        seen = Counter(key for lines in consumed.values() for step, key in lines if step in steps)
        missing = {f"train/{i}" for i in range(TRAIN_ROWS)} - set(seen)
        repeated = [key for key, count in seen.items() if count > 1]
        assert not missing and not repeated, f"epoch {epoch}: gaps {missing}, repeats {repeated}"


def written_bytes(root: Path, skip: set[str]) -> int:
    return sum(
        path.stat().st_size
        for path in root.rglob("*")
        if path.is_file() and not skip & set(path.relative_to(root).parts)
    )


READ_WHOLE_SPLIT = """
import sys
from trainer.data.shard_index import read_index
from trainer.storage.store import open_store
from trainer.data.shard_reader import shard_split

uri = sys.argv[1]
stream = shard_split(uri, read_index(open_store(uri)), "train", streaming=True)
print(sum(example["audio"].get_all_samples().data.numel() > 0 for example in stream))
"""


@pytest.mark.parametrize("shard_format", FORMATS)
def test_streaming_from_cloud_storage_writes_no_shard_to_local_disk(
    demo_assets, tmp_path, gcs, shard_format
):
    """A process that streams (and decodes) a whole gs:// shard set, eight or more shards
    and over six times the size of its largest one, leaves its cache, temporary and working
    directories as they were: Parquet row groups and tar members are read through the
    store, never saved."""

    uri = f"gs://{BUCKET}/{uuid.uuid4().hex}/speech"
    source = few_clips(demo_assets, tmp_path / "speech", per_split=24)
    env = trainer_env(tmp_path / "cache", STORAGE_EMULATOR_HOST=gcs)
    make_shards(source, uri, "--task", "speech-recognition", "--text_column_name",
                "transcription", "--shard_size_mb", "0.2", "--format", shard_format)  # fmt: skip
    index = read_index(open_store(uri))
    train = index.splits["train"]
    largest, corpus = max(s.bytes for s in train), sum(s.bytes for s in train)
    assert len(train) >= 8 and corpus > 6 * largest

    scratch = tmp_path / "scratch"
    folders = {name: scratch / name for name in ("hf", "tmp", "cache", "xdg", "work")}
    for folder in folders.values():
        folder.mkdir(parents=True)
    reader = {**env, "TRAINER_CACHE_DIR": str(folders["cache"]), "TMPDIR": str(folders["tmp"]),
              "HF_HOME": str(folders["hf"]), "HF_DATASETS_CACHE": str(folders["hf"] / "datasets"),
              "XDG_CACHE_HOME": str(folders["xdg"])}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", READ_WHOLE_SPLIT, uri], cwd=folders["work"],
                          env=reader, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.split()[-1]) == index.rows("train"), "every clip read and decoded"
    on_disk = written_bytes(scratch, set())
    print(f"{shard_format}: {corpus} bytes in {len(train)} shards streamed; {on_disk} bytes "
          "written to local disk")  # fmt: skip
    assert on_disk < largest, f"{on_disk} bytes written while streaming {corpus}"


@pytest.mark.slow
def test_streaming_run_killed_and_resumed_sees_each_example_once_per_epoch(
    tmp_path, gcs, text_model
):
    """The kill-and-resume test of tests/test_resume.py, streaming from Cloud Storage."""
    from trainer.storage.checkpoints import complete_checkpoints

    job = f"gs://{BUCKET}/{uuid.uuid4().hex}"
    env = {"STORAGE_EMULATOR_HOST": gcs}
    index = make_sentiment_shards(tmp_path, f"{job}/shards", 0.00097)
    assert [shard.rows for shard in index.splits["train"]] == [15] * 4
    corpus = sum(shard.bytes for shards in index.splits.values() for shard in shards)
    largest = max(shard.bytes for shards in index.splits.values() for shard in shards)

    def run(name: str, base: str, **more):
        args = [*STREAM_RUN, "--dataset_name", f"{job}/shards",
                "--stream_audit_dir", str(tmp_path / f"audit-{name}")]  # fmt: skip
        scratch = tmp_path / f"scratch-{name}"
        return start_nodes(tmp_path / name, text_model, tmp_path / "sentiment", args, **env,
                           **vertex_outputs(base), HF_DATASETS_CACHE=str(scratch / "hf"),
                           TMPDIR=str(scratch / "tmp"), **more)  # fmt: skip

    # 1. Uninterrupted: every epoch covers the 60 examples once across the 4 processes,
    #    and nothing of the corpus is written to the nodes' disks.
    (tmp_path / "scratch-a" / "tmp").mkdir(parents=True)
    reference = f"{job}/uninterrupted"
    chief_log, _ = finish_all(run("a", reference))
    per_epoch = "60 examples per epoch (shard index; filters may drop some), 20 per optimizer"
    assert f"streaming train: {per_epoch} step: --max_steps {MAX_STEPS} is 10.00 epochs" in (
        chief_log
    )
    consumed = audit(tmp_path / "audit-a")
    assert all(len(lines) == MAX_STEPS * 5 for lines in consumed.values())
    assert_every_epoch_sees_every_example_once(consumed, MAX_STEPS // STEPS_PER_EPOCH)
    on_disk = (
        written_bytes(tmp_path / "scratch-a", set())
        + written_bytes(tmp_path / "a", {"out", "model-in", "data", "trainer.log"})
        + sum(written_bytes(tmp_path / "a" / f"cache{r}", set()) for r in (0, 1))
    )
    print(f"corpus {corpus} bytes in {len(index.splits['train'])} train shards; "
          f"written to the nodes' disks outside outputs: {on_disk} bytes")  # fmt: skip
    assert on_disk < 2 * largest, f"{on_disk} bytes of data written for a {corpus}-byte corpus"

    # 2. The same job; the worker node stalls after step 8 (a whole run takes seconds: a
    #    poll could miss checkpoint-8 between its upload and its rotation, or the kill
    #    come after the last step) and is killed once checkpoint-8 is complete.
    base = f"{job}/interrupted"
    (tmp_path / "scratch-b" / "tmp").mkdir(parents=True)
    checkpoints = open_store(f"{base}/checkpoints")
    stall = with_start_hook({"PYTHONPATH": str(REPO_ROOT)}, tmp_path / "hooks",
                            node_stalls_after(1, 8))  # fmt: skip
    nodes = run("b", base, **stall)
    wait_while_running(nodes, lambda: "checkpoint-8" in complete_checkpoints(checkpoints), 400,
                       "checkpoint-8 in the store")  # fmt: skip
    nodes[1].kill_node()
    code, chief_log = nodes[0].finish(timeout=300)
    assert code != 0, "the chief must fail when its peer dies"
    errors = [line for line in chief_log.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].endswith(
        f"the newest complete checkpoint is {base}/checkpoints/checkpoint-8, where a restart "
        "resumes"
    ), chief_log[-3000:]
    newest = complete_checkpoints(checkpoints)[-1]
    resumed_step = int(newest.split("-")[1])
    assert resumed_step < MAX_STEPS, "the kill came after the run finished"
    stored = checkpoints.child(newest).list_files()
    assert "stream-state/rank-3.json" in stored, "stream positions not in the checkpoint"

    # 3. Restart on fresh machines: resumes in the stream where the checkpoint was taken.
    (tmp_path / "scratch-c" / "tmp").mkdir(parents=True)
    chief_log, _ = finish_all(run("c", base))
    assert f"resuming from out/{newest}" in chief_log
    before, after = audit(tmp_path / "audit-b", resumed_step), audit(tmp_path / "audit-c")
    assert min(step for lines in after.values() for step, _ in lines) == resumed_step + 1
    joined = {rank: before[rank] + after[rank] for rank in before}
    assert joined == consumed, "the resumed run did not train on what the uninterrupted one did"
    assert_every_epoch_sees_every_example_once(joined, MAX_STEPS // STEPS_PER_EPOCH)

    expected, resumed = final_weights(reference, tmp_path), final_weights(base, tmp_path)
    worst = max((expected[k] - resumed[k]).abs().max().item() for k in expected)
    print(f"resumed from {newest} (mid-epoch {resumed_step / STEPS_PER_EPOCH:.2f}); "
          f"max |weight difference| vs uninterrupted: {worst:.3g}")  # fmt: skip
    assert worst < 1e-5, worst


@pytest.fixture(scope="module")
def text_model(tmp_path_factory) -> Path:
    from tests.support.tiny_assets import build_tiny_bert, sentiment_sentences

    root = tmp_path_factory.mktemp("bert")
    build_tiny_bert(root / "bert", [text for rows in sentiment_sentences().values()
                                    for text, _ in rows])  # fmt: skip
    return root / "bert"


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


@pytest.mark.slow
def test_whisper_trains_from_shards_in_cloud_storage(tmp_path, spoken_assets, gcs):
    """The speech task through `python -m trainer`: train+test streamed from the bucket by
    two processes, each reading its own examples, and the final evaluation from the same
    shard set's test split (map-style)."""

    uri = f"gs://{BUCKET}/{uuid.uuid4().hex}/speech"
    env = trainer_env(tmp_path / "cache", STORAGE_EMULATOR_HOST=gcs)
    done = subprocess.run(
        [sys.executable, "-m", "trainer.shards", str(spoken_assets.dataset_dir), uri,
         "--task", "speech-recognition", "--text_column_name", "transcription",
         "--shard_size_mb", "0.2"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    audit_dir = tmp_path / "audit"
    code, output = run_trainer(
        ["--nproc_per_node", "2", "--model_name_or_path", str(spoken_assets.model_dir),
         "--dataset_name", uri, *DEMO_SPEECH_FLAGS, "--streaming", "true",
         "--train_split_name", "train+test", "--max_steps", "3",
         "--per_device_train_batch_size", "4", "--save_strategy", "no",
         "--eval_strategy", "no", "--do_eval", "true", "--max_eval_samples", "4",
         "--generation_max_length", "4",
         "--stream_audit_dir", str(audit_dir), "--output_dir", "out"],
        cwd=tmp_path, env=env,
    )  # fmt: skip
    assert code == 0, output[-3000:]
    consumed = audit(audit_dir)
    keys = [key for lines in consumed.values() for _, key in lines]
    assert sorted(consumed) == [0, 1] and len(keys) == 2 * 3 * 4 == len(set(keys)), consumed
    assert "eval_wer" in (tmp_path / "out" / "eval_results.json").read_text()
