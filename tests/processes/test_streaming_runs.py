"""`--streaming true` in real processes: runs through `python -m trainer` on two simulated
nodes with two processes each, reading from the GCS emulator, killed and resumed at the
exact example; Whisper trained from shards in the bucket; and a reader process that leaves
no shard on local disk. What is checked in this process (division among processes and
loader workers, shuffles, resume positions, flags): tests/unit/test_streaming.py."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest

from tests.support.gcs_emulator import BUCKET
from tests.support.helpers import (
    DEMO_SPEECH_FLAGS,
    REPO_ROOT,
    few_clips,
    final_weights,
    finish_all,
    node_stalls_after,
    run_trainer,
    start_nodes,
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
from trainer.data.shard_index import read_index
from trainer.storage.store import open_store

# Two simulated nodes x two processes, ZeRO-2, the sentiment set as 4 shards of 15 in the
# GCS emulator: one shard per process per epoch, 5 examples per batch, so 3 steps are one
# epoch. 12 steps are 4 epochs, with checkpoints at steps 4, 8 and 12: the kill after
# checkpoint-8 lands in the third epoch (steps 7-9), and the resume trains the rest of
# it and the whole fourth, across an epoch boundary.
STEPS_PER_EPOCH = 3
MAX_STEPS = 12
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
    """The kill-and-resume test of tests/processes/test_resume.py, streaming from Cloud Storage."""
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
    epochs = f"--max_steps {MAX_STEPS} is {MAX_STEPS / STEPS_PER_EPOCH:.2f} epochs"
    assert f"streaming train: {per_epoch} step: {epochs}" in chief_log
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
    assert resumed_step % STEPS_PER_EPOCH, "the kill is to land mid-epoch"
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


@pytest.mark.slow
def test_whisper_trains_from_shards_in_cloud_storage(tmp_path, demo_assets, gcs):
    """The speech task through `python -m trainer`: train+test streamed from the bucket by
    two processes, each reading its own examples, and the final evaluation from the same
    shard set's test split (map-style). The 72 tone clips (`demo_assets`) are clips and
    transcripts as the demo's spoken set is; nothing here needs a model that learns."""

    uri = f"gs://{BUCKET}/{uuid.uuid4().hex}/speech"
    env = trainer_env(tmp_path / "cache", STORAGE_EMULATOR_HOST=gcs)
    done = subprocess.run(
        [sys.executable, "-m", "trainer.shards", str(demo_assets.dataset_dir), uri,
         "--task", "speech-recognition", "--text_column_name", "transcription",
         "--shard_size_mb", "0.2"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    audit_dir = tmp_path / "audit"
    code, output = run_trainer(
        ["--nproc_per_node", "2", "--model_name_or_path", str(demo_assets.model_dir),
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
