"""Checkpoints that survive a dead node, on storage no two nodes share.

With DeepSpeed every rank writes its own optimizer shard, so a checkpoint is spread over the
local disks of all nodes. The protocol (docs/storage.md, "The checkpoint protocol"):

1. The Trainer saves `checkpoint-N` to the local output dir on every node.
2. Each node's local main process snapshots what its node wrote (hard links, instant) and
   uploads it to `<store>/checkpoint-N/` in a background thread; training goes on.
3. When a node's upload is verified, it writes `.nodes/node-R.json` listing its files.
4. The global main process waits for every node's marker, checks the listed files' size and
   CRC32C in the store, and writes `manifest.json` LAST. A checkpoint without a manifest does
   not exist: it is never resumed or counted.
5. Retention then deletes complete checkpoints beyond `save_total_limit`, never the best one
   and never one without a manifest (whose upload may still be running).

On start, `find_resumable_checkpoint` picks the newest checkpoint whose manifest verifies
against local files (fetching what is missing), skipping incomplete ones and those whose
manifest or stored bytes are proven wrong (one line names them: `skipped_line`). One that
cannot be read (refused, an outage past every retry, a full local disk) is not skipped:
`CheckpointUnreadable` stops the run before training, since starting from step 1 would lose
its work, and retention would then delete it (its step numbers being higher). The final
model gets a manifest too (`publish_model`), written after its files, so a model whose upload
failed is visibly incomplete.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from trainer.common.log_lines import MAX_LINE
from trainer.storage.failure_kinds import brief
from trainer.storage.store import (
    TRANSFER_THREADS,
    FileEntry,
    Store,
    StoredFilesDiffer,
    TransferError,
    open_store,
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
    return parse_manifest(checkpoint.read_text(MANIFEST))


def parse_manifest(text: str | None) -> list[FileEntry] | None:
    """The file list in a manifest's text, or None if there is none or it does not parse
    (truncated, overwritten)."""
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
    """Names of checkpoints with a readable manifest, oldest first: one whose manifest is
    truncated or damaged is not resumed from (find_resumable_checkpoint skips it), so no
    line may name it as where a restart resumes. The manifests are read side by side: one
    after another, a store of many checkpoints took a request's time for each."""
    names = checkpoint_names(store)
    with ThreadPoolExecutor(TRANSFER_THREADS) as pool:
        manifests = list(pool.map(lambda name: read_manifest(store.child(name)), names))
    return [name for name, entries in zip(names, manifests, strict=True) if entries is not None]


NEWEST_COMPLETE = "the newest complete checkpoint is "


def newest_complete_line(checkpoints: str, why: str = "", why_none: str | None = None) -> str:
    """Where the newest complete checkpoint in `checkpoints` is, read from the store, or that
    there is none: the end of every line a run that stops early prints. `why` (" (...)")
    says what was still behind; `why_none`, when given, replaces it if there is none. The
    ending of other lines: a storage error that stops the listing is cut short."""
    try:
        complete = complete_checkpoints(open_store(checkpoints))
    except Exception as error:  # noqa: BLE001 - the line says the store is unreadable
        return f"the checkpoints in {checkpoints} cannot be listed ({brief(error, 80)})"
    if complete:
        return (
            f"{NEWEST_COMPLETE}{checkpoints.rstrip('/')}/{complete[-1]}, "
            f"where a restart resumes{why}"
        )
    if why_none is not None:
        why = why_none
    return f"there is no complete checkpoint in {checkpoints}{why}"


class CheckpointUnreadable(Exception):
    """Complete checkpoints exist (or may: the store cannot even be listed), but reading them
    failed for a reason that proves nothing about their bytes. `name` is the one being read
    (None when listing failed), `local` where it was going; the cause is `__cause__`."""

    def __init__(self, store: Store, name: str | None, local: Path, error: BaseException):
        what = f"{store.uri}/{name}" if name else store.uri
        super().__init__(f"reading {what} failed ({brief(error)})")
        self.name = name
        self.local = local


@dataclass(frozen=True)
class Skipped:
    """A checkpoint newer than the resume point that a resume passed over: `damaged` (its
    manifest does not parse, or its stored files are proven not to be what it lists) or
    incomplete (no manifest: its upload did not finish, as a stop past its grace leaves
    one); `why` says which file, or that of the manifest, briefly."""

    name: str
    why: str
    damaged: bool


MANIFEST_UNPARSED = f"its {MANIFEST} does not parse"
NO_MANIFEST = f"no {MANIFEST}: its upload did not finish"


def find_resumable_checkpoint(
    store: Store, local_root: Path, skipped: list[Skipped] | None = None
) -> Path | None:
    """The newest complete checkpoint, present and verified under `local_root`, passing over
    only those without a manifest, with one that does not parse, or with stored files proven
    wrong (each added to `skipped`, newest first, for the line saying what is trained
    again); else `CheckpointUnreadable`: a storage error proves nothing about the bytes."""
    try:
        names = checkpoint_names(store)
    except Exception as error:  # noqa: BLE001 - classified by the caller, with its cause
        raise CheckpointUnreadable(store, None, local_root, error) from error
    for name in reversed(names):
        try:
            text = store.child(name).read_text(MANIFEST)  # read once: a second read may differ
            entries = parse_manifest(text)
            if text is None:
                logger.info("skipping %s/%s: no manifest (incomplete checkpoint)", store.uri,
                            name)  # fmt: skip
                if skipped is not None:
                    skipped.append(Skipped(name, NO_MANIFEST, damaged=False))
                continue
            if entries is None:
                raise StoredFilesDiffer(f"{store.uri}/{name}/{MANIFEST} is there but not a "
                                        "manifest", MANIFEST_UNPARSED)  # fmt: skip
            store.child(name).download(local_root / name, entries)
        except StoredFilesDiffer as error:
            logger.info("skipping %s: %s", name, error)  # the error names where
            if skipped is not None:
                skipped.append(Skipped(name, error.why, damaged=True))
            continue
        except Exception as error:  # noqa: BLE001 - nothing proven: stop, skip nothing
            raise CheckpointUnreadable(store, name, local_root / name, error) from error
        return local_root / name
    return None


SKIPPED_SHOWN = 2
"""Skipped checkpoints a resume's line names with why; the rest are counted."""


def skipped_line(checkpoints: str, skipped: list[Skipped], found: Path | None) -> str:
    """The resume's line for checkpoints newer than its resume point that it passed over, at
    most MAX_LINE characters after its prefix: which, where (named once), why (cut to the
    room left), what it resumes from instead and the steps trained again. A `warning:` when
    one is damaged; a plain line when all are incomplete (a stop past its grace leaves one,
    and says so as it ends)."""
    damaged = [entry for entry in skipped if entry.damaged]
    state = ("damaged" if len(damaged) == len(skipped)
             else "damaged or incomplete" if damaged else "incomplete")  # fmt: skip
    since = checkpoint_step(found.name) if found is not None else 0
    instead = f"resuming from {found.name}" if found is not None else "starting from step 1"
    verb = "is" if len(skipped) == 1 else "are"
    head = f"{skipped_names(skipped)} in {checkpoints.rstrip('/')} {verb} {state} ("
    tail = (
        f") and skipped: {instead}, so steps {since + 1}-{checkpoint_step(skipped[0].name)} "
        "are trained again"
    )
    why = skipped_why(skipped, max(MAX_LINE - len(head) - len(tail), 20))
    return f"{'warning: ' if damaged else ''}{head}{why}{tail}"


def skipped_names(skipped: list[Skipped]) -> str:
    """`checkpoint-8`, `checkpoint-8 and checkpoint-6`, `checkpoint-8, checkpoint-6 and 2
    older`: the newest SKIPPED_SHOWN named, the rest counted."""
    names = [entry.name for entry in skipped]
    if len(names) > SKIPPED_SHOWN + 1:
        names = [*names[:SKIPPED_SHOWN], f"{len(names) - SKIPPED_SHOWN} older"]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def skipped_why(skipped: list[Skipped], room: int) -> str:
    """Why each of the newest SKIPPED_SHOWN was skipped, within `room` characters: the first
    cut if it must be, each other one whole or left out."""
    whys = [skipped[0].why] if len(skipped) == 1 else [
        f"{entry.name}: {entry.why}" for entry in skipped[:SKIPPED_SHOWN]
    ]  # fmt: skip
    why = whys[0] if len(whys[0]) <= room else f"{whys[0][: room - 3]}..."
    for more in whys[1:]:
        why = f"{why}; {more}" if len(why) + 2 + len(more) <= room else why
    return why


def publish_model(store: Store, local_dir: Path) -> None:
    """Upload a saved model, then its manifest (the model is whole), removing an earlier one
    first: a failed upload over an older model never looks complete."""
    store.child(MANIFEST).delete()
    entries = store.upload(local_dir, [f for f in relative_files(local_dir) if f != MANIFEST])
    write_manifest(store, {"model": True, "files": [asdict(e) for e in entries]})


def write_manifest(store: Store, content: dict) -> None:
    store.write_text(MANIFEST, json.dumps(content, indent=1))


GIVE_UP_AFTER = 3
"""Checkpoints in a row whose upload failed before uploads count as impossible: one may
be a passing outage or one node's trouble, three in a row mean nothing will be saved."""


class PeerGaveUp(TransferError):
    """A peer node wrote that it will not upload its part of a checkpoint: it failed
    (`skipped` False) or a newer save made the checkpoint obsolete there (`skipped`)."""

    def __init__(self, name: str, node: int, reason: str, skipped: bool) -> None:
        what = "skipped its part" if skipped else "could not upload its part"
        super().__init__(f"node {node} {what} of {name} ({reason})")
        self.skipped = skipped


PEER_POLL_SECONDS = 0.5
"""How often the chief lists the peers' done-markers while it waits for them: each wait is
time a stop's checkpoint may not have."""

GAVE_UP_SUFFIX = ".gave-up.json"
PEER_WORD_BY_AGREEMENT = "said through the training processes; it could not write its marker"


def gave_up_marker(node_rank: int) -> str:
    """Where a peer says it will not upload its part: beside its done-marker."""
    return f"{NODE_MARKERS}/node-{node_rank}{GAVE_UP_SUFFIX}"


class CheckpointUploader:
    """Runs on each node's local main process; uploads checkpoints one after another.

    Only the newest save waits for the upload in progress: a newer one makes those still queued
    obsolete (their snapshots are released at once), so slow uploads cost disk for two
    checkpoints at most, and a stop checkpoint is next in line. A node that gives up on a
    checkpoint (failed or obsolete) says so in the store, beside its done-marker, so the chief
    abandons it at once instead of waiting `peer_timeout`. `fatal` says why uploads cannot
    succeed at all (the bucket is gone, or `GIVE_UP_AFTER` failures in a row); training stops
    on it.

    Behind slow storage the grace of a stop is short (`--stop_grace_seconds`, 8 s), so nothing
    that can wait stands before the stop checkpoint: the chief's retention (a listing, a read
    of every manifest, a delete of each file) is left to the next checkpoint when one is
    already queued, and left undone once `stop_requested` says a stop came; a waiter learns
    that a checkpoint is complete (`wait_for`) as soon as its manifest is written."""

    def __init__(
        self,
        store: Store,
        staging_root: Path,
        node_rank: int,
        num_nodes: int,
        is_global_main: bool,
        keep: int | None,
        peer_timeout: float,
        stop_requested: Callable[[], bool] = lambda: False,
    ) -> None:
        self.store = store
        self.stop_requested = stop_requested
        self.staging_root = staging_root
        self.node_rank = node_rank
        self.num_nodes = num_nodes
        self.is_global_main = is_global_main
        self.keep = keep
        self.peer_timeout = peer_timeout
        self.failures: list[str] = []
        self.errors: dict[str, str] = {}
        """Why each failed checkpoint failed (`Type: message`), by name."""
        self.skipped: list[str] = []
        """Checkpoints a newer save made obsolete before their upload started."""
        self.uploaded: list[str] = []
        """This node's part verified in the store (on the chief: the manifest written)."""
        self.submitted: list[str] = []
        self.uploading: str | None = None
        self.uploading_since: float | None = None
        self.fatal: str | None = None
        self.abandoned_through = -1
        """The newest step whose part this node gave up on: its word to the chief, also
        carried by the ranks' agreement after each step (`hear_peers`), which needs no
        storage: a node that cannot write cannot write its gave-up marker either."""
        self._peers_abandoned = [-1] * num_nodes
        self._failed_in_a_row = 0
        self._pending: list[tuple[Path, str | None]] = []
        self._to_announce: list[str] = []
        self._closing = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="checkpoint-upload", daemon=True)
        self._thread.start()

    def submit(self, checkpoint_dir: Path, best_checkpoint: str | None = None) -> list[str]:
        """Snapshot the checkpoint now (the Trainer may delete it later) and queue it.
        Returns the queued checkpoints it made obsolete (their uploads had not started)."""
        snapshot = self.staging_root / checkpoint_dir.name
        shutil.rmtree(snapshot, ignore_errors=True)
        shutil.copytree(checkpoint_dir, snapshot, copy_function=os.link)
        with self._changed:
            obsolete = [path for path, _ in self._pending]
            self._pending = [(snapshot, best_checkpoint)]
            self.submitted.append(checkpoint_dir.name)  # in order: the last is the newest
            self.skipped += [path.name for path in obsolete]
            self._to_announce += [path.name for path in obsolete]
            self._changed.notify_all()
        for path in obsolete:
            shutil.rmtree(path, ignore_errors=True)
            logger.info("%s will not be uploaded: %s is newer", path.name, checkpoint_dir.name)
        return [path.name for path in obsolete]

    def close(self, timeout: float | None = None) -> bool:
        """Wait at most `timeout` s for the queued uploads; whether they are over. Uploads still
        running are abandoned with the process: their checkpoint never gets a manifest."""
        with self._changed:
            self._closing = True
            self._changed.notify_all()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def wait_for(self, name: str, timeout: float) -> bool:
        """Wait at most `timeout` s until `name` is uploaded (on the chief: its manifest
        written), failed or given up; whether it was uploaded. What the uploader does after
        (retention) is not waited for: a stop has no time for it."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not self._settled(name):
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    break
                self._changed.wait(left)
            return name in self.uploaded

    def _settled(self, name: str) -> bool:
        return name in self.uploaded or name in self.failures or name in self.skipped

    @property
    def busy(self) -> bool:
        """Whether a checkpoint is queued or uploading (on the chief: or waiting for peers)."""
        return bool(self._pending) or self.uploading is not None

    def hear_peers(self, abandoned: list[float]) -> None:
        """Each node's `abandoned_through`, as the ranks agreed on them: the chief abandons
        a checkpoint a peer gave up on without waiting for a marker that may never come."""
        self._peers_abandoned = [int(step) for step in abandoned]

    def unsaved(self) -> list[str]:
        """Failed checkpoints newer than this node's newest upload: work the store lacks.
        (An older failure is superseded by a newer checkpoint.)"""
        newest = self.submitted.index(self.uploaded[-1]) if self.uploaded else -1
        return [name for name in self.failures if self.submitted.index(name) > newest]

    def _next(self) -> tuple[Path, str | None] | None:
        with self._changed:
            while not self._pending and not self._closing:
                self._changed.wait()
            announce, self._to_announce = self._to_announce, []
            job = self._pending.pop(0) if self._pending else None
            self.uploading = job[0].name if job else None
            self.uploading_since = time.monotonic()
        for name in announce:
            self._give_up(name, "a newer checkpoint was saved before its upload started",
                          skipped=True)  # fmt: skip
        return job

    def _run(self) -> None:
        while (job := self._next()) is not None:
            snapshot, best = job
            try:
                if self.fatal:  # the run is stopping: no attempt can succeed
                    raise TransferError(self.fatal)
                self._publish(snapshot)
            except PeerGaveUp as gave_up:
                if gave_up.skipped:
                    self.skipped.append(snapshot.name)
                    logger.info("%s abandoned: %s", snapshot.name, gave_up)
                else:
                    self._failed(snapshot.name, gave_up)
            except Exception as error:  # noqa: BLE001 - a failed upload must not stop training
                self._failed(snapshot.name, error)
            else:
                with self._changed:
                    self.uploaded.append(snapshot.name)  # complete: a stop's line may name it
                    self._changed.notify_all()
                self._failed_in_a_row = 0
                self._tidy(best)
            finally:
                with self._changed:
                    self.uploading = None
                    self._changed.notify_all()
                shutil.rmtree(snapshot, ignore_errors=True)

    def _failed(self, name: str, error: Exception) -> None:
        """Record the failure, tell the chief (a peer), and decide whether uploads can
        succeed at all."""
        logger.error("%s abandoned: it was not saved to %s (%s)", name, self.store.uri,
                     brief(error))  # fmt: skip
        self.failures.append(name)
        self.errors[name] = brief(error)
        self._failed_in_a_row += 1
        self._give_up(name, brief(error), skipped=False)
        try:
            gone = self.store.bucket_gone()
        except Exception:  # noqa: BLE001 - unknown: the count in a row decides
            gone = False
        bucket = self.store.uri.split("/", 3)
        if gone:
            self.fatal = f"the bucket {'/'.join(bucket[:3])} no longer exists"
        elif self._failed_in_a_row >= GIVE_UP_AFTER:
            recent = self.failures[-GIVE_UP_AFTER:]
            self.fatal = (
                f"{len(recent)} checkpoints in a row ({', '.join(recent)}) could not be "
                f"saved to {self.store.uri} (last: {brief(error)})"
            )

    def _give_up(self, name: str, reason: str, skipped: bool) -> None:
        """A peer's word to the chief that its part of `name` will not come."""
        self.abandoned_through = max(self.abandoned_through, checkpoint_step(name))
        if self.is_global_main:
            return
        marker = json.dumps({"node": self.node_rank, "reason": reason, "skipped": skipped})
        try:
            self.store.child(name).write_text(gave_up_marker(self.node_rank), marker)
        except Exception as error:  # noqa: BLE001 - the chief then waits out peer_timeout
            logger.warning("could not tell the chief that %s is abandoned: %s", name,
                           brief(error))  # fmt: skip

    def _publish(self, snapshot: Path) -> None:
        """Upload this node's part, then its done-marker (a peer) or the manifest (the chief,
        which needs no marker of its own on a single node: the manifest says all of it)."""
        started = time.monotonic()
        target = self.store.child(snapshot.name)
        entries = target.upload(snapshot)
        if not self.is_global_main or self.num_nodes > 1:
            marker = json.dumps({"node": self.node_rank, "files": [asdict(e) for e in entries]})
            target.write_text(f"{NODE_MARKERS}/node-{self.node_rank}.json", marker)
        logger.info("node %d uploaded %s (%d files) in %.1fs", self.node_rank, snapshot.name,
                    len(entries), time.monotonic() - started)  # fmt: skip
        if self.is_global_main:
            self._write_manifest(target, snapshot.name, entries)

    def _write_manifest(self, target: Store, name: str, own: list[FileEntry]) -> None:
        """The manifest of every node's files: the chief's own as it verified them, the
        peers' from their markers (read side by side), checked against the store."""
        entries = {entry.path: entry for entry in own}
        if self.num_nodes > 1:
            self._wait_for_nodes(target, name)
            peers = range(1, self.num_nodes)
            with ThreadPoolExecutor(TRANSFER_THREADS) as pool:
                markers = list(pool.map(
                    lambda node: target.read_text(f"{NODE_MARKERS}/node-{node}.json"), peers
                ))  # fmt: skip
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

    def _wait_for_nodes(self, target: Store, name: str) -> None:
        """Until every node's done-marker of `name` is there; `PeerGaveUp` when a node
        says its part will not come, TransferError after `peer_timeout`."""
        deadline = time.monotonic() + self.peer_timeout
        while missing := self._parts_to_come(target, name):
            if time.monotonic() > deadline:
                raise TransferError(f"nodes {missing} did not finish uploading {name}")
            time.sleep(PEER_POLL_SECONDS)

    def _parts_to_come(self, target: Store, name: str) -> list[int]:
        """The nodes whose done-marker of `name` is not there yet, looked up once; PeerGaveUp
        for the first that will not upload its part: from its gave-up marker, which says why,
        else from the step the ranks agreed it abandoned (`hear_peers`: the marker may never
        come)."""
        listed = target.child(NODE_MARKERS).list_files()
        missing = [r for r in range(self.num_nodes) if f"node-{r}.json" not in listed]
        for node in (node for node in missing if f"node-{node}{GAVE_UP_SUFFIX}" in listed):
            raise self._peer_word(target, name, node)
        step = checkpoint_step(name)
        for node in (node for node in missing if self._peers_abandoned[node] >= step):
            raise PeerGaveUp(name, node, PEER_WORD_BY_AGREEMENT, skipped=False)
        return missing

    @staticmethod
    def _peer_word(target: Store, name: str, node: int) -> PeerGaveUp:
        """What `node` wrote when it gave its part of `name` up: its reason, and whether it
        skipped the checkpoint (a newer one came first) rather than failed to upload it."""
        word = json.loads(target.read_text(gave_up_marker(node)) or "{}")
        return PeerGaveUp(name, node, word.get("reason", "?"), bool(word.get("skipped")))

    def _tidy(self, best: str | None) -> None:
        """The chief's retention after a checkpoint completed; its failure fails nothing. Left
        to the next checkpoint when one is queued, and undone on a stop."""
        if not self.is_global_main or self._hurried():
            return
        try:
            self._apply_retention(best)
        except Exception as error:  # noqa: BLE001 - the checkpoint is complete; retry next time
            logger.warning("could not tidy %s: %s", self.store.uri, brief(error))

    def _apply_retention(self, best: str | None) -> None:
        """`--save_total_limit` over complete checkpoints, after incomplete ones older than
        the newest complete are removed: a stop's checkpoint that missed the grace, a part
        abandoned for a peer. Nothing is still writing them: every node uploads in order, and
        all finished the newer one."""
        complete = complete_checkpoints(self.store)
        newest = checkpoint_step(complete[-1])
        for name in checkpoint_names(self.store):
            if self._hurried():
                return
            if checkpoint_step(name) < newest and name not in complete:
                self.store.child(name).delete()
                logger.info("deleted %s/%s (incomplete, older than %s)", self.store.uri, name,
                            complete[-1])  # fmt: skip
        if not self.keep:
            return
        doomed = [name for name in complete[: -self.keep] if name != best]
        for name in doomed:
            if self._hurried():
                return
            checkpoint = self.store.child(name)
            checkpoint.child(MANIFEST).delete()  # first: a half-deleted one is never complete
            checkpoint.delete()
            logger.info("deleted %s/%s (save_total_limit=%d)", self.store.uri, name, self.keep)

    def _hurried(self) -> bool:
        """Whether something more urgent than retention waits: a queued checkpoint, a stop."""
        return bool(self._pending) or self.stop_requested()
