"""Two checkouts side by side (`--baseline OTHER_CHECKOUT`), each running its own code.

A baseline is most easily a worktree of an older commit whose `.venv` is a link to this
checkout's: that environment's editable install imports this checkout's `trainer`, so each
checkout's processes put the checkout itself first on PYTHONPATH. Runs alternate between
the checkouts, run by run, so both see the same machine load.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def add_baseline_flag(parser: argparse.ArgumentParser) -> None:
    meaning = "another checkout, with its .venv (or a link to this one's)"
    parser.add_argument("--baseline", type=Path, help=meaning)


def compared(options: argparse.Namespace) -> dict[str, Path]:
    """This checkout, and the baseline when one is named, by the names the tables use."""
    checkouts = {"this checkout": REPO}
    if options.baseline:
        checkouts["baseline"] = options.baseline.resolve()
    return checkouts


def python(checkout: Path) -> str:
    return str(checkout / ".venv" / "bin" / "python")


def environment(checkout: Path, **variables: str) -> dict[str, str]:
    """This process's environment with `variables`, the checkout's code first."""
    return {**os.environ, **variables, "PYTHONPATH": str(checkout)}
