"""The node's zygote: the process its training processes are forked from, started first.

Each program of a launch used to import the same stack (torch, transformers, PEFT, datasets):
the launcher for its checks, then `accelerate launch`, then every training process, one after
the other, most of the time from `python -m trainer` to the first step (docs/benchmarks.md
"Where a launch's time goes"). Now the launcher starts a zygote before its checks, which
imports the training stack (trainer/training/preload.py) while the launcher checks; the launcher
then runs `accelerate launch` in its own process (trainer/launcher/accelerate_launch.py), and
torchrun's processes are forked from the zygote: torchrun's function entry point with Python's
`forkserver` start method, given the environment a command would have had.

A process that has initialised CUDA cannot fork processes that use it, so the zygote is a fresh
interpreter that only imports, and says whether it stayed safe to fork from; if not, or if it
could not start, the training processes start as fresh interpreters, as before, with a line
that says why.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import multiprocessing.forkserver as forkserver
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

from trainer.common.handoff import (
    FORKED_ENTRY,
    PRELOAD_MODULE,
    TRAINING_MODULE,
    ZYGOTE_VERDICT_OK,
    ZYGOTE_VERDICT_VARIABLE,
)

ZYGOTE_ENV = {
    "PYTORCH_NVML_BASED_CUDA_CHECK": "1",  # torch.cuda.is_available() without initialising CUDA
    "PYTHONUNBUFFERED": "1",  # nothing printed sits in a buffer that every fork would copy
}
TRACKER_QUIET = "ignore:resource_tracker:UserWarning"
"""For the zygote and multiprocessing's resource tracker started with it: torchrun's queues
and events for the forked processes are named semaphores, which the tracker removes at the
end of a run that a stop ended, with a warning after the node's last line ("There appear to
be 2 leaked semaphore objects")."""
_verdict: Path | None = None
"""The file the started zygote writes its verdict to."""
_not_started: str | None = None
"""Why the zygote could not be started, once that was tried."""


def start_zygote() -> None:
    """Start the zygote (Python's fork server, preloading the training stack) with this
    process's environment and `ZYGOTE_ENV`; it imports while this process goes on. A zygote
    that cannot start (its socket's path under a long TMPDIR, say) leaves the reason."""
    global _verdict, _not_started
    verdict = Path(tempfile.mkdtemp(prefix="trainer-zygote-")) / "verdict"
    warnings = ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"), TRACKER_QUIET]))
    variables = ZYGOTE_ENV | {ZYGOTE_VERDICT_VARIABLE: str(verdict), "PYTHONWARNINGS": warnings}
    try:
        with environment(variables):
            forkserver.set_forkserver_preload([PRELOAD_MODULE])
            forkserver.ensure_running()
    except OSError as error:
        shutil.rmtree(verdict.parent, ignore_errors=True)
        _not_started = f"the zygote could not start ({error})"
        return
    _verdict = verdict


def discard_zygote() -> None:
    """End the zygote once it forks nothing more (the launcher refused, the launch ended, a
    stop came before training): not the seconds of imports it would finish before noticing,
    and with it any process it forked that still runs, such as one that a stop caught as it
    started, before torchrun knew it (it would print a traceback after the node's last line
    or start training alone)."""
    import psutil

    if (pid := zygote_pid()) is None:
        return
    with contextlib.suppress(psutil.Error):
        zygote = psutil.Process(pid)
        for process in [*zygote.children(), zygote]:
            with contextlib.suppress(psutil.Error):
                process.kill()
    shutil.rmtree(_verdict.parent, ignore_errors=True)


def zygote_pid() -> int | None:
    """The running zygote's process id (the standard library keeps it on its fork server)."""
    return forkserver._forkserver._forkserver_pid if _verdict is not None else None


def fork_hazard() -> str | None:
    """None once the zygote has imported the training stack and stayed safe to fork from
    (waiting for it); else why the training processes start as fresh interpreters."""
    if _not_started is not None:
        return _not_started
    pid = zygote_pid()
    while not _verdict.exists():
        try:
            ended = os.waitpid(pid, os.WNOHANG) != (0, 0)
        except ChildProcessError:
            ended = True
        if ended:
            return "the zygote exited before it had imported the training stack"
        time.sleep(0.05)
    verdict = _verdict.read_text()
    shutil.rmtree(_verdict.parent, ignore_errors=True)
    return None if verdict == ZYGOTE_VERDICT_OK else f"in the zygote, {verdict}"


@contextlib.contextmanager
def training_processes_forked() -> Iterator[str | None]:
    """accelerate's launchers, their training processes forked from the zygote (started now if
    this process started none): torchrun's (DeepSpeed, several processes) through its function
    entry point, accelerate's own (one process without DeepSpeed) as one forked process; each
    given the environment its command would have had. Yields None, or why they start as fresh
    interpreters (nothing replaced); the zygote is ended after."""
    if _verdict is None and _not_started is None:
        start_zygote()
    if hazard := fork_hazard():
        discard_zygote()
        yield hazard
        return
    import accelerate.commands.launch as accelerate_commands
    import torch.distributed.run as torchrun

    try:
        with (
            replaced(torchrun, "elastic_launch", forked_elastic_launch(torchrun.elastic_launch)),
            replaced(accelerate_commands, "simple_launcher", forked_simple_launcher),
        ):
            yield None
    finally:  # its processes are done, however the launch ended
        discard_zygote()


def forked_elastic_launch(elastic_launch: Callable) -> Callable:
    """torchrun's `elastic_launch`, given the training program's command, starting its function
    instead, with the `forkserver` start method and this process's environment (accelerate
    has set its variables in it, as for the command)."""

    def launch(config, entrypoint):
        started = elastic_launch(replace(config, start_method="forkserver"), training_entry())
        return lambda *command_args: started(dict(os.environ))

    return launch


def forked_simple_launcher(args) -> None:
    """accelerate's `simple_launcher` (one process, without torchrun), the process forked."""
    from accelerate.utils import prepare_simple_launcher_cmd_env

    command, env = prepare_simple_launcher_cmd_env(args)
    process = multiprocessing.get_context("forkserver").Process(
        target=training_entry(), args=(env,), name="training process"
    )
    process.start()
    process.join()
    if process.exitcode != 0:  # as accelerate's: the agent reports it (accelerate_launch.py)
        raise subprocess.CalledProcessError(process.exitcode, command)


def training_entry() -> Callable[[dict[str, str]], None]:
    """The training program's function for a forked process (trainer/common/handoff.py)."""
    return getattr(importlib.import_module(TRAINING_MODULE), FORKED_ENTRY)


@contextlib.contextmanager
def replaced(module, name: str, value) -> Iterator[None]:
    """`module.name` is `value` for the block."""
    original = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, original)


@contextlib.contextmanager
def environment(variables: dict[str, str]) -> Iterator[None]:
    """`variables` set in this process's environment for the block, then as they were."""
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
