"""Checkpoints that survive a dead node, on storage no two nodes share.

With DeepSpeed every rank writes its own optimizer shard, so a checkpoint is spread over
the local disks of all nodes. The protocol (docs/storage.md ("The checkpoint protocol")):

1. The Trainer saves `checkpoint-N` to the local output dir on every node.
2. Each node's local main process snapshots what its node wrote (hard links, instant) and
   uploads it to `<store>/checkpoint-N/` in a background thread; training goes on.
3. When a node's upload is verified, it writes `.nodes/node-R.json` listing its files.
4. The global main process waits for every node's marker, checks the listed files are in
   the store with the recorded size and CRC32C, and writes `manifest.json` LAST. A
   checkpoint without a manifest does not exist: it is never resumed or counted.
5. Retention then deletes complete checkpoints beyond `save_total_limit`, never the best
   one and never one without a manifest (whose upload may still be running).

On start, `find_resumable_checkpoint` picks the newest checkpoint whose manifest verifies
against local files (fetching what is missing), skipping incomplete ones and those whose
stored bytes are proven wrong. A complete checkpoint that cannot be read (refused, an
outage past every retry, a full local disk) is not skipped: `CheckpointUnreadable` stops
the run before training, since starting from step 1 would lose the work it holds and
retention would then delete it (its step numbers being higher than the new run's).

The final model gets a manifest too (`publish_model`), written after its files, so a model
directory whose upload failed is visibly incomplete.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import shutil
import threading
import time
from dataclasses import asdict
from pathlib import Path

from trainer.storage.faults import brief
from trainer.storage.store import (
    FileEntry,
    Store,
    StoredFilesDiffer,
    TransferError,
    relative_files,
)

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
NODE_MARKERS = ".nodes"
CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)$")


def checkpoint_step(name: str) -> int | None:
    match = CHECKPOINT_PATTERN.match(name)
    return int(match.group(1)) if match else None


def read_manifest(checkpoint: Store) -> list[FileEntry] | None:
    """The file list in a checkpoint's manifest, or None if it is missing or unreadable."""
    text = checkpoint.read_text(MANIFEST)
    if text is None:
        return None
    try:
        return [FileEntry(**entry) for entry in json.loads(text)["files"]]
    except (ValueError, KeyError, TypeError):
        return None


def checkpoint_names(store: Store) -> list[str]:
    """Names of the checkpoint directories in a store, complete or not, oldest first."""
    names = [name for name in store.list_dirs() if checkpoint_step(name) is not None]
    return sorted(names, key=checkpoint_step)


def complete_checkpoints(store: Store) -> list[str]:
    """Names of checkpoints with a manifest, oldest first."""
    return [n for n in checkpoint_names(store) if store.child(n).read_text(MANIFEST) is not None]


class CheckpointUnreadable(Exception):
    """Complete checkpoints exist (or may: the store cannot even be listed), but reading
    them failed for a reason that proves nothing about their bytes. `name` is the one
    being read (None when listing failed), `local` where it was going; the cause is
    `__cause__`."""

    def __init__(self, store: Store, name: str | None, local: Path, error: BaseException):
        what = f"{store.uri}/{name}" if name else store.uri
        super().__init__(f"reading {what} failed ({brief(error)})")
        self.name = name
        self.local = local


def find_resumable_checkpoint(store: Store, local_root: Path) -> Path | None:
    """The newest complete checkpoint, present and verified under `local_root`.

    Skips a checkpoint only when it has no manifest or its stored files are proven not to
    match it; raises `CheckpointUnreadable` when reading failed otherwise."""
    try:
        names = checkpoint_names(store)
    except Exception as error:  # noqa: BLE001 - classified by the caller, with its cause
        raise CheckpointUnreadable(store, None, local_root, error) from error
    for name in reversed(names):
        try:
            entries = read_manifest(store.child(name))
            if entries is None:
                logger.warning("skipping %s/%s: no manifest (incomplete checkpoint)",
                               store.uri, name)  # fmt: skip
                continue
            store.child(name).download(local_root / name, entries)
        except StoredFilesDiffer as error:
            logger.warning("skipping %s/%s: %s", store.uri, name, error)
            continue
        except Exception as error:  # noqa: BLE001 - nothing proven: stop, skip nothing
            raise CheckpointUnreadable(store, name, local_root / name, error) from error
        return local_root / name
    return None


def publish_model(store: Store, local_dir: Path) -> None:
    """Upload a saved model, then its manifest: the manifest says the model is whole.

    A manifest left by an earlier delivery to the same place goes first, so a failed
    upload over an older model never looks complete."""
    store.child(MANIFEST).delete()
    entries = store.upload(local_dir, [f for f in relative_files(local_dir) if f != MANIFEST])
    write_manifest(store, {"model": True, "files": [asdict(e) for e in entries]})


def write_manifest(store: Store, content: dict) -> None:
    store.write_text(MANIFEST, json.dumps(content, indent=1))


class CheckpointUploader:
    """Runs on each node's local main process; uploads checkpoints one after another."""

    def __init__(
        self,
        store: Store,
        staging_root: Path,
        node_rank: int,
        num_nodes: int,
        is_global_main: bool,
        keep: int | None,
        peer_timeout: float,
    ) -> None:
        self.store = store
        self.staging_root = staging_root
        self.node_rank = node_rank
        self.num_nodes = num_nodes
        self.is_global_main = is_global_main
        self.keep = keep
        self.peer_timeout = peer_timeout
        self.failures: list[str] = []
        self.errors: dict[str, str] = {}
        """Why each failed checkpoint failed (`Type: message`), by name."""
        self.submitted: list[str] = []
        self.uploading: str | None = None
        self._jobs: queue.Queue[tuple[Path, str | None] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="checkpoint-upload", daemon=True)
        self._thread.start()

    def submit(self, checkpoint_dir: Path, best_checkpoint: str | None = None) -> None:
        """Snapshot the checkpoint now (the Trainer may delete it later) and queue it."""
        snapshot = self.staging_root / checkpoint_dir.name
        shutil.rmtree(snapshot, ignore_errors=True)
        shutil.copytree(checkpoint_dir, snapshot, copy_function=os.link)
        self.submitted.append(checkpoint_dir.name)  # in order: the last is the newest
        self._jobs.put((snapshot, best_checkpoint))

    def close(self, timeout: float | None = None) -> bool:
        """Wait until every queued checkpoint is uploaded (or has failed), at most
        `timeout` seconds; whether the uploads are over. Uploads still running after a
        timeout are abandoned with the process: their checkpoint never gets a manifest."""
        self._jobs.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            snapshot, best = job
            self.uploading = snapshot.name
            try:
                self._publish(snapshot, best)
            except Exception as error:  # noqa: BLE001 - a failed upload must not stop training
                logger.error("checkpoint %s was not saved to %s: %s", snapshot.name,
                             self.store.uri, error)  # fmt: skip
                self.failures.append(snapshot.name)
                self.errors[snapshot.name] = brief(error)
            finally:
                self.uploading = None
                shutil.rmtree(snapshot, ignore_errors=True)

    def _publish(self, snapshot: Path, best: str | None) -> None:
        started = time.monotonic()
        target = self.store.child(snapshot.name)
        entries = target.upload(snapshot)
        marker = json.dumps({"node": self.node_rank, "files": [asdict(e) for e in entries]})
        target.write_text(f"{NODE_MARKERS}/node-{self.node_rank}.json", marker)
        logger.info("node %d uploaded %s (%d files) in %.1fs", self.node_rank, snapshot.name,
                    len(entries), time.monotonic() - started)  # fmt: skip
        if self.is_global_main:
            self._write_manifest(target, snapshot.name)
            self._apply_retention(best)

    def _write_manifest(self, target: Store, name: str) -> None:
        deadline = time.monotonic() + self.peer_timeout
        while True:
            markers = [target.read_text(f"{NODE_MARKERS}/node-{r}.json") for r in
                       range(self.num_nodes)]  # fmt: skip
            if all(markers):
                break
            if time.monotonic() > deadline:
                missing = [r for r, m in enumerate(markers) if not m]
                raise TransferError(f"nodes {missing} did not finish uploading {name}")
            time.sleep(1)
        entries = {}
        for marker in markers:
            for entry in json.loads(marker)["files"]:
                entries[entry["path"]] = FileEntry(**entry)
        present = target.list_files()
        wrong = [path for path, entry in entries.items() if present.get(path) != entry]
        if wrong:
            raise TransferError(f"{name}: files differ from what the nodes uploaded: {wrong}")
        manifest = {
            "checkpoint": name,
            "global_step": checkpoint_step(name),
            "nodes": self.num_nodes,
            "files": [asdict(entries[path]) for path in sorted(entries)],
        }
        write_manifest(target, manifest)
        logger.info("checkpoint %s is complete in %s", name, self.store.uri)

    def _apply_retention(self, best: str | None) -> None:
        if not self.keep:
            return
        complete = complete_checkpoints(self.store)
        doomed = [name for name in complete[: -self.keep] if name != best]
        for name in doomed:
            checkpoint = self.store.child(name)
            checkpoint.child(MANIFEST).delete()  # first: a half-deleted one is never complete
            checkpoint.delete()
            logger.info("deleted %s/%s (save_total_limit=%d)", self.store.uri, name, self.keep)
