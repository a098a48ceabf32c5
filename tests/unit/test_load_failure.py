"""The one line a model that did not load gets (trainer/serve/load_failure.py): the model
folder's own problem when it has one (a file this process cannot open, no config.json, a
damaged safetensors header), else the error cut to the exception that ended its tracebacks;
never more than one line of 300 characters with the server's prefix.

A file this process may not open is made for real: mode 000, and, when the tests run as root
(which reads any file), the check runs in a process without the capabilities that let root
do so (setpriv), so the kernel refuses it as it refuses the serving image's user. The server
itself on such a model: tests/processes/test_serve_runs.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from safetensors.numpy import save_file

from tests.support.helpers import REPO_ROOT
from trainer.serve.load_failure import MAX_CHARS, load_failure_line

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


def test_a_weights_file_the_server_cannot_open_is_named_as_unreadable_not_missing(tmp_path):
    """What the server prints when the model is a root-saved one it may not read: today's
    safetensors says "No such file or directory" for it. The server's own reporting
    (ModelState), with the error safetensors raises opening that file, unprivileged."""
    folder = model_folder(tmp_path / "model")
    os.chmod(folder / "model.safetensors", 0)
    code = (
        "import sys\n"
        "from safetensors import safe_open\n"
        "from trainer.serve.app import ModelState\n"
        "folder = sys.argv[1]\n"
        "ModelState(lambda: safe_open(folder + '/model.safetensors', 'np'), folder).load()\n"
    )
    result = run_python(code, str(folder))
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and len(lines[0]) <= 300, result.stderr
    assert lines[0].startswith(
        f"{PREFIX}cannot read {folder}/model.safetensors: permission denied; this process "
        "runs as uid "
    ), lines[0]
    assert "chmod -R a+rX" in lines[0]


def test_every_unreadable_file_is_counted_and_the_first_named(tmp_path):
    folder = model_folder(tmp_path / "model")
    (folder / "tokenizer.json").write_text("{}")
    for name in ("model.safetensors", "tokenizer.json"):
        os.chmod(folder / name, 0)
    code = (
        "import sys\n"
        "from trainer.serve.load_failure import load_failure_line\n"
        "print(load_failure_line(ValueError('whatever transformers said'), sys.argv[1]))\n"
    )
    line = run_python(code, str(folder)).stdout.strip()
    assert line.startswith(f"cannot read {folder}/model.safetensors: permission denied "
                           "(and 1 more of its files); ")  # fmt: skip


@pytest.mark.parametrize(
    ("damage", "wanted"),
    [
        ("missing", "{folder} does not exist"),
        ("a file", "{folder} is not a folder"),
        ("no config", "{folder} holds no config.json"),
        (
            "config not JSON",
            "{folder}/config.json is not JSON (Expecting value: line 1 column 1 (char 0))",
        ),  # fmt: skip
        ("short weights", "{folder}/model.safetensors is damaged: 3 bytes, shorter than a header"),
        (
            "truncated weights",
            "{folder}/model.safetensors is damaged: truncated: its tensors "
            "need 136 bytes, it holds 100",
        ),  # fmt: skip
    ],
)
def test_what_is_wrong_with_the_folder_is_the_line(tmp_path, damage, wanted):
    folder = tmp_path / "model"
    if damage == "a file":
        folder.write_text("")
    elif damage != "missing":
        model_folder(folder)
    if damage == "no config":
        (folder / "config.json").unlink()
    if damage == "config not JSON":
        (folder / "config.json").write_text("")
    if damage == "short weights":
        (folder / "model.safetensors").write_bytes(b"abc")
    if damage == "truncated weights":
        whole = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes(whole[:100])
    line = load_failure_line(ValueError("a hundred lines\nof tracebacks"), folder)
    assert line == wanted.format(folder=folder)


def pipeline_error(folder) -> ValueError:
    """The shape of transformers' pipeline error: a headline, then each model class tried
    with its traceback, the model's own class last."""
    tried = []
    for kind, message in [
        ("AutoModelForCTC", "ValueError: Unrecognized configuration class for AutoModelForCTC."),
        ("WhisperForConditionalGeneration",
         f"OSError: Error no file named model.safetensors found in directory {folder}."),
    ]:  # fmt: skip
        tried.append(
            f"while loading with {kind}, an error is thrown:\nTraceback (most recent call "
            f'last):\n  File "base.py", line 246, in load_model\n    model = '
            f"model_class.from_pretrained(model, **kwargs)\n{message}\n"
        )
    return ValueError(
        f"Could not load model {folder} with any of the following classes: ("
        + ", ".join(f"<class 'transformers.models.auto.{n}'>" for n in "ABCD")
        + "). See the original errors:\n\n"
        + "\n".join(tried)
    )


def test_a_folder_with_nothing_wrong_gets_the_errors_last_exception_first(tmp_path):
    folder = model_folder(tmp_path / "model")
    line = load_failure_line(pipeline_error(folder), folder)
    assert line.startswith(
        f"OSError: Error no file named model.safetensors found in directory {folder}. "
        "(ValueError: Could not load model "
    )
    assert len(line) <= MAX_CHARS and len(PREFIX) + MAX_CHARS <= 300
    assert line.endswith("...") and "\n" not in line


def test_a_downloaded_model_has_no_folder_to_look_into():
    assert load_failure_line(OSError("model.safetensors is truncated"), None) == (
        "OSError: model.safetensors is truncated"
    )
