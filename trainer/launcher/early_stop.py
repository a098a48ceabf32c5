"""A SIGTERM to a node's agent before torchrun's own handler takes over: one line, exit 75.

From the launcher's hand-over to `accelerate launch` (run in its process) to the moment
torchrun starts the training processes, a stop has nothing of this attempt to save, but it
must still be heard and said, with the zygote's imports (trainer/launcher/zygote.py) ended
too. The rendezvous runs in torch's C++ store client, which retries through the interrupted
call while the Python handler waits for a main thread that does not come back (a worker whose
chief was not up kept waiting for --rdzv_timeout). So the agent installs `EarlyStop` before
anything slow, and a thread hears the signal through `signal.set_wakeup_fd` while the main
thread is inside C++.

Once torchrun installs its handler (just before it starts the training processes), the stop
is torchrun's: this watcher leaves it alone.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from collections.abc import Callable

from trainer.common.exit_codes import PREEMPTED_EXIT_CODE
from trainer.launcher.start_deadline import is_training_process
from trainer.launcher.zygote import discard_zygote, zygote_pid


class EarlyStop:
    """Ends the node on a SIGTERM that no training process can answer: `line()` is what it
    prints (it says what is kept). A training process started by accelerate itself (one
    process without DeepSpeed) gets the signal instead, and says what it saved."""

    def __init__(self, line: Callable[[], str]) -> None:
        self._line = line
        self._lock = threading.Lock()
        self._wakeup: tuple[socket.socket, socket.socket] | None = None

    def arm(self) -> None:
        """From the main thread, before anything slow: the handler, then the watcher."""
        signal.signal(signal.SIGTERM, self._on_signal)
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        self._wakeup = (reader, writer)
        threading.Thread(target=self._watch, name="early-stop", daemon=True).start()

    def _on_signal(self, signum, frame) -> None:
        self.stop()

    def _watch(self) -> None:
        """Hears every signal with a Python handler; acts on SIGTERM while the handler is
        this one (the main thread may be inside the rendezvous, where it cannot)."""
        reader = self._wakeup[0]
        while True:
            received = reader.recv(64)
            if signal.SIGTERM in received and signal.getsignal(signal.SIGTERM) == self._on_signal:
                self.stop()

    def stop(self) -> None:
        """Pass the stop on to this agent's children; with no training process among them,
        end the node with its line."""
        import psutil

        with self._lock:  # the handler and the watcher may both get here: one line
            agent = psutil.Process()
            training = [p for p in agent.children(recursive=True) if is_training_process(p)]
            others = [p for p in agent.children() if p.pid != zygote_pid()]  # it forks them
            for process in {*others, *training}:  # forked ones are the zygote's children
                try:
                    process.send_signal(signal.SIGTERM)
                except psutil.Error:  # gone already
                    continue
            if training:
                return
            print(self._line(), file=sys.stderr, flush=True)
            discard_zygote()
            os._exit(PREEMPTED_EXIT_CODE)
