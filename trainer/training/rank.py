"""The training program that `accelerate launch` starts in every process (`python -m
trainer.training.rank`), its configuration resolved and checked by the launcher and handed over
in the environment (trainer/common/handoff.py).

It turns the run's outcome into one line and an exit code torchrun and Vertex AI understand
(trainer/common/exit_codes.py): 0 done, 78 a configuration error (a UserError the launcher
could not check, such as a label or length that shows only in the loaded data or model), 75
preempted after saving, 1 anything else. Started without `python -m trainer`, which resolves
the configuration once per node, it says so (78 too).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
from typing import NoReturn

from trainer.common.errors import UserError
from trainer.common.exit_codes import CONFIG_ERROR_IN_TRAINING_EXIT_CODE, PREEMPTED_EXIT_CODE
from trainer.common.handoff import (
    LAUNCHED_AT_VARIABLE,
    RUN_CONFIG_VARIABLE,
    STOP_SAID_MARK,
    TRAINING_MODULE,
)
from trainer.common.log_lines import write_whole_lines
from trainer.common.quiet import silence_known_noise
from trainer.settings.run_config import RunConfig
from trainer.training.failures import (
    RunFailed,
    exit_after_the_line,
    report_failure,
    report_run_failed,
    without_secrets,
)
from trainer.training.preemption import Stopped, leave_mark
from trainer.training.run_end import remember_failure
from trainer.training.tracebacks import keep_traceback


def main() -> None:
    """`python -m trainer.training.rank`: a training process started as a fresh interpreter
    (where the node's zygote could not be used, trainer/launcher/zygote.py)."""
    run_rank(sys.argv[1:])
    end_done()


def forked_main(environment: dict[str, str]) -> None:
    """A training process forked from the node's zygote (trainer/training/preload.py), which
    imported the training stack already: it takes the agent's `environment` with what torchrun
    set for this process on top, a fresh interpreter's multiprocessing start method, its name
    in `ps` and its thread count (read from the environment when torch loaded, in the
    zygote). It returns when done: torchrun waits for a function's return value,
    and the process then ends with `os._exit` (multiprocessing), without the interpreter's
    teardown that `end_done` avoids."""
    from setproctitle import setproctitle

    set_by_torchrun = dict(os.environ)  # the zygote emptied its own once it had imported
    os.environ.clear()
    os.environ.update(environment | set_by_torchrun)
    multiprocessing.set_start_method(None, force=True)  # a fresh interpreter's (it says fork
    # server here): data loader workers are forked, their dataset not pickled
    setproctitle(f"{sys.executable} -m {TRAINING_MODULE}")
    if threads := os.environ.get("OMP_NUM_THREADS"):
        import torch

        torch.set_num_threads(int(threads))
    run_rank([])


def run_rank(flags: list[str]) -> None:
    """Train the handed-over run; a failure or stop ends the process with its line and code.
    `flags`: the program's own command line, which must be empty."""
    write_whole_lines()  # every rank of the node prints to the same stdout and stderr
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    silence_known_noise()  # before torch, DeepSpeed or datasets print anything
    launched_at = os.environ.get(LAUNCHED_AT_VARIABLE)
    config = None  # for the record of a failure that a restart would repeat
    try:
        config_json = os.environ.get(RUN_CONFIG_VARIABLE)
        if not config_json or flags:
            raise UserError(
                "the training program takes its configuration from python -m trainer "
                "(it resolves and checks the flags once per node): run python -m trainer "
                "with these flags instead."
            )
        # Imported after the noise filters above: importing torch, DeepSpeed and datasets
        # prints the warnings they filter.
        from trainer.training.run import train

        config = RunConfig.from_json(config_json)
        train(config, float(launched_at) if launched_at else None)
    except UserError as error:
        line = without_secrets(str(error))
        local_main = os.environ.get("LOCAL_RANK", "0") == "0"
        if local_main:
            print(f"error: {line}", file=sys.stderr, flush=True)
        remember_failure(config, error, line, CONFIG_ERROR_IN_TRAINING_EXIT_CODE)
        exit_after_the_line(CONFIG_ERROR_IN_TRAINING_EXIT_CODE, said=local_main)
    except RunFailed as error:
        said = report_run_failed(error, lambda cause: keep_traceback(cause, config))
        remember_failure(config, error, without_secrets(str(error)), 1)
        exit_after_the_line(1, said)
    except Stopped as stopped:
        end_stopped(stopped)
    except Exception as error:  # noqa: BLE001 - reported once here; the exit code tells torchrun
        line, said = report_failure(error, lambda cause: keep_traceback(cause, config))
        remember_failure(config, error, line, 1)
        exit_after_the_line(1, said)


def end_done() -> NoReturn:
    """Exit 0 without the interpreter's teardown. The run's work is settled by now (model
    delivered, uploads and TensorBoard synced, process group released), and the teardown
    destroys C++ threads that ZeRO-3 on CPU can leave joinable ("terminate called without an
    active exception", SIGABRT): torchrun then reports a delivered run as failed and stops
    the other ranks with SIGTERM, whose line would call it a preemption."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def end_stopped(stopped: Stopped) -> NoReturn:
    """The `preempted:` line (local rank 0), a mark for the node's agent that it was said
    (`STOP_SAID_MARK`), and exit 75. Not sys.exit: it would
    wait for the storage client's transfer threads, i.e. for an upload this process has
    given up on (its checkpoint keeps no manifest)."""
    if os.environ.get("LOCAL_RANK", "0") == "0":
        print(f"preempted: {stopped}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    leave_mark(STOP_SAID_MARK)
    os._exit(PREEMPTED_EXIT_CODE)


if __name__ == "__main__":
    main()
