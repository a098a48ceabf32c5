"""Shared fixtures: offline demo assets, a way to run the real entrypoint, free ports."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from trainer.demo_assets import DemoAssets, prepare_demo_assets

REPO_ROOT = Path(__file__).resolve().parent.parent

PERSISTENT_EXTENSIONS_DIR = Path.home() / ".cache" / "vertex-trainer" / "torch_extensions"
"""DeepSpeed compiles a C++ op on first CPU use (~45 s); every test run reuses it."""


@pytest.fixture(scope="session")
def demo_cache(tmp_path_factory) -> Path:
    """A TRAINER_CACHE_DIR of this test session (the launcher builds demo assets in it)."""
    return tmp_path_factory.mktemp("trainer-cache")


@pytest.fixture(scope="session")
def demo_assets(demo_cache) -> DemoAssets:
    return prepare_demo_assets(demo_cache / "demo")


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


def start_trainer(args: list[str], cwd: Path, env: dict[str, str]) -> TrainerProcess:
    """Start `python -m trainer ARGS` exactly as a user (or the image's entrypoint) would.

    Output goes to `cwd/trainer.log`, not a pipe: with several nodes running, an undrained
    pipe blocks one node's prints and with it, through the collectives, every other node.
    """
    log = cwd / "trainer.log"
    with log.open("w") as handle:
        process = subprocess.Popen(
            [sys.executable, "-m", "trainer", *args],
            cwd=cwd,
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
    return TrainerProcess(process, log)


def run_trainer(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 600):
    return start_trainer(args, cwd, env).finish(timeout)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
