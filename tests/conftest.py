"""Shared fixtures: offline demo assets, a way to run the real entrypoint, free ports."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from trainer.common.cache import cache_dir, torch_extensions_dir
from trainer.config import recipes as config_file
from trainer.config.demo import DemoAssets
from trainer.data.sources import looks_like_path
from trainer.launcher.demo_assets import prepare_demo_assets

REPO_ROOT = Path(__file__).resolve().parent.parent

PERSISTENT_EXTENSIONS_DIR = torch_extensions_dir(os.environ, cache_dir())
"""DeepSpeed compiles a C++ op on first CPU use (~45 s); every test run reuses it."""


@pytest.fixture(scope="session", autouse=True)
def offline_hub_cache(tmp_path_factory) -> Path:
    """Tests never reach the Hugging Face Hub: HF_HUB_OFFLINE=1 for this process and every
    process it starts, and a hub cache holding a snapshot of each Hub id the shipped recipes
    name, as on a machine that downloaded them, so the launcher's hub check passes offline.
    """
    cache = tmp_path_factory.mktemp("hf-hub-cache")
    for recipe in config_file.RECIPES_DIR.glob("*.yaml"):
        content = yaml.safe_load(recipe.read_text()) or {}
        for kind, flag in (("model", "model_name_or_path"), ("dataset", "dataset_name")):
            if content.get(flag) and not looks_like_path(content[flag]):
                warm_hub_cache(cache, kind, content[flag])
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setenv("HF_HUB_CACHE", str(cache))
        yield cache


def warm_hub_cache(cache: Path, kind: str, repo_id: str) -> None:
    """Lay out one cached snapshot the way huggingface_hub stores it."""
    revision = "0" * 40
    repo = cache / f"{kind}s--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True, exist_ok=True)
    (snapshot / ("config.json" if kind == "model" else "README.md")).write_text("{}")


@pytest.fixture(scope="session")
def demo_cache(tmp_path_factory) -> Path:
    """A TRAINER_CACHE_DIR of this test session (the launcher builds demo assets in it)."""
    return tmp_path_factory.mktemp("trainer-cache")


@pytest.fixture(scope="session")
def demo_assets(demo_cache) -> DemoAssets:
    return prepare_demo_assets(demo_cache / "demo")


@pytest.fixture(scope="session")
def family_checkpoints(tmp_path_factory):
    """Whisper family name -> its tiny checkpoint (tests/whisper_families.py), built once."""
    from tests.whisper_families import FAMILIES, build_family_checkpoint

    built = {}

    def checkpoint(name: str) -> Path:
        if name not in built:
            folder = tmp_path_factory.mktemp("whisper") / name
            built[name] = build_family_checkpoint(FAMILIES[name], folder)
        return built[name]

    return checkpoint


COMMON_VOICE_COLUMNS = ["client_id", "path", "sentence", "up_votes", "down_votes", "age",
                        "gender", "accents", "locale", "segment"]  # fmt: skip


@pytest.fixture(scope="session")
def common_voice_dir(demo_assets, tmp_path_factory):
    """A Common Voice-style copy of the demo speech: 48 kHz MP3 clips and TSV splits.

    Sentences get quotes and an apostrophe, which Common Voice has and csv quoting breaks.
    """
    root = tmp_path_factory.mktemp("common-voice")
    (root / "clips").mkdir()
    splits = {"train": "train", "dev": "test", "test": "test"}
    jobs = []
    for tsv, source in splits.items():
        with (demo_assets.dataset_dir / source / "metadata.csv").open() as handle:
            rows = list(csv.DictReader(handle))
        with (root / f"{tsv}.tsv").open("w") as out:
            out.write("\t".join(COMMON_VOICE_COLUMNS) + "\n")
            for i, row in enumerate(rows[:6]):
                clip = f"common_voice_en_{tsv}_{i}.mp3"
                sentence = f'"{row["transcription"]}," she said, it\'s fine'
                values = ["c1", clip, sentence, "2", "0", "", "", "", "en", ""]
                out.write("\t".join(values) + "\n")
                jobs.append(
                    (demo_assets.dataset_dir / source / row["file_name"], root / "clips" / clip)
                )

    def to_mp3(job):
        wav, mp3 = job
        subprocess.run(
            ["ffmpeg", "-loglevel", "error", "-i", str(wav), "-ar", "48000", str(mp3)], check=True
        )

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(to_mp3, jobs))
    return root


def checked_task(task: str, model_dir: Path, dataset_dir: Path, *extra: str):
    """The task object as the launcher builds it from flags, its input checks passed."""
    from trainer.config.flags import parse_flags

    flags = parse_flags(
        ["--task", task, "--model_name_or_path", str(model_dir),
         "--dataset_name", str(dataset_dir), *extra]
    )  # fmt: skip
    flags.task.check_inputs()
    return flags.task


def trainer_env(cache_dir: Path, **extra: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("CLUSTER_SPEC", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }
    env.update(
        TRAINER_CACHE_DIR=str(cache_dir),
        TORCH_EXTENSIONS_DIR=str(PERSISTENT_EXTENSIONS_DIR),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        PYTHONPATH=str(REPO_ROOT),
    )
    env.update(extra)
    return env


@dataclass
class TrainerProcess:
    """A started `python -m trainer` and the file its output goes to."""

    process: subprocess.Popen
    log: Path

    def finish(self, timeout: float = 600) -> tuple[int, str]:
        """Wait for it (killing it on timeout); return its exit code and all it printed."""
        try:
            self.process.wait(timeout=timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
        return self.process.returncode, self.log.read_text()

    def terminate(self) -> None:
        """SIGTERM to the launcher alone, as a stopping container's main process gets it
        (torchrun, which the launcher becomes, passes it on to the training processes)."""
        self.process.send_signal(signal.SIGTERM)

    def kill_node(self) -> None:
        """SIGKILL the launcher and every process under it, as a dead machine would.

        torchrun starts each worker in its own session, so killing the launcher's process
        group is not enough: the whole process tree is collected first, then killed.
        """
        import psutil

        launcher = psutil.Process(self.process.pid)
        for process in [launcher, *launcher.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()


def start_trainer(
    args: list[str], cwd: Path, env: dict[str, str], log_name: str = "trainer.log"
) -> TrainerProcess:
    """Start `python -m trainer ARGS` exactly as a user (or the image's entrypoint) would.

    Output goes to `cwd/log_name`, not a pipe: with several nodes running, an undrained
    pipe blocks one node's prints and with it, through the collectives, every other node.
    """
    log = cwd / log_name
    with log.open("w") as handle:
        process = subprocess.Popen(
            [sys.executable, "-m", "trainer", *args],
            cwd=cwd,
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: a test can kill the whole node
        )
    return TrainerProcess(process, log)


DEMO_SPEECH_FLAGS = ["--text_column_name", "transcription", "--language", "en"]
"""What the demo's speech set needs when it is given as --dataset_name."""


def start_nodes(
    root: Path,
    model_dir: Path,
    dataset_dir: Path,
    args: list[str],
    num_nodes: int = 2,
    port: int | None = None,
    **env,
) -> list[TrainerProcess]:
    """Start one launcher per simulated Vertex AI node, as each replica would run it.

    The chief listens at 127.0.0.1 on `port` (a free one if not given); see `start_node`.
    """
    port = port or free_port()
    return [
        start_node(root, rank, num_nodes, port, model_dir, dataset_dir, args, **env)
        for rank in range(num_nodes)
    ]


def start_node(
    root: Path,
    rank: int,
    num_nodes: int,
    port: int,
    model_dir: Path,
    dataset_dir: Path,
    args: list[str],
    log_name: str = "trainer.log",
    **env,
) -> TrainerProcess:
    """Start node `rank` of a simulated Vertex AI job, as its replica would run.

    It gets a CLUSTER_SPEC for its pool and index (chief at 127.0.0.1:`port`), Vertex's
    node-level RANK/WORLD_SIZE, and its own directory `root/node{rank}` with its own copy
    of the model and data: nodes share no disk. One training process per node. Starting
    a node again in an existing directory is a restart on the same machine (its local
    files are still there); under a new `root` it is a fresh machine.
    """
    cluster = {"workerpool0": [f"127.0.0.1:{port}"],
               "workerpool1": [f"127.0.0.1:{port}"] * (num_nodes - 1)}  # fmt: skip
    pool, index = ("workerpool0", 0) if rank == 0 else ("workerpool1", rank - 1)
    node_dir = root / f"node{rank}"
    if not node_dir.exists():
        node_dir.mkdir(parents=True)
        shutil.copytree(model_dir, node_dir / "model-in")
        shutil.copytree(dataset_dir, node_dir / "data")
    spec = {"cluster": cluster, "environment": "cloud",
            "task": {"type": pool, "index": index, "trial": "1"}}  # fmt: skip
    node_env = trainer_env(root / f"cache{rank}", CLUSTER_SPEC=json.dumps(spec),
                           RANK=str(rank), WORLD_SIZE=str(num_nodes), **env)  # fmt: skip
    node_args = ["--model_name_or_path", str(node_dir / "model-in"),
                 "--dataset_name", str(node_dir / "data"), "--nproc_per_node", "1",
                 *args]  # fmt: skip
    return start_trainer(node_args, cwd=node_dir, env=node_env, log_name=log_name)


def run_trainer(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 600):
    return start_trainer(args, cwd, env).finish(timeout)


def use_delivered_model(task: str, model_dir: Path, item: str | Path) -> dict:
    """Use a saved model in a fresh interpreter with plain transformers, as its users will
    (tests/delivered_model.py); what came out, as a dict.

    One thread: torch's default (one per core) spins on a loaded 2-core machine, which
    made 20 generated tokens of the tiny model take 16 s instead of 0.2 s."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.delivered_model", task, str(model_dir), str(item)],
        cwd=REPO_ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def gcs_emulator():
    """A running Cloud Storage emulator (with bucket `test-bucket`) for this test session."""
    from tests.gcs_emulator import running_emulator

    with running_emulator() as url:
        yield url


@pytest.fixture
def gcs(gcs_emulator, monkeypatch):
    """Point this process's storage client at the emulator; yield the emulator URL."""
    from trainer.storage import store as storage

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator)
    storage._process_client.cache_clear()
    yield gcs_emulator
    storage._process_client.cache_clear()


def assert_manifest_matches_store(checkpoint) -> None:
    """A complete checkpoint's manifest lists exactly the files stored beside it."""
    from trainer.storage.checkpoints import MANIFEST, NODE_MARKERS, read_manifest

    listed = {entry.path for entry in read_manifest(checkpoint)}
    stored = {path for path in checkpoint.list_files()
              if path != MANIFEST and not path.startswith(f"{NODE_MARKERS}/")}  # fmt: skip
    assert listed == stored, f"{checkpoint.uri}: manifest and store disagree"
