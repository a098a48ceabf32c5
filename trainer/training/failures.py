"""How a training process reports a failure: once, in one line that says what failed.

torchrun would otherwise print a traceback from every rank plus its own error box, and a
failure after training would hide that the trained model is safe. The training program
(trainer/training/rank.py) routes its exceptions here.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from trainer.common.handoff import ECHO_LINE_MARK, STOP_REPORTS_VARIABLE
from trainer.common.log_lines import MAX_LINE
from trainer.common.secrets import mask, secret_values

MIN_CAUSE = 60
"""What is kept of an exception however long the rest of the line is."""


class RunFailed(Exception):
    """A failure whose message is the whole report: what failed, and where the newest complete
    checkpoint and the model are (or why there is none). Exit 1 (no tuning trial or pipeline
    may count it a success); printed by local rank 0, unless `rank_local` (this rank's alone).
    A message made of `head`, `cause` and `rest` can be cut in its cause alone (`within`),
    when what is kept is added after it."""

    rank_local = False
    cause_kept = MIN_CAUSE
    """What `within` keeps of the cause at least."""

    def __init__(self, head: str, cause: str = "", rest: str = "") -> None:
        super().__init__(f"{head}{cause}{rest}")
        self.parts = (head, cause, rest)

    def within(self, room: int) -> str:
        """The message in at most `room` characters if cutting its cause can make it so
        (`cause_kept` characters of it at least)."""
        head, cause, rest = self.parts
        return head + cut(cause, room - len(head) - len(rest), self.cause_kept) + rest


def root_cause(error: BaseException) -> BaseException | None:
    """What a report's traceback shows: a RunFailed's own cause, or the error itself."""
    return error.__cause__ if isinstance(error, RunFailed) else error


KeepTraceback = Callable[[BaseException], "str | None"]
"""Writes an error's traceback to a file and returns where (trainer/training/tracebacks.py)."""


def report_run_failed(error: RunFailed, keep: KeepTraceback) -> bool:
    """One line, the last a reader of the log sees; the cause's traceback goes to a file
    that the line before it names. Whether this process said it."""
    if os.environ.get("LOCAL_RANK", "0") == "0" or error.rank_local:
        if error.__cause__ is not None:
            say_where_the_traceback_is(keep(error.__cause__))
        print(f"error: {without_secrets(str(error))}", file=sys.stderr, flush=True)
        return True
    return False


def exit_after_the_line(code: int, said: bool, sleep=time.sleep) -> NoReturn:
    """Exit with `code`. A process that did not say the node's line (another one says it: the
    local main process, after keeping a traceback, say) first waits PEER_FAILURE_GRACE_SECONDS:
    torchrun ends every process of the node at the first exit it sees, and this one's would cut
    the line short (torchrun ends this one meanwhile, once the line's process has exited)."""
    if not said:
        sleep(PEER_FAILURE_GRACE_SECONDS)
    sys.exit(code)


def say_where_the_traceback_is(where: str | None) -> None:
    """A short line before the `error:` line, for whoever debugs the cause."""
    if where:
        print(f"the traceback of the error below is in {where}", file=sys.stderr, flush=True)


PEER_FAILURE_GRACE_SECONDS = 5.0
"""How long a process whose collective broke waits before reporting (see report_failure)."""


def report_failure(error: Exception, keep: KeepTraceback, sleep=time.sleep) -> tuple[str, bool]:
    """One `error:` line naming the failing process's rank, node and the exception (what
    torchrun's error box would stand in for), ended by the exception's notes (training adds
    where the newest complete checkpoint is), after a line naming where its traceback was
    kept; returns the line without `error: `. The exception's message is cut so that the line
    fits MAX_LINE: a request URL or a client's exception tuple must not push out where the
    work is. Also returns whether this process said it (see `says_the_node_line`).

    When one process fails, the others' collectives break too ("connection closed by peer"):
    echoes, not causes. Such a process waits a moment first; torchrun stops it meanwhile if the
    cause was on this node. If still alive, the cause was on another node (whose log has it; a
    dead machine prints nothing): one process of the node says so in one line, without the
    echo's traceback."""
    env = os.environ
    place = (
        f"rank {env.get('RANK', '0')} of {env.get('WORLD_SIZE', '1')} (node "
        f"{env.get('GROUP_RANK', '0')}, local rank {env.get('LOCAL_RANK', '0')})"
    )
    kept = "".join(f"; {without_secrets(note)}" for note in getattr(error, "__notes__", ()))
    if is_peer_failure(error):
        sleep(PEER_FAILURE_GRACE_SECONDS)
        line = fitted(error, lambda cause: (
            f"{place} stopped: another node's process or machine failed ({cause}); that "
            f"node's log says why{kept}"
        ), least=ECHO_KEPT)  # fmt: skip
        if said := says_the_node_line():
            print(f"error: {line}", file=sys.stderr, flush=True)
        return line, said
    say_where_the_traceback_is(keep(error))
    line = fitted(error, lambda cause: f"{place} failed: {cause}{kept}")
    print(f"error: {line}", file=sys.stderr, flush=True)
    return line, True


def says_the_node_line() -> bool:
    """Whether this echo, still running after its wait, says its node's line: the first of the
    node's processes to get here, by a file it creates in the agent's directory (the local main
    process where there is none). Not always the local main process: it may be waiting in a
    collective on this one, and see its break only when this one exits, when torchrun ends it
    too."""
    reports = os.environ.get(STOP_REPORTS_VARIABLE)
    if not reports:
        return os.environ.get("LOCAL_RANK", "0") == "0"
    try:
        os.close(os.open(Path(reports, ECHO_LINE_MARK), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def cut(text: str, room: int, least: int = MIN_CAUSE) -> str:
    """`text` cut with an ellipsis to `room` characters, `least` of them kept at least."""
    room = max(room, least)
    return text if len(text) <= room else text[: room - 1] + "…"


ECHO_KEPT = 24
"""What is kept at least of a broken collective's error, an echo of the cause (its type, the
start of its message): the line that names where the cause is, and what is kept, comes first."""


def fitted(error: BaseException, line_with: Callable[[str], str], least: int = MIN_CAUSE) -> str:
    """`line_with(cause)`, the cause (`Type: message` on one line, secrets masked) cut with an
    ellipsis so that the line fits MAX_LINE, keeping `least` characters of it at least."""
    cause = f"{type(error).__name__}: {' '.join(without_secrets(str(error)).split())}"
    return line_with(cut(cause, MAX_LINE - len(line_with("")), least))


def without_secrets(text: str) -> str:
    """`text` with the values of this process's secret variables (HF_TOKEN, those the
    launcher filled from --secret) masked: an exception's message may quote one."""
    return mask(text, secret_values([], os.environ))


PEER_FAILURE_MARKERS = ("connection closed by peer", "connection reset by peer", "broken pipe")


def is_peer_failure(error: Exception) -> bool:
    """Whether the error is a broken collective (another process died), not a cause."""
    import torch.distributed as dist

    kinds = tuple(
        kind
        for kind in (
            getattr(dist, "DistBackendError", None),
            getattr(dist, "DistNetworkError", None),
        )
        if kind is not None
    )
    text = str(error).lower()
    return isinstance(error, kinds) or any(marker in text for marker in PEER_FAILURE_MARKERS)
