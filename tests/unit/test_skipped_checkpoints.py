"""What a restart says when it passes over newer checkpoints (docs/restarts.md, "Checkpoints
a restart passes over"): one line naming each, why (the file that differs from the manifest,
a manifest that does not parse, no manifest at all), what it resumes from instead and the
steps trained again; a `warning:` when one is damaged. Each damage is made as a replay of
injected faults made it, in a local directory and in the GCS emulator: one file of the
newest checkpoint overwritten with other bytes of the same size (only its CRC32C tells), its
manifest cut mid-JSON. A storage error is never taken for damage. The real trainer prints
the same line from the same function (trainer/training/resume.py); a stop's incomplete
checkpoint in a real run: tests/processes/test_resume.py."""

from __future__ import annotations

import os
import uuid
from dataclasses import asdict
from pathlib import Path

import pytest

from tests.support.gcs_emulator import BUCKET, FlakyProxy
from trainer.common.errors import UserError
from trainer.storage import store as storage
from trainer.storage.checkpoints import MANIFEST, write_manifest
from trainer.storage.store import open_store
from trainer.training.failures import MAX_LINE, RunFailed
from trainer.training.resume import explicit_checkpoint, newest_readable_checkpoint

WEIGHTS = "model.safetensors"
VERTEX_CHECKPOINTS = (
    f"gs://{BUCKET}/aiplatform-custom-training-2026-11-28-12:00:00.000/checkpoints/"
)
"""A Vertex AI job's checkpoints (`baseOutputDirectory`/checkpoints/, 90 characters)."""


def location(kind: str, tmp_path: Path) -> str:
    if kind == "gs":
        return f"gs://{BUCKET}/{uuid.uuid4().hex}/checkpoints"
    return str(tmp_path / "bucket" / "checkpoints")


def save(checkpoints: str, step: int, made: Path, manifest: bool = True) -> None:
    """checkpoint-`step` in `checkpoints` as the uploader leaves it: its files, then (when
    complete) its manifest."""
    folder = made / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / WEIGHTS).write_bytes(os.urandom(3000))
    (folder / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
    store = open_store(checkpoints).child(folder.name)
    entries = store.upload(folder)
    if manifest:
        write_manifest(store, {"checkpoint": folder.name, "files": [asdict(e) for e in entries]})


def overwrite_same_size(checkpoints: str, name: str, path: str, made: Path) -> None:
    """Other bytes of the same size in place of a stored file: only its CRC32C differs."""
    store = open_store(checkpoints).child(name)
    size = store.list_files()[path].size
    (made / name / path).write_bytes(os.urandom(size))
    store._put(made / name, [path])
    assert store.list_files()[path].size == size


def truncate_manifest(checkpoints: str, name: str) -> None:
    store = open_store(checkpoints).child(name)
    whole = store.read_text(MANIFEST)
    store.write_text(MANIFEST, whole[: len(whole) // 2])  # mid-JSON


DAMAGES = {
    "overwritten": (
        lambda checkpoints, made: overwrite_same_size(checkpoints, "checkpoint-4", WEIGHTS, made),
        f"{WEIGHTS} differs from its manifest",
    ),
    "truncated": (
        lambda checkpoints, made: truncate_manifest(checkpoints, "checkpoint-4"),
        f"its {MANIFEST} does not parse",
    ),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
@pytest.mark.parametrize("kind", ["gs", "local"])
def test_a_damaged_newest_checkpoint_is_one_warning_naming_it_why_and_the_steps_trained_again(
    gcs, tmp_path, capsys, kind, damage
):
    """The issue's two damages, each in both stores: skipped for checkpoint-2 with one
    `warning:` line (before: the same words for both, no file named; the replay saw only the
    logger's lines), and nothing in the store deleted or repaired."""
    checkpoints = location(kind, tmp_path)
    for step in (2, 4):
        save(checkpoints, step, tmp_path / "made")
    spoil, why = DAMAGES[damage]
    spoil(checkpoints, tmp_path / "made")
    before = open_store(checkpoints).list_files()

    found = newest_readable_checkpoint(checkpoints, tmp_path / "out", say=True)

    assert found == tmp_path / "out" / "checkpoint-2"
    assert capsys.readouterr().out == (
        f"warning: checkpoint-4 in {checkpoints} is damaged ({why}) and skipped: resuming from "
        "checkpoint-2, so steps 3-4 are trained again\n"
    )
    assert open_store(checkpoints).list_files() == before
    assert newest_readable_checkpoint(checkpoints, tmp_path / "node1", say=False) is not None
    assert capsys.readouterr().out == "", "only the global main process says it"


def test_an_incomplete_newer_checkpoint_is_a_plain_line_naming_the_steps_trained_again(
    gcs, tmp_path, capsys
):
    """No manifest at all: an upload a stop (or a lost node) cut, which the protocol expects
    and the stop's own line announced. Not a `warning:`, but the steps it costs are said
    (before: nothing, only a logger line)."""
    checkpoints = location("gs", tmp_path)
    save(checkpoints, 4, tmp_path / "made")
    save(checkpoints, 6, tmp_path / "made", manifest=False)

    found = newest_readable_checkpoint(checkpoints, tmp_path / "out", say=True)

    assert found == tmp_path / "out" / "checkpoint-4"
    assert capsys.readouterr().out == (
        f"checkpoint-6 in {checkpoints} is incomplete (no {MANIFEST}: its upload did not "
        "finish) and skipped: resuming from checkpoint-4, so steps 5-6 are trained again\n"
    )


def test_many_skipped_checkpoints_are_one_warning_within_300_characters(gcs, tmp_path, capsys):
    """Damaged and incomplete ones together under Vertex AI's long location, none left to
    resume: one line, the location named once, two named with why, the rest counted."""
    checkpoints = VERTEX_CHECKPOINTS + uuid.uuid4().hex[:6]
    for step in (2, 4, 6):
        save(checkpoints, step, tmp_path / "made")
    save(checkpoints, 8, tmp_path / "made", manifest=False)
    overwrite_same_size(checkpoints, "checkpoint-2", WEIGHTS, tmp_path / "made")
    open_store(checkpoints).child("checkpoint-4").child("trainer_state.json").delete()
    truncate_manifest(checkpoints, "checkpoint-6")

    assert newest_readable_checkpoint(checkpoints, tmp_path / "out", say=True) is None

    line = capsys.readouterr().out.rstrip("\n")
    assert line == (
        f"warning: checkpoint-8, checkpoint-6 and 2 older in {checkpoints} are damaged or "
        f"incomplete (checkpoint-8: no {MANIFEST}: its upload did not finish) and skipped: "
        "starting from step 1, so steps 1-8 are trained again"
    ), "the second why left out whole: it does not fit"
    assert len(line.removeprefix("warning: ")) <= MAX_LINE, len(line)

    shorter = f"gs://{BUCKET}/{uuid.uuid4().hex[:6]}/checkpoints"
    for step in (6, 8):
        save(shorter, step, tmp_path / "shorter")
    truncate_manifest(shorter, "checkpoint-8")
    overwrite_same_size(shorter, "checkpoint-6", WEIGHTS, tmp_path / "shorter")
    newest_readable_checkpoint(shorter, tmp_path / "out2", say=True)
    assert capsys.readouterr().out == (
        f"warning: checkpoint-8 and checkpoint-6 in {shorter} are damaged (checkpoint-8: its "
        f"{MANIFEST} does not parse; checkpoint-6: {WEIGHTS} differs from its manifest) and "
        "skipped: starting from step 1, so steps 1-8 are trained again\n"
    )


def test_a_refused_manifest_read_stops_the_run_and_is_not_taken_for_damage(
    gcs, tmp_path, capsys, monkeypatch
):
    """A 403 on the newest manifest proves nothing about it: the run stops before training
    with the unreadable line, no checkpoint is skipped and no `warning:` printed."""
    checkpoints = location("gs", tmp_path)
    for step in (2, 4):
        save(checkpoints, step, tmp_path / "made")
    proxy = FlakyProxy(gcs)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
    storage._process_client.cache_clear()
    refused = proxy.fault("GET", rf"checkpoint-4/{MANIFEST}", refuse=True)
    try:
        with pytest.raises(RunFailed) as raised:
            newest_readable_checkpoint(checkpoints, tmp_path / "out", say=True)
    finally:
        proxy.close()
        storage._process_client.cache_clear()

    assert refused.hits == 1
    assert str(raised.value).startswith(f"reading checkpoint-4 in {checkpoints} failed (Forbidden")
    assert capsys.readouterr().out == ""
    assert not (tmp_path / "out" / "checkpoint-2").exists(), "it went on to an older one"


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_resume_of_a_named_damaged_checkpoint_is_refused_with_why(gcs, tmp_path, damage):
    """`--resume URI` of a damaged checkpoint: refused naming the damage, not skipped (it is
    the one asked for) and not `no manifest.json there` (a truncated one) or a raw
    StoredFilesDiffer (a file overwritten)."""
    checkpoints = location("gs", tmp_path)
    save(checkpoints, 4, tmp_path / "made")
    spoil, why = DAMAGES[damage]
    spoil(checkpoints, tmp_path / "made")

    with pytest.raises(UserError) as raised:
        explicit_checkpoint(f"{checkpoints}/checkpoint-4", tmp_path / "out")
    assert str(raised.value) == (
        f"--resume {checkpoints}/checkpoint-4: {why}: the checkpoint is damaged."
    )
