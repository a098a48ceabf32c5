"""What a run has kept, said truthfully when it ends early: the newest complete checkpoint
(read from the store, after this node's uploads had their chance) and the model.

Every way a run can end before its normal end (a failed evaluation, save, upload or
delivery; a stop) ends with one line built here, so the lines cannot disagree with each
other or with the store.
"""

from __future__ import annotations

import time

from trainer.storage.checkpoints import CheckpointUploader, newest_complete_line
from trainer.storage.faults import brief
from trainer.training.failures import RunFailed


class WhatIsKept:
    """One per process. `model` is set once the model is delivered."""

    def __init__(self, uploader: CheckpointUploader | None, checkpoints: str, grace: float) -> None:
        self.uploader = uploader
        self.checkpoints = checkpoints
        self.grace = grace
        self.model: str | None = None
        self._waited_for: float | None = None

    def wait(self, since: float | None = None) -> float:
        """Let this node's queued uploads finish, for at most `--stop_grace_seconds` from
        `since` (now if not given): torchrun stops a node's processes that much after one
        of them ends, so waiting longer would only be cut short. Seconds waited."""
        started = time.monotonic()
        if self.uploader is not None and self._waited_for is None:
            deadline = (since if since is not None else started) + self.grace
            self.uploader.close(timeout=max(0.0, deadline - started))
            self._waited_for = time.monotonic() - started
        return time.monotonic() - started

    def checkpoint_line(self) -> str:
        """Where the newest complete checkpoint is, or that there is none and why."""
        uploader = self.uploader
        behind = []
        if uploader is not None and uploader.uploading is not None:
            behind.append(f"{uploader.uploading} was still uploading after {self.grace:g} s")
        if uploader is not None:
            behind += [f"{name}'s upload failed ({uploader.errors[name]})"
                       for name in uploader.failures if name in uploader.errors]  # fmt: skip
        why = f" ({'; '.join(behind)})" if behind else ""
        why_none = None
        if uploader is not None and not uploader.submitted:
            why_none = why or " (no checkpoint was saved before this)"
        return newest_complete_line(self.checkpoints, why, why_none)

    def line(self) -> str:
        """The checkpoint and the model, after this node's uploads had their chance."""
        self.wait()
        model = (
            f"; the trained model is saved at {self.model} (load it with from_pretrained)"
            if self.model
            else ""
        )
        return self.checkpoint_line() + model

    def failed(self, error: Exception, what: str | None = None) -> RunFailed:
        """`error` (or `what` failed, because of `error`) as a RunFailed saying what is
        kept; raise it `from root_cause(error)`."""
        head = str(error) if what is None else f"{what} failed ({brief(error)})"
        failure = RunFailed(f"{head}; {self.line()}")
        failure.rank_local = getattr(error, "rank_local", False)
        return failure
