"""`accelerate launch`, ending a failed run with one line instead of torchrun's error box.

The launcher execs this module in place of `accelerate.commands.launch` (same flags). When a
training process fails, torchrun's ChildFailedError box (one per node, in every node's log)
repeats the process's own `error:` line (trainer/training/failures.py). So a process that
reported itself (exit code 1, 78 or 75) gets no second report, and its code is this node's; one
that could not (killed by a signal: the OOM killer, a preempted machine) gets one `error:` line
naming its rank and node, and exit code 1. The same holds for a single process without
DeepSpeed, which accelerate starts itself (CalledProcessError instead). A node whose rendezvous
never completes gives up after --rdzv_timeout (trainer/launcher/start_deadline.py). After a
SIGTERM, a node whose processes were killed before they saved (none left its mark in the
`STOP_REPORTS_VARIABLE` directory) gets one `error:` line and exit code 1: 75 says saved.
A SIGTERM that comes before torchrun's own handler (`pass_on_the_stop`) is passed on to the
training process accelerate started itself, or ends a node that started none yet.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from trainer.common.exit_codes import CONFIG_ERROR_IN_TRAINING_EXIT_CODE, PREEMPTED_EXIT_CODE
from trainer.common.handoff import RUN_CONFIG_VARIABLE, STOP_REPORTS_VARIABLE
from trainer.common.log_lines import write_whole_lines
from trainer.launcher.start_deadline import (
    MARGIN_SECONDS,
    StartDeadline,
    give_up,
    training_process_started,
)
from trainer.settings.run_config import RunConfig
from trainer.storage.checkpoints import newest_complete_line

REPORTED_EXIT_CODES = (1, CONFIG_ERROR_IN_TRAINING_EXIT_CODE, PREEMPTED_EXIT_CODE)
"""trainer.training.rank printed the line itself (1: failure, 78: bad input found in training,
75: stopped on request after saving, trainer/training/preemption.py)."""


def main(argv: list[str] | None = None) -> None:
    from accelerate.commands.launch import launch_command, launch_command_parser
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    write_whole_lines()  # this agent's lines share the log with its training processes'
    args = launch_command_parser().parse_args(sys.argv[1:] if argv is None else argv)
    quiet_agent_failure_logs()
    watch_the_start(args)
    reports = Path(tempfile.mkdtemp(prefix="trainer-stop-reports-"))
    os.environ[STOP_REPORTS_VARIABLE] = str(reports)  # the training processes inherit it
    signal.signal(signal.SIGTERM, pass_on_the_stop)  # torchrun's replaces it when it starts
    try:
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
        # and waited for the training processes, which saved and said so themselves, or
        # were killed before they could (their stop took longer than torchrun waits).
        if any(reports.iterdir()):
            sys.exit(PREEMPTED_EXIT_CODE)
        print(f"error: {unreported_stop(args.machine_rank or 0)}", file=sys.stderr, flush=True)
        sys.exit(1)


def pass_on_the_stop(signum, frame) -> None:
    """SIGTERM to this process while no torchrun agent handles it: one process without
    DeepSpeed, which accelerate starts itself and would leave running, orphaned, to be
    killed unsaved with the container; or no training process yet. The first gets the
    signal, saves and says so (exit 75, or a killed process's line); the second means
    nothing of this attempt was trained: one line, exit 75."""
    import psutil

    children = psutil.Process().children()
    if not children:
        print("preempted: SIGTERM before the training processes started: nothing new was "
              "trained, nothing is lost", file=sys.stderr, flush=True)  # fmt: skip
        os._exit(PREEMPTED_EXIT_CODE)
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.send_signal(signal.SIGTERM)


def unreported_stop(node: int) -> str:
    """The line for a SIGTERM whose training processes ended without saying what they kept:
    killed before their step (or their start-up) ended, so nothing new was saved."""
    waited = os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT")  # set by the launcher's plan
    waited = f" ({waited} s: --stop_grace_seconds + 5)" if waited else ""
    return (
        f"SIGTERM on node {node}: the training processes were stopped before they saved "
        f"anything new, the step in flight (or their start-up) outlasting what torchrun "
        f"waits{waited}{what_is_kept()}"
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


def what_is_kept() -> str:
    """The end of a killed process's line, which is then the run's last word: where the newest
    complete checkpoint is, for the run whose configuration the launcher handed over in the
    environment (nothing without one)."""
    config_json = os.environ.get(RUN_CONFIG_VARIABLE)
    if not config_json:
        return ""
    checkpoints = RunConfig.locations_in(config_json).checkpoints
    return f"; {newest_complete_line(checkpoints)}"


def quiet_agent_failure_logs() -> None:
    """torchrun's agent logs each failed and each stopped worker at ERROR/WARNING level
    ("failed (exitcode: 1) local_rank: 1 ...", "Sending process ... closing signal"): the
    failure is reported once, above, instead. Its other logs keep their level."""
    import torch.distributed.elastic.multiprocessing.api as processes_api

    processes_api.logger.setLevel(logging.CRITICAL)


if __name__ == "__main__":
    main()
