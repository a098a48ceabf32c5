"""Everything the launcher does before the exec, bar the CUDA driver check: it imports
torch, transformers and the tasks, so `trainer.launcher.main` imports it only after
choosing the driver (trainer/launcher/cuda_driver.py)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from trainer.common.cache import cache_dir
from trainer.config.cluster import requested_accelerators
from trainer.config.resolve import RunConfig, resolve_run
from trainer.launcher import hardware as node  # tests replace its detectors
from trainer.launcher.demo_assets import prepare_demo_assets
from trainer.launcher.hub_checks import check_hub_ids, check_hub_writes, hub_ids
from trainer.launcher.model_plan import plan_model
from trainer.launcher.plan import LaunchPlan, build_launch_plan
from trainer.launcher.secret_manager import resolve_secrets
from trainer.launcher.training_checks import check_training_arguments
from trainer.storage.locations import check_output_locations, resolve_output_locations
from trainer.storage.run_records import RunIdentity, check_ownership, claim


def prepare_launch(argv: list[str], env: Mapping[str, str]) -> LaunchPlan:
    """Everything before the exec: detect the hardware, resolve the run's configuration
    once, read its `--secret`s from Secret Manager, build the demo's assets if it is the
    demo, and check the configuration with the code the training processes will run (local
    data, the GCS dataset fetch and probes, their TrainingArguments, one Hub metadata call
    per uncached Hub id, Hub writes with --push_to_hub, writable destinations)."""
    hardware = node.detect_hardware()
    node.check_gpus_usable(
        hardware.gpu_count, requested_accelerators(env), node.gpu_evidence(), env
    )
    if hardware.gpu_count == 0:
        # As the plan sets for the training processes: the checks below import DeepSpeed,
        # which otherwise warns, on a node known to have no GPU, that it found none.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    config, secrets, model = resolve_and_check(argv, env, hardware)
    return build_launch_plan(config, env, cache_dir(env), secrets=secrets, model=model)


def resolve_and_check(
    argv: list[str], env: Mapping[str, str], hardware
) -> tuple[RunConfig, dict[str, str], dict]:
    """The run's configuration, its demo assets built and its inputs checked; the values of
    its `--secret`s; the model's plan (parameters, memory per GPU): what every way in (this
    launcher, `python -m trainer.ray`) does before anything is started."""
    config = resolve_run(argv, env, hardware)
    secrets = resolve_secrets(config.launcher.secret, env)  # --secret, before anything starts
    if config.demo is not None:  # built on every node (once; cached): nodes share no disk
        prepare_demo_assets(config.demo.model_dir.parent)
    model = check_inputs(config, {**env, **secrets})  # a gated model's with the secret HF_TOKEN
    return config, secrets, model


def check_inputs(config: RunConfig, env: Mapping[str, str]) -> dict:
    """What the configuration names exists and can be used, and the TrainingArguments the
    training processes will build pass the checks that would otherwise fail in them
    (trainer/launcher/training_checks.py), and the model fits the GPU
    (trainer/launcher/model_plan.py): UserError otherwise. A dry run makes every check but
    those of the output locations. Returns the model's plan (parameters, memory per GPU).

    The output locations come first: a restart of a job whose run already ended stops
    there (`RunAlreadyEnded`) before fetching any dataset, and a directory another job owns
    is refused; the chief claims the directory for this job once every check has passed
    (trainer/storage/run_records.py)."""
    flags = config.parsed()
    dry_run = config.launcher.dry_run  # a dry run reads and writes no output location
    identity = RunIdentity.from_env(env)
    if not dry_run:
        locations = resolve_output_locations(flags.outputs, env, flags.training.output_dir)
        check_output_locations(locations)
        owner = check_ownership(
            locations.checkpoints, identity, flags.outputs.resume_from_output_dir
        )
    sources = flags.task.sources()  # several when streams are interleaved
    for source in sources:
        source.check_inputs()
    if not config.launcher.skip_hub_check:  # before the plan reads the model's config
        ids = hub_ids(flags.model.model_name_or_path, None) + [
            repo for source in sources for repo in hub_ids(None, source.data_args.dataset_name)
        ]
        check_hub_ids(ids, env, flags.model.cache_dir)
    # before TrainingArguments: under ZeRO-3 they make every model built after them, even
    # on the meta device, a DeepSpeed-partitioned one
    model = plan_model(config, flags)
    args = check_training_arguments(flags, config.topology.world_size, config.hardware)
    check_hub_writes(args.push_to_hub, args.hub_token, env)
    if not dry_run and config.topology.node_rank == 0:
        claim(locations.checkpoints, identity, owner)
    return model
