"""The storage layer and the checkpoint protocol against a real GCS emulator."""

from __future__ import annotations

import json
import os
import threading
import uuid
from pathlib import Path

import pytest

from tests.support.gcs_emulator import BUCKET, FlakyProxy
from tests.support.helpers import assert_manifest_matches_store, wait_until
from tests.support.tiny_assets import TONE_CLIPS
from trainer.common.errors import UserError
from trainer.storage import store as storage
from trainer.storage.checkpoints import (
    MANIFEST,
    NODE_MARKERS,
    CheckpointUploader,
    complete_checkpoints,
    find_resumable_checkpoint,
    newest_complete_line,
    read_manifest,
    write_manifest,
)
from trainer.storage.store import crc32c_of, open_store


def make_files(root: Path, files: dict[str, bytes]) -> Path:
    for name, content in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(content)
    return root


def fresh_prefix() -> str:
    return f"gs://{BUCKET}/{uuid.uuid4().hex}"


FILES = {"config.json": b"{}", "global_step4/shard_0.pt": os.urandom(300_000),
         "global_step4/shard_1.pt": os.urandom(200_000), "latest": b"global_step4"}  # fmt: skip


@pytest.mark.parametrize("kind", ["gs", "local"])
def test_upload_download_round_trip_is_verified(gcs, tmp_path, kind):
    source = make_files(tmp_path / "src", FILES)
    store = open_store(fresh_prefix() if kind == "gs" else str(tmp_path / "store"))
    entries = store.upload(source)
    assert sorted(e.path for e in entries) == sorted(FILES)
    listed = store.list_files()
    assert {e.path: e.crc32c for e in entries} == {k: v.crc32c for k, v in listed.items()}
    assert listed["latest"].crc32c == crc32c_of(source / "latest")
    store.download(tmp_path / "dst")
    for name, content in FILES.items():
        assert (tmp_path / "dst" / name).read_bytes() == content


def test_uploads_survive_an_unreliable_service(gcs, tmp_path, monkeypatch):
    proxy = FlakyProxy(gcs, failure_rate=0.3, seed=7)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
    storage._process_client.cache_clear()
    try:
        source = make_files(tmp_path / "src", {f"f{i}.bin": os.urandom(5000) for i in range(12)})
        store = open_store(fresh_prefix())
        store.upload(source)
        store.download(tmp_path / "dst")
    finally:
        proxy.close()
    assert proxy.failures > 0, "the proxy injected no fault: the test proved nothing"
    assert sorted(store.list_files()) == sorted(p.name for p in source.iterdir())
    for path in source.iterdir():
        assert (tmp_path / "dst" / path.name).read_bytes() == path.read_bytes()


def test_missing_bucket_and_unwritable_path_are_one_clear_error(gcs, tmp_path):
    with pytest.raises(UserError, match=r"^Bucket gs://no-such-bucket does not exist\.$"):
        open_store("gs://no-such-bucket/run").check_writable()
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(UserError, match="Cannot write to"):
        open_store(str(blocker / "outputs")).check_writable()


def uploader(store, tmp_path, node, nodes, keep=None):
    return CheckpointUploader(store, tmp_path / f"staging-{node}", node_rank=node,
                              num_nodes=nodes, is_global_main=node == 0, keep=keep,
                              peer_timeout=60)  # fmt: skip


def node_checkpoint(tmp_path, node, step, shard_rank):
    root = tmp_path / f"node{node}" / f"checkpoint-{step}"
    files = {f"global_step{step}/zero_pp_rank_{shard_rank}_optim_states.pt": os.urandom(1000)}
    if node == 0:
        files |= {"model.safetensors": os.urandom(2000), "trainer_state.json": b"{}",
                  "latest": f"global_step{step}".encode()}  # fmt: skip
    return make_files(root, files)


def test_manifest_is_written_last_listing_every_nodes_files(gcs, tmp_path, monkeypatch):
    store = open_store(fresh_prefix())
    looked_for_the_worker = threading.Event()
    list_files = type(store).list_files

    def watched_list_files(self):
        listed = list_files(self)
        if self.uri.endswith(f"/{NODE_MARKERS}") and "node-1.json" not in listed:
            looked_for_the_worker.set()
        return listed

    monkeypatch.setattr(type(store), "list_files", watched_list_files)
    chief, worker = uploader(store, tmp_path, 0, 2), uploader(store, tmp_path, 1, 2)
    chief.submit(node_checkpoint(tmp_path, 0, 4, shard_rank=0))
    # The chief's part alone never makes the checkpoint complete: once the chief has
    # uploaded it and looked for the worker's marker in vain, there is still no manifest.
    assert looked_for_the_worker.wait(timeout=60), "the chief never looked for node 1's part"
    checkpoint = store.child("checkpoint-4")
    assert checkpoint.read_text(f"{NODE_MARKERS}/node-0.json"), "the chief's part is uploaded"
    assert checkpoint.read_text(MANIFEST) is None, "a manifest without the worker's part"
    worker.submit(node_checkpoint(tmp_path, 1, 4, shard_rank=1))
    worker.close()
    chief.close()
    assert_manifest_matches_store(store.child("checkpoint-4"))
    listed = {entry.path for entry in read_manifest(store.child("checkpoint-4"))}
    assert "global_step4/zero_pp_rank_1_optim_states.pt" in listed, "the worker's shard"
    assert "model.safetensors" in listed, "the chief's files"
    assert chief.failures == worker.failures == []


def test_retention_keeps_the_newest_and_the_best(gcs, tmp_path):
    store = open_store(fresh_prefix())
    for step in (2, 4, 6):  # each uploaded before the next save: none is obsolete
        chief = uploader(store, tmp_path, 0, 1, keep=1)
        chief.submit(node_checkpoint(tmp_path, 0, step, 0), best_checkpoint="checkpoint-2")
        chief.close()
    assert complete_checkpoints(store) == ["checkpoint-2", "checkpoint-6"]
    assert "checkpoint-4" not in store.list_dirs()


def test_the_uploader_snapshots_before_the_trainer_deletes(gcs, tmp_path):
    import shutil

    store = open_store(fresh_prefix())
    chief = uploader(store, tmp_path, 0, 1)
    checkpoint = node_checkpoint(tmp_path, 0, 8, 0)
    chief.submit(checkpoint)
    shutil.rmtree(checkpoint)  # as the Trainer's save_total_limit rotation may do
    chief.close()
    assert complete_checkpoints(store) == ["checkpoint-8"]


def settled(up: CheckpointUploader, name: str) -> bool:
    """Whether `name`'s upload is over on that node, one way or another."""
    return name in up.uploaded + up.failures + up.skipped


@pytest.fixture
def proxied_store(gcs, monkeypatch):
    """A fresh store whose requests pass through a proxy that can refuse or hold them."""
    proxy = FlakyProxy(gcs)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
    storage._process_client.cache_clear()
    try:
        yield open_store(fresh_prefix()), proxy
    finally:
        proxy.close()


def test_a_newer_save_makes_queued_uploads_obsolete_and_releases_their_snapshots(
    proxied_store, tmp_path
):
    """Fault 7: while checkpoint-2 uploads (held by the proxy), checkpoint-4 and then
    checkpoint-6 are saved: 4 is never uploaded, its snapshot is gone at once, and 6 is
    next in line."""
    store, proxy = proxied_store
    held = threading.Event()
    proxy.fault("POST|PUT", r"checkpoint-2/", hold=held)
    chief = uploader(store, tmp_path, 0, 1)
    assert chief.submit(node_checkpoint(tmp_path, 0, 2, 0)) == []
    wait_until(lambda: chief.uploading == "checkpoint-2", 60, "checkpoint-2's upload")
    assert chief.submit(node_checkpoint(tmp_path, 0, 4, 0)) == []
    assert chief.submit(node_checkpoint(tmp_path, 0, 6, 0)) == ["checkpoint-4"]
    assert sorted(p.name for p in (tmp_path / "staging-0").iterdir()) == [
        "checkpoint-2", "checkpoint-6"]  # fmt: skip
    held.set()
    assert chief.close(timeout=120)
    assert complete_checkpoints(store) == ["checkpoint-2", "checkpoint-6"]
    assert "checkpoint-4" not in store.list_dirs()
    assert chief.skipped == ["checkpoint-4"] and chief.failures == []


def test_a_peers_refused_upload_abandons_that_checkpoint_at_once(proxied_store, tmp_path):
    """Fault 4: node 1's part of checkpoint-2 is refused. The chief, which would wait 10
    minutes for node 1's marker, abandons checkpoint-2 as soon as node 1 says so, and
    checkpoint-4 completes."""
    store, proxy = proxied_store
    refused = proxy.fault("POST|PUT", r"checkpoint-2/global_step2/zero_pp_rank_1", refuse=True)
    chief = CheckpointUploader(store, tmp_path / "staging-0", node_rank=0, num_nodes=2,
                               is_global_main=True, keep=None, peer_timeout=600)  # fmt: skip
    worker = uploader(store, tmp_path, 1, 2)
    for step in (2, 4):
        chief.submit(node_checkpoint(tmp_path, 0, step, shard_rank=0))
        worker.submit(node_checkpoint(tmp_path, 1, step, shard_rank=1))
        name = f"checkpoint-{step}"
        wait_until(lambda: settled(chief, name) and settled(worker, name), 120,  # noqa: B023
                   f"{name}'s uploads")  # fmt: skip
    assert worker.close(timeout=60) and chief.close(timeout=60)

    assert refused.hits > 0
    assert worker.failures == chief.failures == ["checkpoint-2"]
    assert chief.errors["checkpoint-2"].startswith(
        "PeerGaveUp: node 1 could not upload its part of checkpoint-2 (Forbidden: "
    ), chief.errors
    assert complete_checkpoints(store) == ["checkpoint-4"]
    assert chief.unsaved() == worker.unsaved() == [], "checkpoint-4 supersedes checkpoint-2"
    assert chief.fatal is worker.fatal is None


def test_a_peer_that_cannot_write_at_all_is_heard_through_the_ranks(proxied_store, tmp_path):
    """Every write of node 1 under checkpoint-2 is refused, its gave-up marker too: the chief
    hears it through the ranks' agreement (`hear_peers`, what trainer/training/callbacks.py
    passes on after each step) and abandons checkpoint-2 within seconds, not after
    `peer_timeout` (30 min by default); checkpoint-4 completes."""
    store, proxy = proxied_store
    refused = proxy.fault("POST|PUT", r"checkpoint-2/.*(zero_pp_rank_1|node-1)", refuse=True)
    chief = CheckpointUploader(store, tmp_path / "staging-0", node_rank=0, num_nodes=2,
                               is_global_main=True, keep=None, peer_timeout=600)  # fmt: skip
    worker = uploader(store, tmp_path, 1, 2)
    chief.submit(node_checkpoint(tmp_path, 0, 2, shard_rank=0))
    worker.submit(node_checkpoint(tmp_path, 1, 2, shard_rank=1))
    wait_until(lambda: settled(worker, "checkpoint-2"), 120, "node 1 giving up")
    assert worker.abandoned_through == 2 and chief.busy, "the chief waits for node 1"
    chief.hear_peers([chief.abandoned_through, worker.abandoned_through])
    wait_until(lambda: settled(chief, "checkpoint-2"), 10, "the chief abandoning checkpoint-2")
    assert chief.errors["checkpoint-2"] == (
        "PeerGaveUp: node 1 could not upload its part of checkpoint-2 (said through the "
        "training processes; it could not write its marker)"
    )
    chief.submit(node_checkpoint(tmp_path, 0, 4, shard_rank=0))
    worker.submit(node_checkpoint(tmp_path, 1, 4, shard_rank=1))
    assert worker.close(timeout=60) and chief.close(timeout=60)
    assert refused.hits > 1, "node 1's data and its marker were refused"
    assert complete_checkpoints(store) == ["checkpoint-4"]


def test_incomplete_checkpoints_older_than_a_complete_one_are_removed(gcs, tmp_path):
    """A stop's checkpoint that missed the grace (files, no manifest) stays in the bucket only
    until a newer checkpoint completes; retention alone counts complete ones. A newer
    incomplete one (an upload in flight) stays."""
    store = open_store(fresh_prefix())
    store.child("checkpoint-3").upload(node_checkpoint(tmp_path, 0, 3, 0))
    store.child("checkpoint-6").upload(node_checkpoint(tmp_path, 0, 6, 0))
    chief = uploader(store, tmp_path, 0, 1)
    chief.submit(node_checkpoint(tmp_path, 0, 4, 0))
    assert chief.close(timeout=60)
    assert complete_checkpoints(store) == ["checkpoint-4"]
    assert store.list_dirs() == ["checkpoint-4", "checkpoint-6"]


def test_uploads_refused_checkpoint_after_checkpoint_are_fatal(proxied_store, tmp_path):
    store, proxy = proxied_store
    proxy.fault("POST|PUT", r"checkpoint-\d+/", refuse=True)
    chief = uploader(store, tmp_path, 0, 1)
    for count, step in enumerate((2, 4, 6), start=1):
        assert chief.fatal is None
        chief.submit(node_checkpoint(tmp_path, 0, step, 0))
        wait_until(lambda: len(chief.failures) == count, 120, f"checkpoint-{step} to fail")  # noqa: B023
    assert chief.close(timeout=60)
    assert chief.fatal.startswith(
        f"3 checkpoints in a row (checkpoint-2, checkpoint-4, checkpoint-6) could not be "
        f"saved to {store.uri} (last: Forbidden: "
    ), chief.fatal
    assert chief.unsaved() == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]


def test_a_deleted_bucket_is_fatal_at_the_first_failed_upload(gcs, tmp_path):
    """Fault 8: the bucket is deleted mid-run."""
    bucket = f"gone-{uuid.uuid4().hex[:8]}"
    storage._client().create_bucket(bucket)
    store = open_store(f"gs://{bucket}/job/checkpoints")
    chief = uploader(store, tmp_path, 0, 1)
    chief.submit(node_checkpoint(tmp_path, 0, 2, 0))
    wait_until(lambda: chief.uploaded, 60, "checkpoint-2's upload")
    storage._client().bucket(bucket).delete(force=True)
    chief.submit(node_checkpoint(tmp_path, 0, 4, 0))
    wait_until(lambda: chief.fatal, 120, "checkpoint-4's upload to fail")
    assert chief.fatal == f"the bucket gs://{bucket} no longer exists"
    chief.submit(node_checkpoint(tmp_path, 0, 6, 0))  # saved before training stops
    assert chief.close(timeout=120)
    assert chief.failures == ["checkpoint-4", "checkpoint-6"]
    assert chief.errors["checkpoint-6"] == f"TransferError: {chief.fatal}", "not tried again"


def test_resume_skips_incomplete_and_corrupt_checkpoints(gcs, tmp_path):
    store = open_store(fresh_prefix())
    for step in (3, 4):
        chief = uploader(store, tmp_path, 0, 1)
        chief.submit(node_checkpoint(tmp_path, 0, step, 0))
        chief.close()
    # checkpoint-4: a manifest whose CRC32C does not match a file's content
    manifest = json.loads(store.child("checkpoint-4").read_text(MANIFEST))
    manifest["files"][0]["crc32c"] = "AAAAAA=="
    store.child("checkpoint-4").write_text(MANIFEST, json.dumps(manifest))
    # checkpoint-5: files but no manifest (an upload that never finished)
    store.child("checkpoint-5").upload(node_checkpoint(tmp_path, 0, 5, 0))

    skipped = []
    found = find_resumable_checkpoint(store, tmp_path / "resume", skipped)
    assert found == tmp_path / "resume" / "checkpoint-3"
    assert (found / "latest").read_text() == "global_step3"
    assert [(entry.name, entry.damaged) for entry in skipped] == [
        ("checkpoint-5", False), ("checkpoint-4", True)
    ]  # fmt: skip
    assert skipped[1].why == (
        "global_step4/zero_pp_rank_0_optim_states.pt differs from its manifest"
    )


def test_skipping_a_damaged_checkpoint_is_a_warning_naming_the_steps_trained_again(
    gcs, tmp_path, capsys
):
    """The restart's one line for a damaged newest checkpoint: what it resumes from instead
    and which steps are trained again (the logger's WARNING alone went unseen)."""
    from trainer.training.resume import newest_readable_checkpoint

    store = open_store(fresh_prefix())
    for step in (3, 6, 8):
        chief = uploader(store, tmp_path, 0, 1)
        chief.submit(node_checkpoint(tmp_path, 0, step, 0))
        chief.close()
    manifest = json.loads(store.child("checkpoint-6").read_text(MANIFEST))
    manifest["files"][0]["crc32c"] = "AAAAAA=="
    store.child("checkpoint-6").write_text(MANIFEST, json.dumps(manifest))
    truncated = store.child("checkpoint-8").read_text(MANIFEST)[:40]  # not "no manifest"
    store.child("checkpoint-8").write_text(MANIFEST, truncated)

    found = newest_readable_checkpoint(store.uri, tmp_path / "resume", say=True)
    assert found == tmp_path / "resume" / "checkpoint-3"
    assert capsys.readouterr().out == (
        f"warning: checkpoint-8 and checkpoint-6 in {store.uri} are damaged (checkpoint-8: its "
        "manifest.json does not parse; checkpoint-6: global_step6/zero_pp_rank_0_optim_states"
        ".pt differs from its manifest) and skipped: resuming from checkpoint-3, so steps 4-8 "
        "are trained again\n"
    )
    assert newest_readable_checkpoint(store.uri, tmp_path / "again", say=False) is not None
    assert capsys.readouterr().out == "", "only the global main process says it"


def test_gs_dataset_is_fetched_once_per_machine_and_loads_as_a_local_one(
    gcs, demo_assets, tmp_path, monkeypatch
):
    from trainer.command_line.parser import parse_flags

    monkeypatch.setenv("TRAINER_CACHE_DIR", str(tmp_path / "cache"))
    uri = f"{fresh_prefix()}/speech-demo"
    open_store(uri).upload(demo_assets.dataset_dir)
    flags = parse_flags(
        [
            "--model_name_or_path",
            str(demo_assets.model_dir),
            "--dataset_name",
            uri,
            "--text_column_name",
            "transcription",
            "--language",
            "en",
        ]
    )
    task = flags.build_task()
    task.check_inputs()  # what the launcher runs: fetches, then checks layout and columns
    copy = next((tmp_path / "cache" / "datasets").rglob("metadata.csv"))
    fetched_at = copy.stat().st_mtime_ns
    _, processor = task.build_model_and_processor()
    train, evaluation = task.load_datasets(processor)
    assert (len(train), len(evaluation)) == (TONE_CLIPS["train"], TONE_CLIPS["test"])
    assert train[0]["audio"].get_all_samples().sample_rate == 16_000
    assert copy.stat().st_mtime_ns == fetched_at, "the dataset was fetched twice"


def test_empty_gs_dataset_is_refused(gcs):
    from trainer.data.sources import local_directory

    with pytest.raises(UserError, match="holds no files"):
        local_directory(f"{fresh_prefix()}/nothing-here")


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        ("/gcs/my-bucket/run/checkpoints/", "gs://my-bucket/run/checkpoints"),
        ("/gcs/my-bucket", "gs://my-bucket"),
        ("gs://my-bucket/x", "gs://my-bucket/x"),
        ("/gcsfuse/my-bucket/x", "/gcsfuse/my-bucket/x"),  # only the /gcs mount itself
        ("outputs/gcs/my-bucket", "outputs/gcs/my-bucket"),
        ("/gcs", "/gcs"),
    ],
)
def test_fuse_paths_name_the_bucket_they_mirror(location, expected):
    assert storage.bucket_uri(location) == expected


def test_fuse_path_outputs_go_through_the_storage_client(gcs, tmp_path, monkeypatch):
    """A /gcs/BUCKET/x output is uploaded to gs://BUCKET/x and verified with the hashes the
    service reports: nothing is read back through a local path (there is no /gcs here)."""
    prefix = fresh_prefix().removeprefix("gs://")
    store = open_store(f"/gcs/{prefix}/checkpoint-4")
    assert isinstance(store, storage.GcsStore)
    assert store.uri == f"gs://{prefix}/checkpoint-4"

    read_back = []
    real_crc = storage.crc32c_of
    monkeypatch.setattr(storage, "crc32c_of", lambda p: read_back.append(p) or real_crc(p))
    source = make_files(tmp_path / "src", FILES)
    entries = store.upload(source)
    assert all(Path(path).is_relative_to(source) for path in read_back), read_back
    assert {e.path: e for e in entries} == open_store(f"gs://{prefix}/checkpoint-4").list_files()
    assert not Path("/gcs").exists()


def test_a_checkpoint_whose_manifest_is_truncated_is_not_named_where_a_restart_resumes(tmp_path):
    """A truncated manifest makes a checkpoint damaged, not complete: the resume skips it,
    so the line a stopping run prints names the one before it."""
    store = open_store(str(tmp_path / "checkpoints"))
    for name in ("checkpoint-2", "checkpoint-4"):
        store.child(name).write_text("trainer_state.json", "{}")
        write_manifest(store.child(name), {"files": []})
    whole = store.child("checkpoint-4").read_text(MANIFEST)
    store.child("checkpoint-4").write_text(MANIFEST, whole[: len(whole) // 2])

    assert complete_checkpoints(store) == ["checkpoint-2"]
    assert newest_complete_line(store.uri) == (
        f"the newest complete checkpoint is {store.uri}/checkpoint-2, where a restart resumes"
    )
