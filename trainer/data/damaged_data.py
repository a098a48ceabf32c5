"""`DataFault`: training data found damaged while it is read (a shard whose bytes or example count
disagree with its index, a loader worker's part of a stream in which no example decodes).

Raised inside a training process, often in a DataLoader worker, and rank-specific (each process
reads its own shards), it is no `UserError` (printed by local rank 0 only, meaning "refused
before launch"): the training program reports it like any failure, from the rank that hit it,
as one `error:` line (trainer/training/failures.py), exit code 1.
"""

from __future__ import annotations

WORKER_MARKER = "Original Traceback"
"""torch's DataLoader re-raises a worker's exception as `type(error)(text)`, the text being
"Caught DataFault in DataLoader worker process N.\\nOriginal Traceback ...", ending with
the original `module.DataFault: message` line."""


class DataFault(Exception):
    def __init__(self, message: str) -> None:
        if WORKER_MARKER in message:
            # keep the worker's own message: the error line names the shard, not a traceback
            tail = message.rstrip().rsplit(f"{type(self).__name__}: ", 1)[-1]
            message = f"{tail} (in a DataLoader worker)"
        super().__init__(message)
