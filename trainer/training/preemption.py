"""Save when the machine is about to go away, and at least every N minutes.

A Spot VM gets a short notice before preemption, and a stopped job's containers get SIGTERM
(docs/restarts.md has sources and timings). Every process then finishes its step, and all must
save at the SAME step: a checkpoint spans every rank's files (DeepSpeed shards), so one rank
saving a step later makes it useless. So must a timed save (`--save_interval_minutes`), though
each rank's clock differs slightly.

So after every optimizer step the ranks agree in one small collective (`agree`, one MAX
all-reduce of two numbers, measured in bench/stop_flag.py): each contributes "a stop was
requested here" (its node rank + 1, so all learn where; the highest such node when several got
the signal), and rank 0 alone "the save interval has passed", its clock deciding for all. The
callback is `trainer.training.callbacks.SaveOnStopOrInterval`; this module holds what the
launcher needs too and imports no ML library.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

from trainer.common.handoff import STOP_REPORTS_VARIABLE, TRAINING_MARK


def stop_cause(node: int) -> str:
    return f"SIGTERM on node {node} (Spot preemption or a stopped job)"


class Stopped(Exception):
    """Training stopped on request after saving; the message says what was kept. The
    training program exits with PREEMPTED_EXIT_CODE and this one line."""


class EvaluationStopped(Exception):
    """Every rank agreed, between two evaluation batches, that a stop was requested: the
    evaluation is abandoned (it can take minutes; the notice is 30 s) so that the step can
    be saved in time. `origin_node`: where the signal came."""

    def __init__(self, origin_node: int) -> None:
        super().__init__(f"stop requested on node {origin_node} during an evaluation")
        self.origin_node = origin_node


class StopRequest:
    """Remembers a SIGTERM instead of dying from it, so the step in flight can finish. Installed
    just before training: earlier, there is nothing to save, and ending at once is right."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.requested_at: float | None = None

    def install(self) -> None:
        if not _in_main_thread():
            return
        signal.signal(signal.SIGTERM, self._on_signal)
        leave_mark(TRAINING_MARK)  # the node's agent: a SIGTERM from now on is held

    def uninstall(self) -> None:
        """Back to the default, where SIGTERM ends the process at once: for a process that is
        failing (torchrun stops the echoes of a failure that way, trainer/training/failures.py)
        or has finished training. A SIGTERM that came meanwhile is delivered again now."""
        if not _in_main_thread():
            return
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if self.requested:
            os.kill(os.getpid(), signal.SIGTERM)

    def _on_signal(self, signum, frame) -> None:
        if self.requested_at is None:
            self.requested_at = self._clock()

    @property
    def requested(self) -> bool:
        return self.requested_at is not None


def leave_mark(kind: str) -> None:
    """A file in the node's agent's directory (trainer/common/handoff.py
    STOP_REPORTS_VARIABLE): what this process did, for the agent's line after a SIGTERM."""
    if reports := os.environ.get(STOP_REPORTS_VARIABLE):
        Path(reports, f"{kind}{os.environ.get('RANK', '0')}").touch()


def agree(values: list[float]) -> list[float]:
    """The element-wise largest of every rank's values (the values themselves alone)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return values
    from accelerate import PartialState

    tensor = torch.tensor(values, dtype=torch.float64, device=PartialState().device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()


def gather_objects(value: object) -> list:
    """Every rank's `value` (picklable), in rank order: for the rare moment when ranks
    must share more than numbers (which rank failed, and how)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [value]
    values: list = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def _in_main_thread() -> bool:
    """Only the main thread may set signal handlers. Ray Train runs the training function
    in a thread of its worker (python -m trainer.ray), and stops its workers itself: there
    the SIGTERM handling is Ray's."""
    return threading.current_thread() is threading.main_thread()
