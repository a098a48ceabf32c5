"""Where a run resumes: the newest complete checkpoint of its checkpoint location
(trainer/storage/checkpoints.py), `--resume PATH_OR_URI`, or nothing (`--resume never`),
fetched and verified on each node before training starts."""

from __future__ import annotations

from pathlib import Path

from trainer.common.errors import UserError
from trainer.settings.run_config import RunConfig
from trainer.storage.checkpoints import (
    MANIFEST,
    MANIFEST_UNPARSED,
    CheckpointUnreadable,
    find_resumable_checkpoint,
    parse_manifest,
    skipped_line,
)
from trainer.storage.failure_kinds import brief, disk_full, disk_line
from trainer.storage.store import StoredFilesDiffer, open_store
from trainer.training.distributed import ProcessPlace
from trainer.training.failures import MAX_LINE, MIN_CAUSE, RunFailed

RESUME_CHOICE_FILENAME = ".resume-from"


def checkpoint_to_resume(config: RunConfig, args, place: ProcessPlace) -> str | None:
    """The local path of the checkpoint to resume, fetched and verified, or None: found by each
    node's local main process (fetching what the node lacks), told the others in a local file.
    When the local main process fails (its line says why), the others stop without a line of
    their own: a RunFailed without a cause, which only local rank 0 would print."""
    if args.resume_from_checkpoint:
        return args.resume_from_checkpoint
    choice = config.outputs.resume
    if choice == "never":
        return None
    output_dir = Path(args.output_dir)
    choice_file = output_dir / RESUME_CHOICE_FILENAME
    with args.main_process_first(local=True, desc="looking for a checkpoint to resume"):
        if place.is_local_main:
            choice_file.unlink(missing_ok=True)  # an earlier run's choice is not this one's
            if choice == "auto":
                found = newest_readable_checkpoint(
                    config.locations.checkpoints, output_dir, say=place.is_global_main
                )
            else:
                found = explicit_checkpoint(choice, output_dir)
            output_dir.mkdir(parents=True, exist_ok=True)
            choice_file.write_text(str(found or ""))
        if not choice_file.exists():  # the local main process failed, and says why itself
            raise RunFailed("this node's local main process could not choose the checkpoint "
                            "to resume")  # fmt: skip
        path = choice_file.read_text() or None
    if path and place.is_global_main:
        print(f"resuming from {path}", flush=True)
    return path


def newest_readable_checkpoint(checkpoints: str, output_dir: Path, say: bool) -> Path | None:
    """`find_resumable_checkpoint`, with one line (if `say`) when newer checkpoints were
    passed over (`skipped_line`: a `warning:` when one is damaged), or one line when complete
    checkpoints may exist but cannot be read: starting from step 1 would lose them, and
    retention would delete them."""
    store, skipped = open_store(checkpoints), []
    try:
        found = find_resumable_checkpoint(store, output_dir, skipped)
        if skipped and say:
            print(skipped_line(checkpoints, skipped, found), flush=True)
        return found
    except CheckpointUnreadable as error:
        raise RunFailed(unreadable_line(error, checkpoints)) from error.__cause__


UNREADABLE_STOP = (
    "; the run stops before training, not from step 1 (nothing was trained or deleted): "
)


def unreadable_line(error: CheckpointUnreadable, checkpoints: str) -> str:
    """The line for checkpoints that exist but cannot be read, at most MAX_LINE characters:
    each location named once, the storage error's message (a 403 quotes its JSON body) cut
    to the room left, a full disk's line without the error (it would name the path again)."""
    cause = error.__cause__
    if disk_full(cause):
        what = disk_line(error.local, f"downloading {error.name or 'a checkpoint'}")
        return f"{what}{UNREADABLE_STOP}free space there (or use a larger disk)"
    where = f"{error.name} in {checkpoints}" if error.name else checkpoints
    head, tail = f"reading {where} failed (", f"){UNREADABLE_STOP}restart once it can be read"
    room = max(MAX_LINE - len(head) - len(tail), MIN_CAUSE)
    text = brief(cause) if cause is not None else "unknown"
    return head + (text if len(text) <= room else text[: room - 3] + "...") + tail


def explicit_checkpoint(location: str, output_dir: Path) -> Path:
    """`--resume PATH_OR_URI`: a complete checkpoint (one with a manifest), fetched here; a
    damaged one (its manifest does not parse, or its files are not what it lists) is refused
    with why, never skipped: it is the one asked for."""
    store = open_store(location)
    text = store.read_text(MANIFEST)
    entries = parse_manifest(text)
    if text is None:
        if not location.startswith("gs://") and Path(location).is_dir():
            return Path(location)  # a plain local Trainer checkpoint: trusted as given
        raise UserError(f"--resume {location}: no {MANIFEST} there, so not a complete checkpoint.")
    if entries is None:
        raise UserError(f"--resume {location}: {MANIFEST_UNPARSED}: the checkpoint is damaged.")
    local = output_dir / location.rstrip("/").rsplit("/", 1)[-1]
    try:
        store.download(local, entries)
    except StoredFilesDiffer as error:
        raise UserError(f"--resume {location}: {error.why}: the checkpoint is damaged.") from None
    return local
