"""Why a model did not load, in one line: what the server (trainer/serve/app.py) and
`python -m trainer.predict` print after "the model did not load: ".

transformers does not say it. Its pipeline tries every model class the config allows and
raises one ValueError holding each attempt's traceback (over a hundred lines for Whisper), and
a weights file this process may not read comes out of safetensors as "No such file or
directory". So the model's folder is looked at first, as this process sees it: a folder that
is missing or cannot be listed, no config.json or one that is not JSON, a file it cannot
open (a model saved by root, mounted into a server that is not), a safetensors file whose
header is damaged. Only when the folder shows nothing wrong does the line quote the error: the
last exception named in the tracebacks it holds, then its own first line.

Nothing heavy is imported: this runs after the load failed, whatever failed.
"""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path

MAX_CHARS = 268
"""The cause's length at most: with "error: the model did not load: " before it, the line
stays within 300 characters."""

MAX_FILES = 10_000
"""Files looked at in a model folder at most (a model has tens)."""

_RAISED = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Failure|Interrupt)): (.+)$")
"""The last line of a Python traceback: `SomeError: message`, not indented."""


def load_failure_line(error: BaseException, folder: str | os.PathLike | None) -> str:
    """One line of at most MAX_CHARS characters naming why the model in `folder` (a local
    model folder; None for one downloaded from gs://, whose files this process wrote) did
    not load with `error`."""
    cause = folder_problem(Path(folder)) if folder is not None else None
    return clipped(cause if cause is not None else error_summary(error))


def folder_problem(folder: Path) -> str | None:
    """What this process finds wrong with the model folder, or None."""
    try:
        if not folder.exists():
            return f"{folder} does not exist"
        if not folder.is_dir():
            return f"{folder} is not a folder"
        files = readable_files(folder)
    except OSError as failure:
        return f"cannot list {failure.filename or folder}: {reason(failure)}"
    unreadable = [(path, failure) for path, failure in files if failure is not None]
    if unreadable:
        return unreadable_line(unreadable)
    return content_problem(folder, [path for path, _ in files])


def unreadable_line(unreadable: list[tuple[Path, OSError]]) -> str:
    """The first file this process cannot open, how many more, and what to do."""
    path, failure = unreadable[0]
    more = f" (and {len(unreadable) - 1} more of its files)" if len(unreadable) > 1 else ""
    advice = ""
    if failure.errno in (errno.EACCES, errno.EPERM):
        advice = (
            f"; this process runs as uid {os.geteuid()}: make the model's files readable "
            "to it (chmod -R a+rX, on the host for a mounted folder)"
        )
    return f"cannot read {path}: {reason(failure)}{more}{advice}"


def content_problem(folder: Path, files: list[Path]) -> str | None:
    """A missing or unparsable config.json, or a damaged safetensors header, or None."""
    config = folder / "config.json"
    if not config.is_file():
        return f"{folder} holds no config.json"
    try:
        json.loads(config.read_bytes())
    except ValueError as bad:
        return f"{config} is not JSON ({bad})"
    for path in files:
        if path.suffix == ".safetensors" and (damage := safetensors_damage(path)):
            return f"{path} is damaged: {damage}"
    return None


def readable_files(folder: Path) -> list[tuple[Path, OSError | None]]:
    """Every file below `folder` (links followed), with the error opening it raised, if any."""
    found = []
    for root, dirs, names in os.walk(folder, onerror=raise_it, followlinks=True):
        dirs.sort()
        for name in sorted(names):
            path = Path(root) / name
            try:
                with open(path, "rb"):
                    failure = None
            except OSError as error:
                failure = error
            found.append((path, failure))
            if len(found) >= MAX_FILES:
                return found
    return found


def raise_it(error: OSError) -> None:
    raise error


def safetensors_damage(path: Path) -> str | None:
    """What is wrong with a safetensors file's header (8 bytes of its length, then JSON)."""
    size = path.stat().st_size
    with open(path, "rb") as weights:
        head = weights.read(8)
        if len(head) < 8:
            return f"{size} bytes, shorter than a header"
        length = int.from_bytes(head, "little")
        if length > size - 8:
            return f"its header claims {length} bytes, the file holds {size}"
        try:
            header = json.loads(weights.read(length))
        except ValueError:
            return "its header is not JSON"
    ends = [
        entry["data_offsets"][1]
        for name, entry in header.items()
        if name != "__metadata__" and isinstance(entry, dict) and "data_offsets" in entry
    ]
    if ends and 8 + length + max(ends) > size:
        return f"truncated: its tensors need {8 + length + max(ends)} bytes, it holds {size}"
    return None


def reason(failure: OSError) -> str:
    """`permission denied`, `no such file or directory`: the system's words, lower case."""
    words = failure.strerror or type(failure).__name__
    return words[0].lower() + words[1:]


def error_summary(error: BaseException) -> str:
    """The error's type and first line; when its message holds tracebacks (a pipeline that
    tried several model classes, the model's own class last), the last exception they end
    in comes first."""
    text = str(error)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    summary = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
    raised = [match.group(0) for line in text.splitlines() if (match := _RAISED.match(line))]
    if raised and raised[-1] not in summary:
        summary = f"{raised[-1]} ({summary})"
    return summary


def clipped(line: str) -> str:
    line = " ".join(line.split())
    return line if len(line) <= MAX_CHARS else line[: MAX_CHARS - 3] + "..."
