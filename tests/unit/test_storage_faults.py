"""The pure decisions behind "a storage failure is never mistaken for a corrupt checkpoint":
which stored files a listing proves wrong, which errors are worth retrying, and what a
full disk's line says. (The faults themselves, in the real trainer:
tests/processes/test_faults.py.)"""

from __future__ import annotations

import errno
import uuid
from dataclasses import asdict
from pathlib import Path

import pytest
from google.api_core.exceptions import Forbidden, ServiceUnavailable, Unauthorized

from tests.support.gcs_emulator import BUCKET, FlakyProxy
from trainer.storage import store as storage
from trainer.storage.checkpoints import (
    CheckpointUnreadable,
    find_resumable_checkpoint,
    write_manifest,
)
from trainer.storage.failure_kinds import (
    brief,
    disk_full,
    disk_line,
    mount_point,
    permanent,
    refused,
    unavailable,
)
from trainer.storage.store import FileEntry, differing, open_store

MANIFEST_FILES = [
    FileEntry("model.safetensors", 10, "AAAAAA=="),
    FileEntry("rng.pth", 3, "BBBBBB=="),
]


def test_a_listing_proves_wrong_only_missing_files_and_other_sizes_or_checksums():
    stored = {entry.path: entry for entry in MANIFEST_FILES}
    assert differing(MANIFEST_FILES, stored) == []
    assert (
        differing(MANIFEST_FILES, {**stored, "extra.json": FileEntry("extra.json", 1, "C")}) == []
    )
    del stored["rng.pth"]
    assert differing(MANIFEST_FILES, stored) == ["rng.pth"]
    stored["model.safetensors"] = FileEntry("model.safetensors", 10, "ZZZZZZ==")
    assert differing(MANIFEST_FILES, stored) == ["model.safetensors", "rng.pth"]
    stored["model.safetensors"] = FileEntry("model.safetensors", 9, "AAAAAA==")
    assert differing(MANIFEST_FILES, stored) == ["model.safetensors", "rng.pth"]


def chained(outer: Exception, inner: Exception) -> Exception:
    try:
        try:
            raise inner
        except Exception as error:
            raise outer from error
    except Exception as error:  # noqa: BLE001 - the chained error is the value under test
        return error


@pytest.mark.parametrize(
    "error",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 640 vs 512"),
        RuntimeError("PytorchStreamWriter failed writing file data/3: file write failed"),
        Exception("Error while serializing: IoError(Os { code: 28, kind: StorageFull })"),
        chained(RuntimeError("saving failed"), OSError(errno.ENOSPC, "No space left")),
    ],
)
def test_a_full_disk_is_recognised_and_never_retried(error):
    assert disk_full(error)
    assert permanent(error)
    assert not refused(error)


REFUSALS = [Forbidden("denied"), Unauthorized("no token"),
            chained(RuntimeError("download"), Forbidden("denied"))]  # fmt: skip
OUTAGES = [ServiceUnavailable("try later"), ConnectionResetError(),
           OSError(errno.EIO, "Input/output error"), TimeoutError()]  # fmt: skip


@pytest.mark.parametrize("error", REFUSALS)
def test_a_refusal_is_never_retried(error):
    assert refused(error) and permanent(error)
    assert not disk_full(error)


@pytest.mark.parametrize("error", OUTAGES)
def test_outages_and_dropped_connections_are_retried(error):
    assert not permanent(error)


def test_the_disk_line_names_the_mount_its_free_space_and_what_was_written(tmp_path):
    target = tmp_path / "out" / "checkpoint-8"  # not created yet: its disk is tmp_path's
    line = disk_line(target, "writing checkpoint-8")
    mount = mount_point(tmp_path)
    assert Path(mount).is_mount() or mount == Path("/")
    assert line.startswith(f"no space left on the disk mounted at {mount} (")
    assert line.endswith(f" while writing checkpoint-8 to {target}")
    assert " MB free of " in line


def write_checkpoint(store, name: str, content: bytes, local: Path) -> None:
    """A complete checkpoint of one file in `store`: the file, then its manifest."""
    folder = local / name
    folder.mkdir(parents=True)
    (folder / "weights.bin").write_bytes(content)
    entries = store.child(name).upload(folder)
    write_manifest(store.child(name), {"files": [asdict(entry) for entry in entries]})


def test_resume_skips_proven_corruption_but_stops_on_refused_reads(gcs, tmp_path, monkeypatch):
    """checkpoint-4's stored bytes differ from its manifest: skipped for checkpoint-2.
    Then the downloads are refused (403): the search stops at once, skipping nothing."""
    store = open_store(f"gs://{BUCKET}/{uuid.uuid4().hex}/checkpoints")
    write_checkpoint(store, "checkpoint-2", b"two", tmp_path / "made")
    write_checkpoint(store, "checkpoint-4", b"four", tmp_path / "made")
    (tmp_path / "made" / "checkpoint-4" / "weights.bin").write_bytes(b"FOUR!")
    store.child("checkpoint-4")._put(tmp_path / "made" / "checkpoint-4", ["weights.bin"])

    found = find_resumable_checkpoint(store, tmp_path / "local")
    assert found == tmp_path / "local" / "checkpoint-2"
    assert (found / "weights.bin").read_bytes() == b"two"

    proxy = FlakyProxy(gcs)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
    storage._process_client.cache_clear()
    refusal = proxy.fault("GET", r"/weights\.bin\?alt=media", refuse=True)
    try:
        with pytest.raises(CheckpointUnreadable) as raised:
            find_resumable_checkpoint(store, tmp_path / "fresh")
    finally:
        proxy.close()
    assert raised.value.name == "checkpoint-2", "an unreadable checkpoint is not skipped"
    assert refusal.hits == 1, "a refusal is not retried"
    assert isinstance(raised.value.__cause__, Forbidden)
    # the line's words for it: no request URL (its query), no client status tuple
    assert brief(raised.value.__cause__) == "Forbidden: 403 GET"


def test_storage_that_does_not_answer_is_an_outage_and_a_refusal_is_not(gcs, monkeypatch):
    """What the real client raises through the proxy, one request each (no retry): 503s and
    dropped connections are an outage (the launcher's write probe then says so and exits 1,
    which a restart tries again), a 403 a refusal (a configuration error, exit 2)."""
    proxy = FlakyProxy(gcs, failure_rate=1.0, seed=1)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
    storage._process_client.cache_clear()
    bucket = storage._client().bucket(BUCKET)
    try:
        outages = []
        for _ in range(4):  # the seeded proxy answers 503 or drops the connection
            with pytest.raises(Exception) as raised:
                bucket.blob(f"probe-{uuid.uuid4().hex}").upload_from_string("x", retry=None)
            outages.append(raised.value)
        proxy.failure_rate = 0.0
        proxy.fault("POST", r"refused-probe", refuse=True)
        with pytest.raises(Forbidden) as refusal:
            bucket.blob("refused-probe").upload_from_string("x", retry=None)
    finally:
        proxy.close()
        storage._process_client.cache_clear()
    kinds = {type(error).__name__ for error in outages}
    assert "ServiceUnavailable" in kinds and len(kinds) == 2, kinds  # and a dropped connection
    assert all(unavailable(error) and not refused(error) for error in outages), kinds
    assert refused(refusal.value) and not unavailable(refusal.value)


LONG_CHECKPOINTS = (
    "gs://my-training-bucket/aiplatform-custom-training-2026-11-28-17:37:13.123/checkpoints/"
)
"""A checkpoint location as long as Vertex AI's own (`baseOutputDirectory`/checkpoints)."""


def test_the_lines_for_checkpoints_that_cannot_be_read_fit_300_characters(tmp_path):
    """A 403 at resume quoted the storage error's JSON body and named the location twice (311
    characters in the issue's replay), a full disk at resume the path twice (364): each is now
    one line of at most 300 characters that still says what failed and what to do."""
    from trainer.storage.checkpoints import CheckpointUnreadable
    from trainer.training.failures import MAX_LINE
    from trainer.training.resume import unreadable_line

    store = open_store(LONG_CHECKPOINTS)
    body = '{"error": {"code": 403, "message": "caller does not have storage.objects.get access'
    refused = Forbidden(f"GET https://storage.googleapis.com/download/x?alt=media: {body * 3}")
    error = CheckpointUnreadable(store, "checkpoint-1200", tmp_path / "out" / "checkpoint-1200",
                                 refused)  # fmt: skip
    error.__cause__ = refused
    line = unreadable_line(error, LONG_CHECKPOINTS)
    assert line.startswith(f"reading checkpoint-1200 in {LONG_CHECKPOINTS} failed (Forbidden: ")
    assert line.endswith("(nothing was trained or deleted): restart once it can be read")
    assert len(line) <= MAX_LINE, len(line)

    deep = Path("out", "checkpoint-1200")  # where the run downloads it: --output_dir out
    full = OSError(errno.ENOSPC, "No space left on device", str(deep / "model.safetensors"))
    error = CheckpointUnreadable(store, "checkpoint-1200", deep, full)
    error.__cause__ = full
    line = unreadable_line(error, LONG_CHECKPOINTS)
    assert line.startswith("no space left on the disk mounted at ")
    assert f"while downloading checkpoint-1200 to {deep};" in line
    assert line.endswith("free space there (or use a larger disk)")
    assert len(line) <= MAX_LINE, len(line)


def test_the_backlog_warning_fits_300_characters(tmp_path):
    """It named the checkpoints' location (371-373 characters in the issue's replay): now the
    checkpoints by name only, however many steps and seconds."""
    import time

    from trainer.storage.checkpoints import CheckpointUploader
    from trainer.training.callbacks import backlog_warning
    from trainer.training.failures import MAX_LINE

    uploader = CheckpointUploader(open_store(str(tmp_path / "store")), tmp_path / "staging",
                                  node_rank=0, num_nodes=1, is_global_main=True, keep=None,
                                  peer_timeout=60)  # fmt: skip
    uploader.uploading, uploader.uploading_since = "checkpoint-999998", time.monotonic() - 9999
    line = backlog_warning(uploader, ["checkpoint-999999"], "checkpoint-1000000")
    assert line.startswith(
        "warning: checkpoint uploads are slower than saves: checkpoint-1000000 "
        "was saved while checkpoint-999999 waited behind checkpoint-999998 ("
    )
    assert len(line.removeprefix("warning: ")) <= MAX_LINE, len(line)
    assert uploader.close(timeout=10)
