"""The one line a model that did not load gets (trainer/tasks/load_failure.py): the model
folder's own problem when it has one (no config.json, a damaged safetensors header), else the
error cut to the exception that ended its tracebacks; never more than one line of 300
characters with the server's prefix. A file this process may not open:
tests/processes/test_load_failure_runs.py; the server itself on such a model:
tests/processes/test_serve_runs.py."""

from __future__ import annotations

import pytest

from tests.support.unreadable_files import PREFIX, model_folder
from trainer.tasks.load_failure import MAX_CHARS, load_failure_line


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
