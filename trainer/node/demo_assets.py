"""A task's built-in demo assets (its spec's `demo`: a tiny model and a dataset made offline),
built once per node and reused: nodes share no disk, and a node's training processes, a second
demo run and a concurrent caller all find the same complete folders."""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from trainer.settings.run_config import DemoAssets
from trainer.tasks.task_spec import TaskSpec


def prepare_demo(spec: TaskSpec, assets: DemoAssets) -> DemoAssets:
    """Build (once, then reuse) the task's demo model and data into `assets`: each in a
    scratch folder renamed into place when complete, so an interrupted build (espeak-ng
    missing, a kill) is built again, not mistaken for a complete one; under a lock, so
    concurrent callers share one build."""
    build_model, build_dataset = spec.demo_builders()
    cache_dir = assets.model_dir.parent
    cache_dir.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(cache_dir / f".{spec.name}-demo.lock"):
        _build_once(assets.model_dir, build_model)
        _build_once(assets.dataset_dir, build_dataset)
    return assets


@contextmanager
def _exclusive_lock(lock_path: Path) -> Iterator[None]:
    """Serialise builders on one machine; the kernel releases the lock if a process dies."""
    with lock_path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build_once(target: Path, build: Callable[[Path], None]) -> None:
    """Build into a scratch sibling, then rename: an existing `target` is always complete."""
    if target.exists():
        return
    scratch = target.with_name(f".{target.name}.partial")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    build(scratch)
    os.replace(scratch, target)
