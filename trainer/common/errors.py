"""The exception types the launcher turns into one line instead of a traceback.

Anything raised as `UserError` ("the user asked for something impossible") is printed as a
single line and ends the program with exit code 2, before any expensive work starts; raised
in the training processes (what only the loaded model or data shows), with 78
(trainer/common/exit_codes.py). `StorageUnavailable` is an outage found by the launcher's
checks: one line, exit 1, so that a restart tries again. Everything else is a bug and keeps
its traceback.
"""

from __future__ import annotations

import sys
from typing import NoReturn


class UserError(Exception):
    """Bad input: the message says what is wrong and what to do instead."""


class StorageUnavailable(Exception):
    """Storage did not answer the launcher's checks (a timeout, a 5xx, a dropped connection
    past every retry): not a configuration error, and a restart may find it back."""


def exit_with_error(line: object, exit_code: int) -> NoReturn:
    """The one `error:` line of a command-line tool (`trainer.predict`, `trainer.register`),
    then its exit code."""
    print(f"error: {line}", file=sys.stderr, flush=True)
    sys.exit(exit_code)
