"""`accelerate launch`, ending a failed run with one line instead of torchrun's error box.

The launcher runs this module's `main` in its own process in place of `accelerate.commands.launch`
(same flags), with the training processes forked from the node's zygote
(trainer/launcher/zygote.py); the plan's command runs it too. When a
training process fails, torchrun's ChildFailedError box (one per node, in every node's log)
repeats the process's own `error:` line (trainer/training/failures.py). So a process that
reported itself (exit code 1, 78 or 75) gets no second report, and its code is this node's; one
that could not (killed by a signal: the OOM killer, a preempted machine) gets one `error:` line
naming its rank and node, and exit code 1. The same holds for a single process without
DeepSpeed, which accelerate starts itself (CalledProcessError instead). A node whose rendezvous
never completes gives up after --rdzv_timeout (trainer/launcher/start_deadline.py). After a
SIGTERM the training processes' marks in the `STOP_REPORTS_VARIABLE` directory tell what
happened (`after_the_stop`): they said what they saved (75), or they were training and torchrun
killed them before they saved (one `error:` line, exit 1), or none had begun training (the
signal ended their start-up at once: one `preempted:` line, 75). A SIGTERM that comes before
torchrun's own handler (trainer/launcher/early_stop.py) is passed on to the training process
accelerate started itself, or ends a node that started none yet.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from trainer.common.exit_codes import CONFIG_ERROR_IN_TRAINING_EXIT_CODE, PREEMPTED_EXIT_CODE
from trainer.common.handoff import (
    RUN_CONFIG_VARIABLE,
    STOP_REPORTS_VARIABLE,
    STOP_SAID_MARK,
    TRAINING_MARK,
)
from trainer.common.log_lines import write_whole_lines
from trainer.launcher.early_stop import EarlyStop
from trainer.launcher.start_deadline import (
    MARGIN_SECONDS,
    StartDeadline,
    give_up,
    training_process_started,
)
from trainer.launcher.zygote import training_processes_forked
from trainer.settings.run_config import RunConfig
from trainer.storage.checkpoints import newest_complete_line

AGENT_MODULE = "trainer.launcher.accelerate_launch"
"""This module, as the launch plan's command names it (the launcher runs it in its process)."""

REPORTED_EXIT_CODES = (1, CONFIG_ERROR_IN_TRAINING_EXIT_CODE, PREEMPTED_EXIT_CODE)
"""trainer.training.rank printed the line itself (1: failure, 78: bad input found in training,
75: stopped on request after saving, trainer/training/preemption.py)."""


def main(argv: list[str] | None = None, environment: dict[str, str] | None = None) -> None:
    """`accelerate launch ARGV` (the command line's when None) in the `environment` the
    launcher planned (this process's when None)."""
    if environment is not None:
        os.environ.clear()
        os.environ.update(environment)
    write_whole_lines()  # this agent's lines share the log with its training processes'
    EarlyStop(lambda: f"preempted: {not_training_yet()}").arm()  # first: torch loads below
    with quiet_store_client():
        from accelerate.commands.launch import launch_command, launch_command_parser
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    args = launch_command_parser().parse_args(sys.argv[1:] if argv is None else argv)
    quiet_agent_failure_logs()
    watch_the_start(args)
    reports = Path(tempfile.mkdtemp(prefix="trainer-stop-reports-"))
    os.environ[STOP_REPORTS_VARIABLE] = str(reports)  # the training processes inherit it
    try:
        with training_processes_forked() as hazard:
            if hazard:
                print(f"the training processes start as fresh interpreters: {hazard}", flush=True)
            launch_command(args)
    except ChildFailedError as error:
        sys.exit(report(error, args.machine_rank))
    except subprocess.CalledProcessError as error:
        # One process without DeepSpeed: accelerate starts it itself, not through torchrun.
        signal_name = signal.Signals(-error.returncode).name if error.returncode < 0 else None
        where = f"rank 0 (node {args.machine_rank or 0}, local rank 0)"
        sys.exit(report_exit(error.returncode, signal_name, where))
    except SignalException:
        # This node got SIGTERM (a Spot preemption, a stopped job): torchrun passed it on
        # and waited for the training processes.
        sys.exit(after_the_stop(reports))


def after_the_stop(reports: Path) -> int:
    """The node's exit code after torchrun passed a SIGTERM on, from the marks its training
    processes left: said what they saved (75, their line stands); were training and did
    not say it (killed by torchrun after its wait: one `error:` line, 1); or none had begun
    training (the signal ended their start-up at once: nothing new was trained, 75)."""
    marks = [path.name for path in reports.iterdir()]
    if any(mark.startswith(STOP_SAID_MARK) for mark in marks):
        return PREEMPTED_EXIT_CODE
    if any(mark.startswith(TRAINING_MARK) for mark in marks):
        print(f"error: {unsaved_stop()}", file=sys.stderr, flush=True)
        return 1
    print(f"preempted: {not_training_yet()}", file=sys.stderr, flush=True)
    return PREEMPTED_EXIT_CODE


def not_training_yet() -> str:
    """The line for a SIGTERM that came before this node's training processes began training
    (before they started, or in their start-up: loading, resuming, converting): they held no
    stop, and there was nothing of this attempt to save."""
    config = handed_over()
    node = config.topology.node_rank if config else 0
    return (
        f"SIGTERM on node {node} before its training processes began training: nothing new "
        f"was trained{what_is_kept()}"
    )


def unsaved_stop() -> str:
    """The line for a SIGTERM whose training processes were training but ended without saying
    what they kept: torchrun killed them after its wait, the step in flight outlasting it."""
    config = handed_over()
    node = config.topology.node_rank if config else 0
    waited = os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT")  # set by the launcher's plan
    waited = f" ({waited} s: --stop_grace_seconds + 5)" if waited else ""
    return (
        f"SIGTERM on node {node}: torchrun killed the training processes after its "
        f"wait{waited}, before they saved the step in flight{what_is_kept()}"
    )


def watch_the_start(args) -> None:
    """Arm the start deadline with the rendezvous timeout the launcher put in the command."""

    conf = dict(item.split("=", 1) for item in (args.rdzv_conf or "").split(",") if "=" in item)
    if "timeout" not in conf:  # not launched by trainer.launcher.main: torch's defaults apply
        return
    timeout = float(conf["timeout"])
    chief = f"{args.main_process_ip}:{args.main_process_port}"
    expire = give_up(args.machine_rank or 0, chief, timeout)
    StartDeadline(timeout + MARGIN_SECONDS, training_process_started, expire).start_watching()


def report(error, node_rank: int | None) -> int:
    """Print the one line the failed process could not print; return the exit code."""
    rank, failure = error.get_first_failure()
    signal_name = failure.signal_name() if failure.exitcode < 0 else None
    where = f"rank {rank} (node {node_rank or 0}, local rank {failure.local_rank})"
    return report_exit(failure.exitcode, signal_name, where)


def report_exit(exitcode: int, signal_name: str | None, where: str) -> int:
    """The node's exit code for a training process that ended with `exitcode` (negative:
    killed by `signal_name`): its own when it reported itself, else 1 after one line."""
    if exitcode in REPORTED_EXIT_CODES:
        return exitcode
    if exitcode < 0:
        how = f"was killed by {signal_name}"
        if signal_name == "SIGKILL":
            how += " (out of memory? the kernel's OOM killer sends SIGKILL)"
    else:
        how = f"exited with code {exitcode}"
    print(f"error: training process {where} {how}{what_is_kept()}", file=sys.stderr, flush=True)
    return 1


def handed_over() -> RunConfig | None:
    """The run's configuration the launcher handed over in the environment (None when this
    agent was started some other way)."""
    config_json = os.environ.get(RUN_CONFIG_VARIABLE)
    return RunConfig.from_json(config_json) if config_json else None


def what_is_kept() -> str:
    """The end of the node's own line, which is then the run's last word: where the newest
    complete checkpoint is, read from the store within --stop_grace_seconds (a stopping
    container is killed soon after), for the handed-over run (nothing without one)."""
    config = handed_over()
    if config is None:
        return ""
    checkpoints = config.locations.checkpoints
    within = config.outputs.stop_grace_seconds
    found: list[str] = []
    reading = threading.Thread(
        target=lambda: found.append(newest_complete_line(checkpoints)), daemon=True
    )
    reading.start()
    reading.join(within)
    if found:
        return f"; {found[0]}"
    return (
        f"; {checkpoints} was not listed within {within:g} s: a restart resumes from its "
        "newest complete checkpoint"
    )


@contextlib.contextmanager
def quiet_store_client() -> Iterator[None]:
    """torch loaded without its C++ warnings, in this agent only: its store client prints
    a C++ stack trace when the chief's agent, which hosts the store, has exited first
    (torch's exit barrier race, pytorch/pytorch#69520: the run ended normally), and for each
    retry of a rendezvous interrupted by a signal. The training processes keep theirs."""
    if "TORCH_CPP_LOG_LEVEL" in os.environ:
        yield
        return
    os.environ["TORCH_CPP_LOG_LEVEL"] = "ERROR"
    try:
        yield
    finally:
        del os.environ["TORCH_CPP_LOG_LEVEL"]


def quiet_agent_failure_logs() -> None:
    """torchrun's agent logs each failed and each stopped worker at ERROR/WARNING level
    ("failed (exitcode: 1) local_rank: 1 ...", "Sending process ... closing signal",
    "Received 15 death signal"), and a traceback when its exit barrier loses the chief's
    store, which the chief's agent closes as it exits after the run (torch's race,
    pytorch/pytorch#69520: this node's processes had succeeded). Each ending is reported
    once, by the training processes or above, instead."""
    import torch.distributed.elastic.agent.server.api as agent_api
    import torch.distributed.elastic.multiprocessing.api as processes_api

    processes_api.logger.setLevel(logging.CRITICAL)
    agent_api.logger.setLevel(logging.CRITICAL)
    # Forked processes (trainer/launcher/zygote.py): "Terminating process ... via signal
    # SIGTERM" for the others when one fails.
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.CRITICAL)


if __name__ == "__main__":
    main()
