"""A model file the server's user may not open is named as unreadable, not missing: the check
runs in a process that file modes bind (tests/support/unreadable_files.py)."""

from __future__ import annotations

import os

from tests.support.unreadable_files import PREFIX, model_folder, run_python


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
        "from trainer.tasks.load_failure import load_failure_line\n"
        "print(load_failure_line(ValueError('whatever transformers said'), sys.argv[1]))\n"
    )
    line = run_python(code, str(folder)).stdout.strip()
    assert line.startswith(f"cannot read {folder}/model.safetensors: permission denied "
                           "(and 1 more of its files); ")  # fmt: skip
