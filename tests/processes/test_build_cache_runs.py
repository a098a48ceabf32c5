"""DeepSpeed's compiled-op cache, across processes: a build lock left by a killed build is
removed while one a live build holds stays, and two Python environments get two op folders."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.helpers import REPO_ROOT
from trainer.common.cache import clear_orphaned_build_locks, torch_extensions_dir


def test_a_build_lock_a_killed_build_left_is_removed_and_one_in_use_stays(tmp_path):
    """torch's own FileBaton takes the locks, in processes that are then killed or keep
    building: only the lock no process holds goes, whatever its age."""
    killed, building = tmp_path / "deepspeed_shm_comm" / "lock", tmp_path / "other_op" / "lock"
    take_lock = (
        "from torch.utils.file_baton import FileBaton; import sys, time; "
        "FileBaton(sys.argv[1]).try_acquire(); print('held', flush=True); time.sleep(600)"
    )
    builders = []
    for lock in (killed, building):
        lock.parent.mkdir()
        builder = subprocess.Popen([sys.executable, "-c", take_lock, str(lock)],
                                   stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert builder.stdout.readline() == "held\n"
        builders.append(builder)
    builders[0].kill()
    builders[0].wait()
    try:
        assert clear_orphaned_build_locks(tmp_path) == [killed]
        assert not killed.exists() and building.exists(), "a build in progress keeps its lock"
    finally:
        builders[1].kill()
        builders[1].wait()
    assert clear_orphaned_build_locks(tmp_path) == [building]


def test_the_op_cache_is_keyed_by_what_it_is_built_from(tmp_path):
    """Two environments on one machine get two op directories (each would rebuild a shared
    one in turn); TORCH_EXTENSIONS_DIR, when set, is used as given."""
    import torch

    keyed = torch_extensions_dir({}, tmp_path)
    assert keyed.parent == tmp_path / "torch_extensions"
    assert keyed.name.startswith(
        f"py{sys.version_info[0]}.{sys.version_info[1]}-torch{torch.__version__}-ds"
    )
    elsewhere = (
        "import sys; sys.prefix = '/another/venv'; "
        "from trainer.common.cache import build_key; print(build_key())"
    )
    other = subprocess.run([sys.executable, "-c", elsewhere], capture_output=True, text=True,
                           check=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                           ).stdout.strip()  # fmt: skip
    assert other != keyed.name and other.rsplit("-", 1)[0] == keyed.name.rsplit("-", 1)[0]
    assert torch_extensions_dir({"TORCH_EXTENSIONS_DIR": "/x/ops"}, tmp_path) == Path("/x/ops")
