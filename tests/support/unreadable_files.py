"""Model folders whose files this process may not read, made for real: mode 000 and, when the
tests run as root (which reads any file), a process without the capabilities that let root do
so (setpriv), so the kernel refuses it as it refuses the serving image's user."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from safetensors.numpy import save_file

from tests.support.helpers import REPO_ROOT

PREFIX = "error: the model did not load: "

WITHOUT_ROOTS_READ = [
    "setpriv",
    "--inh-caps=-dac_override,-dac_read_search",
    "--bounding-set=-dac_override,-dac_read_search",
]
"""Root without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH: file modes apply to it too."""


def unprivileged(argv: list[str]) -> list[str]:
    """`argv` run so that a file's mode bits decide whether it can be opened."""
    if os.geteuid() != 0:
        return argv
    assert shutil.which("setpriv"), "running as root needs setpriv (util-linux) to drop caps"
    return WITHOUT_ROOTS_READ + argv


def model_folder(path, weights: bytes | None = None):
    """A small model folder: config.json and a real safetensors file (or `weights`)."""
    import numpy as np

    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    save_file({"weight": np.zeros((4, 4), dtype=np.float32)}, str(path / "model.safetensors"))
    if weights is not None:
        (path / "model.safetensors").write_bytes(weights)
    return path


def run_python(code: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(unprivileged([sys.executable, "-c", code, *args]), env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
