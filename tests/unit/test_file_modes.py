"""What the project writes locally is readable by every user (trainer/storage/file_modes.py):
the delivered model and each checkpoint as the real Trainer saves them (safetensors writes
its files 0600), copies in a local store whatever the umask, the test predictions. The
serving image's server runs as uid 10001 and reads a model root saved only this way."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest
from transformers import Trainer

from tests.support.tiny_regression import Regression, regression_arguments, regression_rows
from trainer.storage.file_modes import make_readable
from trainer.storage.store import open_store
from trainer.training.callbacks import CheckpointSyncCallback
from trainer.training.delivery import FINAL_MODEL_DIRNAME, deliver_model
from trainer.training.distributed import ProcessPlace


def modes(root: Path) -> dict[str, str]:
    """Every entry below `root` (and `root`), by relative path: its mode in octal."""
    found = {".": oct(stat.S_IMODE(root.stat().st_mode))}
    for path in sorted(root.rglob("*")):
        found[str(path.relative_to(root))] = oct(stat.S_IMODE(path.lstat().st_mode))
    return found


def readable_by_all(root: Path) -> dict[str, str]:
    """What `modes` should be: folders 0755, files 0644."""
    return {name: "0o755" if (root / name).is_dir() else "0o644" for name in modes(root)}


@pytest.fixture
def trained(tmp_path) -> Trainer:
    """A real Trainer after one step, which saved checkpoint-1 with the callback that hands
    each checkpoint on (no uploader: a local run)."""
    args = regression_arguments(tmp_path / "out", 1, save_strategy="steps", save_steps=1)
    trainer = Trainer(model=Regression(), args=args, train_dataset=regression_rows(4),
                      callbacks=[CheckpointSyncCallback(None)])  # fmt: skip
    trainer.train()
    return trainer


def test_safetensors_alone_writes_what_only_its_owner_reads(tmp_path):
    """Why the project sets modes at all: the library's own choice, seen here."""
    import torch
    from safetensors.torch import save_file

    save_file({"weight": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    assert oct(stat.S_IMODE((tmp_path / "model.safetensors").stat().st_mode)) == "0o600"


def test_each_checkpoint_is_readable_by_every_user(trained):
    checkpoint = Path(trained.args.output_dir) / "checkpoint-1"
    assert (checkpoint / "model.safetensors").is_file()
    assert modes(checkpoint) == readable_by_all(checkpoint)


@pytest.mark.parametrize("where", ["in the output dir", "elsewhere"])
def test_the_delivered_model_is_readable_by_every_user(trained, tmp_path, where):
    """The project's delivery path, with the real Trainer's save: the model where it is
    saved, and its copy when the model location is another local folder."""
    final_dir = Path(trained.args.output_dir) / FINAL_MODEL_DIRNAME
    destination = final_dir if where == "in the output dir" else tmp_path / "delivered"
    run = SimpleNamespace(
        trainer=trained,
        place=ProcessPlace(node_rank=0, num_nodes=1, is_local_main=True, is_global_main=True),
        config=SimpleNamespace(locations=SimpleNamespace(
            model=str(destination), checkpoints=str(tmp_path / "checkpoints"))),
        task=SimpleNamespace(model_args=SimpleNamespace(peft="none", save_adapter_only=False)),
    )  # fmt: skip
    assert deliver_model(run) == str(destination)
    assert (destination / "manifest.json").is_file()
    for folder in {final_dir, destination}:
        assert (folder / "model.safetensors").is_file()
        assert modes(folder) == readable_by_all(folder), folder


def test_a_local_store_keeps_its_copies_readable_whatever_the_umask(tmp_path):
    source = tmp_path / "source"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "weights.bin").write_bytes(b"w")
    (source / "config.json").write_text("{}")
    store = tmp_path / "store"
    previous = os.umask(0o077)
    try:
        open_store(str(store)).upload(source)
    finally:
        os.umask(previous)
    assert modes(store / "sub") == {".": "0o755", "weights.bin": "0o644"}
    assert modes(store)["config.json"] == "0o644"


def test_a_link_is_left_as_it_is_and_its_target_too(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir(mode=0o700)
    (folder / "weights").write_bytes(b"w")
    os.chmod(folder / "weights", 0o600)
    outside = tmp_path / "outside"
    outside.write_text("")
    os.chmod(outside, 0o600)
    (folder / "link").symlink_to(outside)
    make_readable(folder)
    assert modes(folder)["."] == "0o755" and modes(folder)["weights"] == "0o644"
    assert oct(stat.S_IMODE(outside.stat().st_mode)) == "0o600", "the link's target unchanged"
