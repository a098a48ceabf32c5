"""This machine's cache: demo assets, compiled DeepSpeed ops, datasets fetched from GCS.

It survives runs (so DeepSpeed's CPU op is compiled once and a dataset is fetched once per
machine) and is never shared between nodes.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
from collections.abc import Mapping
from pathlib import Path


def cache_dir(env: Mapping[str, str] = os.environ) -> Path:
    if "TRAINER_CACHE_DIR" in env:
        return Path(env["TRAINER_CACHE_DIR"])
    base = env.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "vertex-trainer"


def torch_extensions_dir(env: Mapping[str, str], cache: Path) -> Path:
    """Where DeepSpeed's compiled CPU op lives: `TORCH_EXTENSIONS_DIR` if set, else `cache`'s
    `torch_extensions/<build key>`. The launcher, `trainer.build_cpu_ops` and the tests use this
    one rule, so the op compiled at install time is the one the first run finds.

    The key names what the op is built from (`build_key`): torch rebuilds an op whose sources
    or flags changed, and two virtual environments on one machine (their include paths
    differ) would otherwise rebuild one shared op in turn, minutes each."""
    if env.get("TORCH_EXTENSIONS_DIR"):
        return Path(env["TORCH_EXTENSIONS_DIR"])
    return cache / "torch_extensions" / build_key()


def build_key() -> str:
    """Python, torch and DeepSpeed versions and this environment's prefix, read without
    importing torch: `py3.11-torch2.13.0+cpu-ds0.19.0-1a2b3c4d`."""
    from importlib.metadata import PackageNotFoundError, version

    def installed(package: str) -> str:
        try:
            return version(package)
        except PackageNotFoundError:
            return "none"

    prefix = hashlib.sha256(sys.prefix.encode()).hexdigest()[:8]
    python = ".".join(map(str, sys.version_info[:2]))
    return f"py{python}-torch{installed('torch')}-ds{installed('deepspeed')}-{prefix}"


def clear_orphaned_build_locks(extensions_dir: Path) -> list[Path]:
    """Delete the torch extension build locks no process holds; return what was deleted.

    torch's build lock (`torch.utils.file_baton.FileBaton`) is a file its builder creates and
    keeps open until the build ends, and every other builder waits for it to go, for ever. A
    build that was killed leaves it behind, held by no one: every later run would sit at its
    rendezvous line with no output. A lock some process still has open is a build in
    progress, however long it takes (minutes on a loaded machine), and stays."""
    locks = sorted(extensions_dir.glob("*/lock"))
    if not locks:
        return []
    held = files_held_open()
    orphaned = [lock for lock in locks if str(lock.resolve()) not in held]
    for lock in orphaned:
        lock.unlink(missing_ok=True)
    return orphaned


def files_held_open() -> set[str]:
    """The paths this machine's processes (those this user may inspect) have open, from
    /proc: a container runs the builds as the launcher's own user."""
    held = set()
    for descriptors in Path("/proc").glob("[0-9]*/fd"):
        with contextlib.suppress(OSError):  # a process gone meanwhile, or not ours
            for descriptor in descriptors.iterdir():
                with contextlib.suppress(OSError):
                    held.add(os.readlink(descriptor))
    return held
