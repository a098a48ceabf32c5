"""A deadline for a node's start: its training processes run within --rdzv_timeout, or the node
gives up with one line instead of waiting for ever.

torchrun's agent starts the training processes after its rendezvous with the chief, meant to
fail after `--rdzv_conf timeout=T`; but its store client, connected to a chief address that
accepts and never answers (a wedged chief, a half-dead machine), waits indefinitely: a worker
restarted alone whose chief never came back waited 54 minutes with T at 30 until killed by hand
(docs/restarts.md). On Vertex AI such a replica holds its GPUs for nothing; one that exits
non-zero is restarted, with restartJobOnWorkerRestart the whole job with it, which is how a job
gets its nodes back together.

So the agent's process watches itself: once one of its children is a training process, the
deadline is over; if none is by T plus a margin (torch's own timeout, if it works, fires first
and says more), it prints one `error:` line and exits 1. No training process has run, so
nothing is lost.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from trainer.common.handoff import TRAINING_MODULE

MARGIN_SECONDS = 30
"""Past --rdzv_timeout, room for torch's own timeout to fire and report first."""
POLL_SECONDS = 1.0


def training_process_started() -> bool:
    """Whether a descendant of this process runs the training program (forked ones are the
    zygote's children; others, such as a compiler DeepSpeed probes at import, do not count)."""
    import psutil

    return any(is_training_process(p) for p in psutil.Process().children(recursive=True))


def is_training_process(process) -> bool:
    """Whether a (psutil) process runs the training program: started as a command, or forked
    from the zygote and named like one (its name, arguments and all, one item in `cmdline()`)."""
    import psutil

    try:
        return TRAINING_MODULE in " ".join(process.cmdline()).split()
    except psutil.Error:  # gone or unreadable: not a training process that runs
        return False


@dataclass
class StartDeadline:
    """Calls `expire` unless `started()` becomes true within `seconds`."""

    seconds: float
    started: Callable[[], bool]
    expire: Callable[[], None]
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    poll_seconds: float = POLL_SECONDS

    def watch(self) -> None:
        deadline = self.clock() + self.seconds
        while not self.started():
            if self.clock() >= deadline:
                self.expire()
                return
            self.sleep(self.poll_seconds)

    def start_watching(self) -> None:
        """Watch in a daemon thread: the agent's rendezvous blocks in C++ without the GIL."""
        threading.Thread(target=self.watch, name="start-deadline", daemon=True).start()


def give_up(node_rank: int, chief: str, rdzv_timeout: float) -> Callable[[], None]:
    """The end of a node whose training processes never started: one line, exit 1."""

    def expire() -> None:
        print(
            f"error: node {node_rank} started no training process within "
            f"{rdzv_timeout + MARGIN_SECONDS:g} s: its rendezvous with the chief at {chief} "
            f"did not complete (--rdzv_timeout {rdzv_timeout:g}); the chief is down, wedged "
            "or at another address. Exiting so that the job restarts its nodes together.",
            file=sys.stderr,
            flush=True,
        )
        os._exit(1)  # the agent's main thread is blocked in the rendezvous: no clean exit

    return expire
