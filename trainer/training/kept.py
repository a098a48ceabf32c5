"""What a run has kept, said truthfully when it ends early: the newest complete checkpoint (read
from the store, after this node's uploads had their chance) and the model. `WhatIsKept.keeping`
alone decides how a run that ends early ends: every way (a failed evaluation, save, upload or
delivery; a stop; a crash; bad data found in training) leaves it with one line built here, so
the lines cannot disagree with each other or with the store.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from trainer.common.errors import UserError
from trainer.storage.checkpoints import CheckpointUploader, newest_complete_line
from trainer.storage.failure_kinds import brief
from trainer.training.callbacks import SaveOnStopOrInterval
from trainer.training.failures import MAX_LINE, RunFailed, is_peer_failure, root_cause
from trainer.training.preemption import EvaluationStopped, Stopped, StopRequest, stop_cause


class WhatIsKept:
    """One per process. `model` is set once the model is delivered."""

    def __init__(
        self,
        uploader: CheckpointUploader | None,
        checkpoints: str,
        grace: float,
        node: int,
        failure_wait: float,
    ) -> None:
        self.uploader = uploader
        self.checkpoints = checkpoints
        self.grace = grace
        self.failure_wait = failure_wait
        self.node = node
        """This process's node: where a SIGTERM it got came."""
        self.model: str | None = None
        self._stop: StopRequest | None = None
        self._waited_for: float | None = None
        self._step: str | None = None

    @contextmanager
    def keeping(self, stop: StopRequest) -> Iterator[None]:
        """Around the run from its first step to its end. SIGTERM is held throughout: whenever it
        comes, the step or model in hand is kept first, and the run ends with one `preempted:`
        line. Whatever else ends the run early gets the line of what is kept: a `RunFailed`
        (its message first), a `UserError` found by training (a stream past
        --max_bad_examples), a failure in a named `step` after delivery, or an unexpected
        exception (the line's end, as a note, for trainer/training/failures.py)."""
        self._stop = stop
        stop.install()
        try:
            yield
        except Stopped:
            raise
        except EvaluationStopped as stopped:  # the final evaluation, abandoned on a stop
            self.wait(since=stop.requested_at)
            raise Stopped(f"{stop_cause(stopped.origin_node)}: {self.line()}") from None
        except RunFailed as failed:
            raise self.failed(failed, self._step) from root_cause(failed)
        except UserError as error:
            line = self.line()
            stop.uninstall()
            raise UserError(f"{error}; {line}") from error
        except Exception as error:
            if self._step is not None:
                raise self.failed(error, self._step) from error
            if not is_peer_failure(error):  # uploads waiting for a dead node: not waited for
                self.wait()
            error.add_note(self.checkpoint_line())  # where a restart resumes
            stop.uninstall()  # a pending SIGTERM (torchrun stopping an echo) ends it now
            raise
        self.stop_if_requested(stop)
        stop.uninstall()

    @contextmanager
    def step(self, what: str) -> Iterator[None]:
        """A step after delivery whose failure is named in the line (`what` failed)."""
        self._step = what
        yield
        self._step = None

    def stop_if_requested(self, stop: StopRequest) -> None:
        """A SIGTERM that came after the ranks' last agreement (during the last save, the
        model's delivery or the last uploads): stop with what is kept."""
        if stop.requested:
            self.wait(since=stop.requested_at)
            raise Stopped(f"{stop_cause(self.node)} after training: {self.line()}")

    def stopped_after_saving(self, saver: SaveOnStopOrInterval, stop: StopRequest) -> Stopped:
        """After every rank saved an agreed stop's step: wait for this node's uploads up to
        `--stop_grace_seconds` from when this process learned of the stop, and say what was
        kept (the chief's upload ends with the manifest: "complete" there means resumable)."""
        learned_at = stop.requested_at if stop.requested else saver.agreed_at
        name = f"checkpoint-{saver.stopped_at_step}"
        cause = stop_cause(saver.stop_origin_node)
        if saver.stopped_at_step == 0:
            return Stopped(f"{cause}: during the first step; nothing was trained, so nothing "
                           "was saved")  # fmt: skip
        uploader = self.uploader
        if uploader is None:
            return Stopped(f"{cause}: every rank saved {name} locally")
        left = max(0.0, learned_at + self.grace - time.monotonic())
        done = uploader.wait_for(name, timeout=left)  # not the retention after it
        seconds = time.monotonic() - learned_at
        if not done:
            return Stopped(
                f"{cause}: {name} was not uploaded to {self.checkpoints} within {seconds:.1f} s "
                f"(--stop_grace_seconds {self.grace:g}); {self._resume_point()}"
            )
        what = "is complete" if uploader.is_global_main else "has this node's part"
        return Stopped(
            f"{cause}: {name} {what} in {self.checkpoints}, {seconds:.1f} s after the stop"
        )

    def _resume_point(self) -> str:
        """Where the job resumes after a stop whose checkpoint missed the grace, from what this
        node's uploader knows: no time is left to list a slow store (torchrun is about to
        stop the process). The chief's newest upload is complete (its manifest written)."""
        uploader = self.uploader
        if uploader is not None and uploader.is_global_main and uploader.uploaded:
            newest = f"{self.checkpoints.rstrip('/')}/{uploader.uploaded[-1]}"
            return f"the newest complete checkpoint is {newest}, where a restart resumes"
        return "the job resumes from the previous complete checkpoint"

    def wait(self, since: float | None = None) -> None:
        """Let this node's queued uploads finish.

        After a stop (`since`, or a SIGTERM that comes meanwhile) at most
        `--stop_grace_seconds` from it: torchrun stops a node's processes that much after
        the signal, so waiting longer would only be cut short. After a failure with no stop,
        nothing cuts the process short: checkpoints already saved get up to
        `--failure_upload_seconds` (a refused model upload must not also lose the last
        steps' checkpoints that were still uploading)."""
        started = time.monotonic()
        if self.uploader is None or self._waited_for is not None:
            return
        give_up_at = started + self.failure_wait
        while True:
            if since is None and self._stop is not None and self._stop.requested:
                since = self._stop.requested_at
            deadline = give_up_at if since is None else since + self.grace
            left = deadline - time.monotonic()
            if self.uploader.close(timeout=max(0.0, min(left, 1.0))) or left <= 1.0:
                break
        self._waited_for = time.monotonic() - started

    def checkpoint_line(self) -> str:
        """Where the newest complete checkpoint is, or that there is none and why."""
        uploader = self.uploader
        behind = self._uploads_behind()
        why = f" ({'; '.join(behind)})" if behind else ""
        why_none = None
        if uploader is not None and not uploader.submitted:
            why_none = why or " (no checkpoint was saved before this)"
        return newest_complete_line(self.checkpoints, why, why_none)

    def _uploads_behind(self) -> list[str]:
        """What this node's uploads left undone: the one still running, the failed ones."""
        uploader = self.uploader
        if uploader is None:
            return []
        behind = []
        if uploader.uploading is not None:
            waited = self._waited_for or 0.0
            behind.append(f"{uploader.uploading} was still uploading after {waited:.0f} s")
        return behind + [f"{name}'s upload failed ({uploader.errors[name]})"
                         for name in uploader.failures if name in uploader.errors]  # fmt: skip

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
        kept; raise it `from root_cause(error)`. The error's cause is cut to the room what is
        kept leaves of MAX_LINE."""
        kept = self.line()
        room = MAX_LINE - len(kept) - 2
        if what is not None:
            head = RunFailed(f"{what} failed (", brief(error), ")").within(room)
        else:
            head = error.within(room) if isinstance(error, RunFailed) else str(error)
        failure = RunFailed(f"{head}; {kept}")
        failure.rank_local = getattr(error, "rank_local", False)
        return failure
