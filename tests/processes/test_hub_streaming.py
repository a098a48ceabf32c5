"""`--streaming true --dataset_name ORG/NAME`: a Hub dataset streamed by the real
`datasets` and `huggingface_hub` clients from a loopback Hub (tests/support/loopback_hub.py),
divided among processes exactly once, resumed at the exact example, and never copied whole
to the local disk.

The clients read `HF_ENDPOINT` and the offline switches when they are imported, and this
test session runs offline (tests/conftest.py), so the reading happens in a child Python
started with the online environment: `python -m tests.support.hub_stream_readers READER
MODEL OUT` (tests/support/hub_stream_readers.py) writes what it read as JSON.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.support.helpers import REPO_ROOT, run_trainer, trainer_env
from tests.support.hub_stream_readers import BUFFER, DATASET, FLAGS, SPEECH
from tests.support.loopback_hub import Repository, running_hub
from tests.support.sentiment_labels import SENTIMENTS

TRAIN_FILES, TEST_FILES = 4, 2
TRAIN_ROWS = 60
"""tiny_assets' sentiment set: 60 training sentences, 18 test sentences."""
SPEECH_CLIPS = {"train": (12, 2), "test": (4, 1)}
"""Split -> (clips of the demo speech set, Parquet files holding them)."""


def write_hub_repository(root: Path) -> Path:
    """The sentiment set as a Hub dataset repository: Parquet files named as `push_to_hub`
    names them (`data/SPLIT-0000K-of-0000N.parquet`, from which `datasets` infers the
    splits), a ClassLabel label column and a unique `__key__` per example."""
    import pyarrow.parquet as pq
    from datasets import ClassLabel, Dataset, Features, Value

    from tests.support.tiny_assets import sentiment_sentences

    features = Features({"__key__": Value("string"), "sentence": Value("string"),
                         "sentiment": ClassLabel(names=SENTIMENTS)})  # fmt: skip
    for split, rows in sentiment_sentences().items():
        columns = {"__key__": [f"{split}/{i}" for i in range(len(rows))],
                   "sentence": [text for text, _ in rows],
                   "sentiment": [SENTIMENTS.index(label) for _, label in rows]}  # fmt: skip
        table = Dataset.from_dict(columns, features=features).data.table
        files = TRAIN_FILES if split == "train" else TEST_FILES
        for k in range(files):
            part = table.slice(k * len(rows) // files, len(rows) // files)
            pq.write_table(part.cast(features.arrow_schema), data_file(root, split, k, files))
    (root / "README.md").write_text("# Sentiment\n\nShort financial sentences.\n")
    return root


def write_speech_repository(root: Path, dataset_dir: Path) -> Path:
    """The first clips of the demo speech set (an audiofolder) as `push_to_hub` writes an
    audio dataset such as Common Voice: Parquet files whose `audio` column (feature
    `Audio()`) holds each clip's bytes, beside its `transcription` and a unique `__key__`."""
    from datasets import Audio, Dataset, Features, Value

    from trainer.shards import write_parquet

    features = Features({"__key__": Value("string"), "audio": Audio(),
                         "transcription": Value("string")})  # fmt: skip
    for split, (clips, files) in SPEECH_CLIPS.items():
        with (dataset_dir / split / "metadata.csv").open(newline="") as handle:
            rows = list(csv.DictReader(handle))[:clips]
        columns = {"__key__": [f"{split}/clip{i}" for i in range(clips)],
                   "audio": [str(dataset_dir / split / row["file_name"]) for row in rows],
                   "transcription": [row["transcription"] for row in rows]}  # fmt: skip
        table = Dataset.from_dict(columns, features=features)
        for k in range(files):
            write_parquet(table.shard(files, k, contiguous=True), data_file(root, split, k, files))
    (root / "README.md").write_text("# Speech\n\nShort English sentences, spoken.\n")
    return root


def data_file(root: Path, split: str, k: int, files: int) -> Path:
    """Where `push_to_hub` puts part `k` of a split's `files` (`datasets` infers the split
    from the name)."""
    path = root / "data" / f"{split}-{k:05d}-of-{files:05d}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    repository = Repository.from_directory(write_hub_repository(tmp_path_factory.mktemp("repo")))
    with running_hub({DATASET: repository}) as server:
        yield server


@pytest.fixture(scope="module")
def text_model(tmp_path_factory) -> Path:
    from tests.support.tiny_assets import build_tiny_bert, sentiment_sentences

    root = tmp_path_factory.mktemp("bert")
    texts = [text for rows in sentiment_sentences().values() for text, _ in rows]
    build_tiny_bert(root / "bert", texts)
    return root / "bert"


def online_env(hub, scratch: Path) -> dict[str, str]:
    """A child's environment that asks the loopback Hub, with caches and temporary files
    of its own under `scratch` (so that what it writes can be measured)."""
    for name in ("home", "datasets", "tmp"):
        (scratch / name).mkdir(parents=True, exist_ok=True)
    return trainer_env(
        scratch / "trainer-cache", HF_ENDPOINT=hub.url, HF_HUB_OFFLINE="0",
        HF_DATASETS_OFFLINE="0", HF_HOME=str(scratch / "home"),
        HF_HUB_CACHE=str(scratch / "home" / "hub"),
        HF_DATASETS_CACHE=str(scratch / "datasets"), TMPDIR=str(scratch / "tmp"),
        OMP_NUM_THREADS="1",
    )  # fmt: skip


def read_in_child(hub, reader: str, model: Path, child: Path) -> tuple[dict, Path]:
    """What a child running tests/support/hub_stream_readers.py's READERS[reader] read from
    the Hub, and its scratch directory."""
    scratch, out = child / "scratch", child / "reads.json"
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.hub_stream_readers", reader, str(model), str(out)],
        cwd=REPO_ROOT, env=online_env(hub, scratch), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text()), scratch


@pytest.fixture(scope="module")
def hub_reads(hub, text_model, tmp_path_factory) -> tuple[dict, Path]:
    """What one child read from the Hub (see hub_stream_readers.read_from_hub), and its
    scratch directory."""
    return read_in_child(hub, "text", text_model, tmp_path_factory.mktemp("child"))


def test_the_clients_ask_only_routes_the_loopback_hub_serves(hub, hub_reads):
    assert set(hub.unknown) <= {"GET /api/agent-harnesses"}, hub.unknown


def test_four_ranks_read_every_hub_example_once_with_labels_from_its_class_label(hub_reads):
    """The stream of each of 4 ranks (RANK and WORLD_SIZE set in turn in one child process,
    as each training process sees them), and the labels from the ClassLabel feature."""
    reads, _ = hub_reads
    assert reads["labels"] == SENTIMENTS
    parts = reads["parts"]["3"]
    seen = Counter(key for part in parts for key in part)
    assert sorted(seen) == sorted(f"train/{i}" for i in range(TRAIN_ROWS))
    assert set(seen.values()) == {1}, f"repeated: {seen.most_common(3)}"
    assert [len(part) for part in parts] == [TRAIN_ROWS // 4] * 4, "one Parquet file each"


def test_the_hub_stream_shuffle_is_seeded_and_changes_with_the_epoch(hub_reads):
    reads, _ = hub_reads
    parts = reads["parts"]
    assert parts["3"] == parts["3 again"], "same seed, same order"
    assert parts["3"] != parts["4"], "another seed, another order"
    assert sorted(map(sorted, parts["3"])) == sorted(map(sorted, parts["4"]))
    epoch_one = reads["epoch 1 of rank 0"]
    assert epoch_one != parts["3"][0] and sorted(epoch_one) == sorted(parts["3"][0])


def test_loader_workers_split_a_process_part_of_the_hub_stream(hub_reads):
    reads, _ = hub_reads
    workers = reads["two loader workers, rank 1 of 2"]
    assert sorted(key for key, _ in workers) == sorted(reads["rank 1 of 2"])
    assert {worker for _, worker in workers} == {0, 1}, "both workers read"


def test_a_hub_stream_resumes_at_the_example_after_the_last_one_trained(hub_reads):
    resume = hub_reads[0]["resume"]
    assert resume["trained"] == {"epoch": 2, "consumed": {"0": 11}}
    assert resume["resumed"] == resume["whole"][11:]
    assert resume["next epoch after the resume"] == resume["next epoch"]


def test_the_evaluation_split_is_loaded_whole_from_its_own_files(hub_reads):
    assert hub_reads[0]["evaluation"] == sorted(f"test/{i}" for i in range(18))


def test_streaming_from_the_hub_copies_no_training_example_to_disk(hub, hub_reads):
    """No file the client wrote (caches, temporary files) holds a training example, while
    the evaluation split is in the cache; every Parquet file was read in byte ranges,
    none fetched whole into the Hub cache (`hf_hub_download` asks HEAD first)."""
    _, scratch = hub_reads
    assert_no_training_example_in(scratch)
    assert files_holding(scratch / "datasets", b"test/17"), "the evaluation split is cached"
    reads = [(method, byte_range) for method, path, byte_range in hub.requests
             if path.endswith(".parquet")]  # fmt: skip
    assert reads and all(method == "GET" and byte_range for method, byte_range in reads), reads


def files_holding(root: Path, content: bytes) -> list[Path]:
    return [path for path in root.rglob("*") if path.is_file() and content in path.read_bytes()]


def assert_no_training_example_in(root: Path) -> None:
    """No file under `root` is a Parquet file or holds a training example's `__key__`
    (Arrow files, as the `datasets` cache writes them, hold strings as they are)."""
    parquet = [path for path in root.rglob("*") if path.is_file()
               and path.read_bytes()[:4] == b"PAR1"]  # fmt: skip
    assert not parquet, f"data files written to disk: {parquet}"
    holding = files_holding(root, b"train/")
    assert not holding, f"training examples written to disk: {holding}"


def test_whisper_streams_a_hub_speech_dataset_divided_between_two_ranks(demo_assets, tmp_path):
    """Whisper fine-tuning streamed from a Hub speech dataset, as users stream Common
    Voice: each of two ranks (RANK and WORLD_SIZE set in turn in one child process) reads
    its own Parquet file's clips, decoded from the embedded bytes into Whisper batches, and
    the test split is evaluated at 16 kHz, while no training clip is written to disk.
    Two real training processes stream from the Hub in
    `test_two_processes_train_on_disjoint_hub_examples` (slow)."""
    repo = write_speech_repository(tmp_path / "repo", demo_assets.dataset_dir)
    with running_hub({SPEECH: Repository.from_directory(repo)}) as hub:
        reads, scratch = read_in_child(hub, "speech", demo_assets.model_dir, tmp_path)
    first, second = map(set, reads["parts"])
    assert not first & second, "both ranks read one clip"
    assert first | second == {f"train/clip{i}" for i in range(SPEECH_CLIPS["train"][0])}
    config = json.loads((demo_assets.model_dir / "config.json").read_text())
    mels, frames = config["num_mel_bins"], 2 * config["max_source_positions"]
    assert reads["input_features"] == [3, mels, frames] and reads["labels"][0] == 3
    assert reads["evaluation"] == {"examples": 4, "sampling rate": 16_000}
    assert_no_training_example_in(scratch)


@pytest.mark.slow
def test_two_processes_train_on_disjoint_hub_examples(hub, text_model, tmp_path):
    """`python -m trainer` with two processes streams the Hub dataset: the launcher's hub
    check asks the loopback Hub too, and the audit shows each process trained on its own
    examples."""
    audit_dir = tmp_path / "audit"
    code, output = run_trainer(
        [*FLAGS, "--model_name_or_path", str(text_model), "--nproc_per_node", "2",
         "--per_device_train_batch_size", "5", "--shuffle_buffer_size", str(BUFFER),
         "--eval_strategy", "no", "--do_eval", "true", "--save_strategy", "no",
         "--max_seq_length", "16", "--stream_audit_dir", str(audit_dir), "--output_dir", "out"],
        cwd=tmp_path, env=online_env(hub, tmp_path / "scratch"), timeout=300,
    )  # fmt: skip
    assert code == 0, output[-3000:]
    assert "labels from split train of org/sentiment: 0 negative, 1 neutral, 2 positive" in output
    consumed = {path.name: path.read_text().split() for path in audit_dir.glob("rank-*.txt")}
    keys = {name: set(words[1::2]) for name, words in consumed.items()}
    assert sorted(keys) == ["rank-0.txt", "rank-1.txt"]
    assert all(len(part) == 2 * 5 for part in keys.values()), consumed
    assert not keys["rank-0.txt"] & keys["rank-1.txt"], "both processes trained on one example"
    assert all(key.startswith("train/") for part in keys.values() for key in part)
    assert "on 18 eval examples" in output
    assert_no_training_example_in(tmp_path / "scratch")
