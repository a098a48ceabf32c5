"""What kind of failure a storage or disk error is, so that each gets the right answer.

Three kinds must never be confused (docs/storage.md, "When storage or the disk fails"):
- bytes proven wrong (a stored file whose size or CRC32C differs from its manifest): the
  checkpoint is skipped, an older one is tried;
- storage that refuses or cannot answer (403, 401, a bucket gone, an outage past every retry):
  nothing is proven about the checkpoint, so it is not skipped, and the run stops;
- a full local disk: retrying cannot help; the line names the disk and its free space.

Retrying a refusal or a full disk only delays the line that says what to fix, so `permanent`
tells the transfer loop in trainer/storage/store.py to stop at once.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path

DISK_FULL_MARKERS = ("no space left on device", "storagefull", "unexpected pos",
                     "file write failed")  # fmt: skip
"""How a full disk shows in messages that lost the errno: the OS's own text, safetensors' Rust
error ("IoError(Os { code: 28, kind: StorageFull, ... })"), and torch.save's zip writer, which
reports only that a write came short ("[enforce fail at inline_container.cc] ... unexpected
pos", or "PytorchStreamWriter failed writing file ...: file write failed")."""

REFUSALS = ("Forbidden", "Unauthorized", "PermissionDenied")
"""google.api_core exception names for requests the service will refuse again."""


def causes(error: BaseException) -> list[BaseException]:
    """The error and everything it was raised from or during, outermost first."""
    chain: list[BaseException] = []
    while error is not None and error not in chain:
        chain.append(error)
        error = error.__cause__ or error.__context__
    return chain


def disk_full(error: BaseException) -> bool:
    """Whether the error (or one it came from) is a write that found no space left."""
    for cause in causes(error):
        if isinstance(cause, OSError) and cause.errno == errno.ENOSPC:
            return True
        if any(marker in str(cause).lower() for marker in DISK_FULL_MARKERS):
            return True
    return False


def refused(error: BaseException) -> bool:
    """Whether storage refused the request for lack of permission (retries cannot help)."""
    return any(type(cause).__name__ in REFUSALS for cause in causes(error))


OUTAGES = ("ServerError", "TooManyRequests", "RetryError", "DeadlineExceeded", "Timeout",
           "ConnectionError", "TransportError", "TimeoutError")  # fmt: skip
"""Exception classes (google.api_core, requests, google.auth, builtins; subclasses count)
of a service that did not answer: an outage, which may pass."""


def unavailable(error: BaseException) -> bool:
    """Whether storage failed to answer (an outage), rather than refused or found nothing."""
    return any(kind.__name__ in OUTAGES for cause in causes(error) for kind in type(cause).__mro__)


def permanent(error: BaseException) -> bool:
    """Whether retrying the same transfer is pointless: a refusal or a full disk."""
    return refused(error) or disk_full(error)


def mount_point(path: Path) -> Path:
    """The mount point of the file system that holds `path` (or would, once created)."""
    path = Path(os.path.abspath(path))
    while not path.exists():
        path = path.parent
    while not os.path.ismount(path):
        path = path.parent
    return path


def megabytes(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


def disk_line(path: Path, writing: str) -> str:
    """'no space left on the disk ...': which disk, how much is free, what was written."""
    mount = mount_point(path)
    usage = shutil.disk_usage(mount)
    return (
        f"no space left on the disk mounted at {mount} ({megabytes(usage.free)} free of "
        f"{megabytes(usage.total)}) while {writing} to {path}"
    )


REQUEST_URL = re.compile(r" https?://\S*?(?=: |\s|$)")
"""A request's URL in a storage client's message (`403 POST http://host/upload/...?uploadType=
multipart: ...`): the line names the location already; the query may carry a signature."""
CLIENT_STATUS_TUPLE = re.compile(r":? \('Request failed with status code'.*\)$")
"""google-resumable-media's `('Request failed with status code', 403, 'Expected one of',
<HTTPStatus.OK: 200>)`, which the status code already says."""
BRIEF_LIMIT = 160


def brief(error: BaseException, limit: int = BRIEF_LIMIT) -> str:
    """`Type: message`, on one line and short enough for a report of at most a few hundred
    characters: without request URLs or the client's status tuple, cut at `limit`."""
    text = CLIENT_STATUS_TUPLE.sub("", REQUEST_URL.sub("", " ".join(str(error).split())))
    text = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
