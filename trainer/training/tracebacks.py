"""Where a failing process's traceback goes: a file whose place the `error:` line names, not
the log.

The log's last line is the run's one true line (trainer/training/failures.py), and a
traceback before it would bury it among frames of torch and the Trainer, repeated per rank.
The traceback is for whoever debugs the cause: it goes to OUTPUT_DIR/logs/, and, when the
checkpoints are kept in Cloud Storage (a Vertex AI node's disk goes with the job), a copy goes
beside them under `debug/`. That copy is bounded by UPLOAD_SECONDS, since the failure may be
the storage's own: the line then names the local file.
"""

from __future__ import annotations

import os
import tempfile
import threading
import traceback
from pathlib import Path

from trainer.common.secrets import mask, secret_values
from trainer.settings.run_config import RunConfig

UPLOAD_SECONDS = 10.0
"""How long a failing process tries to copy its traceback to Cloud Storage."""


def traceback_text(error: BaseException) -> str:
    """The error's traceback, secrets masked (an exception's message may quote one)."""
    return mask("".join(traceback.format_exception(error)), secret_values([], os.environ))


def keep_traceback(error: BaseException, config: RunConfig | None) -> str | None:
    """Write the error's traceback to a file; return where to read it (None: nowhere, as on
    a full disk with the storage unreachable)."""
    name = f"traceback-rank{os.environ.get('RANK', '0')}.txt"
    text = traceback_text(error)
    folder = Path(config.training.output_dir if config else tempfile.gettempdir()) / "logs"
    where = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
        where = str((folder / name).resolve())
    except OSError:
        pass
    checkpoints = config.locations.checkpoints if config else ""
    if checkpoints.startswith("gs://") and _copied(checkpoints, name, text):
        where = f"{checkpoints.rstrip('/')}/debug/{name}"
    return where


def _copied(checkpoints: str, name: str, text: str) -> bool:
    """Whether the traceback reached `checkpoints/debug/name` within UPLOAD_SECONDS (on a
    daemon thread: a hung request must not hold the process's exit)."""
    from trainer.storage.store import open_store

    done: list[bool] = []

    def copy() -> None:
        try:
            open_store(checkpoints).child("debug").write_text(name, text)
            done.append(True)
        except Exception:  # noqa: BLE001 - the local file stands; the line names it
            pass

    worker = threading.Thread(target=copy, daemon=True, name="traceback-copy")
    worker.start()
    worker.join(UPLOAD_SECONDS)
    return bool(done)
