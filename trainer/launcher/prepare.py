"""Everything the launcher does before the launch, bar the CUDA driver check: it imports
torch, transformers and the tasks, so `trainer.launcher.main` imports it only after
choosing the driver (trainer/launcher/cuda_driver.py)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace

from trainer.common.cache import cache_dir
from trainer.config.resolve import resolve_run
from trainer.config.topology import requested_accelerators
from trainer.launcher.plan import LaunchPlan, build_launch_plan
from trainer.node import machine  # tests replace its detectors
from trainer.node.training_env import prepare_node
from trainer.preflight.run_checks import check_run
from trainer.preflight.stop_grace import stop_grace_warning
from trainer.registry.run_registration import registered_on_restart
from trainer.storage.run_records import RunAlreadyEnded


def prepare_launch(argv: list[str], env: Mapping[str, str]) -> LaunchPlan:
    """Detect the hardware, resolve the run's configuration once, read its `--secret`s from Secret
    Manager, build the demo's assets if it is the demo, check the run with the code the
    training processes will run (trainer/preflight/run_checks.py), and plan the launch."""
    hardware = machine.detect_hardware()
    machine.check_gpus_usable(
        hardware.gpu_count, requested_accelerators(env), machine.gpu_evidence(), env
    )
    if hardware.gpu_count == 0:
        # As the plan sets for the training processes: the checks below import DeepSpeed,
        # which otherwise warns, on a node known to have no GPU, that it found none.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    config = resolve_run(argv, env, hardware)
    secrets = prepare_node(config, env)
    try:
        checked = check_run(config, {**env, **secrets})  # a gated model's with the secret HF_TOKEN
    except RunAlreadyEnded as ended:  # its model delivered: registered now if it was not
        raise registered_on_restart(ended, config, env) from None
    plan = build_launch_plan(config, env, cache_dir(env), secrets=secrets, model=checked.model,
                             notices=checked.notices)  # fmt: skip
    return with_stop_grace_warning(plan)


def with_stop_grace_warning(plan: LaunchPlan) -> LaunchPlan:
    """A dry run on a GPU node adds the plan's `warning:` when a micro-batch is estimated to
    outlast --stop_grace_seconds (trainer/preflight/stop_grace.py), whether or not the node is
    a Spot VM: the launcher cannot tell (Vertex AI tells a node nothing of its scheduling
    strategy), and a dry run is where a person previews the run, so it says what any SIGTERM
    (a preemption, a stopped job) would cost. A real launch does not: the training processes
    warn from their measured micro-batches after the first steps, and a guess printed by every
    node at every start and restart would only repeat, less exactly, what they say."""
    warning = stop_grace_warning(plan.config, plan.model) if plan.config.launcher.dry_run else None
    return replace(plan, notices=[*plan.notices, warning]) if warning else plan
