"""`python -m trainer`: find the cluster, check every flag, then become `accelerate launch`.

Runs once per node (the container's entrypoint). It checks the node's CUDA driver, resolves
the run's configuration once (trainer/config/resolve.py), checks its inputs (so bad input
fails here, in seconds, before any process group or GPU is touched), builds the `accelerate
launch` command (trainer/launcher/plan.py), and replaces itself with it. `--dry-run` prints
the plan and the resolved configuration as JSON instead.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from trainer.common.cache import clear_orphaned_build_locks
from trainer.common.errors import StorageUnavailable, UserError
from trainer.common.exit_codes import CONFIG_ERROR_EXIT_CODE, PREEMPTED_EXIT_CODE
from trainer.common.handoff import LAUNCHED_AT_VARIABLE
from trainer.common.quiet import silence_known_noise
from trainer.common.secrets import mask, secret_values
from trainer.launcher.accelerate_launch import AGENT_MODULE, quiet_store_client
from trainer.launcher.accelerate_launch import main as run_agent
from trainer.launcher.cuda_driver import ensure_cuda_driver
from trainer.launcher.zygote import discard_zygote, start_zygote
from trainer.storage.run_records import RunAlreadyEnded

if TYPE_CHECKING:  # the plan's module loads torch, which must come after the driver check
    from trainer.launcher.plan import LaunchPlan

HELP_FLAGS = ("-h", "--help", "--help-all")
DRY_RUN_FLAGS = {"--dry-run", "--dry_run"}


def wait_for_name(
    host: str,
    timeout: float,
    resolve: Callable[[str], object] = lambda host: socket.getaddrinfo(host, None),
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Retry resolving `host` with backoff (1, 2, 4 ... 15 s) for `timeout` seconds, then one
    UserError: a worker may start before the chief, whose name resolves once its Service
    exists, and static rendezvous fails at once on a name that does not resolve."""
    deadline = clock() + timeout
    delay, attempt = 1.0, 1
    while True:
        try:
            resolve(host)
            return
        except OSError as error:
            remaining = deadline - clock()
            if remaining <= 0:
                raise UserError(
                    f"The chief's address {host} did not resolve within {timeout:g} s "
                    f"({attempt} attempt(s), last: {error}): the chief replica has not started "
                    "or its name is wrong; raise --chief_resolve_timeout if replicas start "
                    "further apart."
                ) from None
            print(f"waiting for the chief's address {host} to resolve ({error})", flush=True)
            sleep(min(delay, remaining))
            delay, attempt = min(delay * 2, 15.0), attempt + 1


def stopped_before_launch(signum, frame) -> None:
    """SIGTERM during the checks (a stopped job, a Spot preemption): nothing has started, so
    nothing is lost; one line rather than a silent death by signal. From the hand-over to
    `accelerate launch` on, the agent says it (trainer/launcher/early_stop.py)."""
    print("preempted: SIGTERM during the launcher's checks, before anything was launched: "
          "nothing was trained, nothing is lost", file=sys.stderr, flush=True)  # fmt: skip
    discard_zygote()
    os._exit(PREEMPTED_EXIT_CODE)


def main(argv: list[str] | None = None) -> None:
    launched_at = time.time()
    signal.signal(signal.SIGTERM, stopped_before_launch)
    argv = list(sys.argv[1:] if argv is None else argv)
    secrets = secret_values(argv, os.environ)  # kept out of every line printed below
    plan = None
    try:
        plan = checked_plan(argv, secrets)
    except UserError as error:
        print(f"error: {mask(str(error), secrets)}", file=sys.stderr, flush=True)
        sys.exit(CONFIG_ERROR_EXIT_CODE)
    except StorageUnavailable as error:  # an outage: exit 1, which a restart tries again
        print(f"error: {mask(str(error), secrets)}", file=sys.stderr, flush=True)
        sys.exit(1)
    except RunAlreadyEnded as ended:  # a restart of a job that delivered, or failed for good
        out = sys.stderr if ended.exit_code else sys.stdout
        print(mask(ended.line, secrets), file=out, flush=True)
        sys.exit(ended.exit_code)
    finally:
        if plan is None:  # nothing to launch: not the seconds of imports it would finish
            discard_zygote()
    if plan is not None:
        launch(plan, launched_at)


def checked_plan(argv: list[str], secrets: list[str]) -> LaunchPlan | None:
    """This node's checked launch plan, or None when nothing is to be launched (help, a
    dry run). The values of secrets it finds are added to `secrets`."""
    if set(HELP_FLAGS) & set(argv):
        # Imported here, not at the top: it loads the tasks (and with them torch),
        # which must not happen before the driver check of a real launch.
        from trainer.command_line.help import render_help

        print(render_help([a for a in argv if a not in HELP_FLAGS], "--help-all" in argv), end="")
        return None
    driver = ensure_cuda_driver(argv, os.environ)  # before torch loads; may start again
    if not DRY_RUN_FLAGS & {arg.split("=", 1)[0] for arg in argv}:
        start_zygote()  # it imports the training stack while this process checks the run
    silence_known_noise()  # the demo's assets are built here; the environment is inherited
    with quiet_store_client():  # torch loads in the checks; this process becomes the agent
        # Imported here, not at the top: it loads torch, which must come after the driver.
        from trainer.launcher.prepare import prepare_launch

        plan = prepare_launch(argv, os.environ)
    dry_run = plan.config.launcher.dry_run
    secrets += plan.secret_env.values()
    for notice in [driver, *plan.notices]:  # stdout is the plan's JSON in a dry run
        print(mask(notice, secrets), file=sys.stderr if dry_run else sys.stdout, flush=True)
    if dry_run:
        print(mask(json.dumps(plan.describe(), indent=2), secrets))
        return None
    topology = plan.config.topology
    if topology.role == "worker":
        wait_for_name(topology.master_addr, plan.config.launcher.chief_resolve_timeout)
    return plan


def launch(plan: LaunchPlan, launched_at: float) -> None:
    """Say where this node stands, then run `accelerate launch` in this process: its imports
    are this process's already, and its training processes are forked from the zygote."""
    topology = plan.config.topology
    print(
        f"node {topology.node_rank} of {topology.num_nodes} ({topology.role}), "
        f"{topology.nproc_per_node} process(es) per node, world size {topology.world_size}, "
        f"rendezvous {topology.master_addr}:{topology.master_port} "
        f"(launcher checks took {time.time() - launched_at:.1f} s)",
        flush=True,
    )
    if "TORCH_EXTENSIONS_DIR" in plan.env:
        for lock in clear_orphaned_build_locks(Path(plan.env["TORCH_EXTENSIONS_DIR"])):
            print(f"removed a build lock no process holds (a killed build left it): {lock}; "
                  "DeepSpeed's op is built again", flush=True)  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in plan.unset_env}
    env |= plan.env | plan.secret_env
    env[LAUNCHED_AT_VARIABLE] = str(launched_at)  # for the time-to-first-step line
    run_agent(plan.argv[plan.argv.index(AGENT_MODULE) + 1 :], env)
