"""Imported once per node, by the process its training processes are forked from: the training
stack (torch, transformers, PEFT, datasets, this package's training program), so that each
training process starts with it loaded instead of importing it for seconds.

The launcher starts that process first (trainer/launcher/zygote.py), and it imports this while
the launcher checks the run: the two imports overlap, and a training process costs a fork.
A process that has touched CUDA cannot fork processes that use it, so this process imports
only, with torch told to ask NVML rather than CUDA whether GPUs are there, and writes whether it
is still safe to fork from (`ZYGOTE_VERDICT_OK`, or why not) to the file its launcher named.

"""

from __future__ import annotations

import os
from pathlib import Path

import setproctitle

from trainer.common.handoff import ZYGOTE_VERDICT_OK, ZYGOTE_VERDICT_VARIABLE
from trainer.common.quiet import silence_known_noise

silence_known_noise()  # before the imports below print what it filters

import trainer.training.rank  # noqa: E402,F401 - the program each forked process runs
import trainer.training.run  # noqa: E402,F401 - what it imports when it starts


def fork_hazard() -> str | None:
    """Why a process forked from this one could not use CUDA, or None: CUDA initialised by an
    import (torch's own state), or the CUDA driver library loaded into it at all."""
    import torch

    if torch.cuda.is_initialized():
        return "an import initialised CUDA"
    maps = Path("/proc/self/maps")
    if maps.exists() and "libcuda.so" in maps.read_text():
        return "an import loaded the CUDA driver"
    return None


# setproctitle takes hold of the command line's memory here, while the environment is still
# where it looks for it: once cleared below, a forked process could not rename itself.
setproctitle.getproctitle()

if verdict := os.environ.get(ZYGOTE_VERDICT_VARIABLE):  # whole or not at all: the agent polls it
    Path(f"{verdict}.part").write_text(fork_hazard() or ZYGOTE_VERDICT_OK)
    os.replace(f"{verdict}.part", verdict)

os.environ.clear()  # a forked process finds in it only what torchrun set for it (rank.py)
