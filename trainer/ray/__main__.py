"""`python -m trainer.ray [recipe.yaml] [flags]`: the run as a Ray Train job.

Before anything waits on the cluster: the cluster is reachable and runs this Ray, the
workers asked for fit its nodes, one of them reports its hardware, and the configuration is
resolved and its inputs checked as `python -m trainer` does (trainer/launcher/prepare.py).
Bad input is one `error:` line and exit code 2. Then a `TorchTrainer` runs the training
core in every worker (trainer/ray/worker.py); a failed worker makes Ray restart them all,
and the run resumes from the last complete checkpoint.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

from trainer.common.errors import UserError
from trainer.common.quiet import silence_known_noise

HELP_FLAGS = ("-h", "--help", "--help-all")
SUBMITTED_JOB_VARIABLE = "RAY_JOB_CONFIG_JSON_ENV_VAR"
"""Set by Ray's job supervisor in the driver of a submitted job (ray/dashboard/modules/job/
job_supervisor.py `_get_driver_env_vars`)."""
REPORTED = ("checkpoint_dir", "best_checkpoint", "model_dir", "epoch")
"""Of Ray's result metrics, besides the Trainer's train_* and eval_* ones, what is printed."""


def main(argv: list[str] | None = None) -> None:
    launched_at = time.time()
    argv = list(sys.argv[1:] if argv is None else argv)
    if set(HELP_FLAGS) & set(argv):
        print_help([a for a in argv if a not in HELP_FLAGS], "--help-all" in argv)
        return
    silence_known_noise()
    try:
        trainer, config = prepare(argv, launched_at)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        sys.exit(2)
    if trainer is not None:
        fit(trainer)


def fit(trainer) -> None:
    """Run the Ray Train job; its final metrics, or one line and exit code 1."""
    from ray.train.base_trainer import TrainingFailedError

    try:
        result = trainer.fit()
    except TrainingFailedError as error:
        cause = error.__cause__ or error
        print(f"error: the Ray Train run failed: {type(cause).__name__}: {cause}", flush=True)
        sys.exit(1)
    metrics = {k: v for k, v in result.metrics.items()
               if k in REPORTED or k.startswith(("eval_", "train_"))}  # fmt: skip
    print(f"ray: run finished; Ray Train results in {result.path}", flush=True)
    print(f"ray: final metrics {json.dumps(metrics, default=str, sort_keys=True)}", flush=True)


def prepare(argv: list[str], launched_at: float):
    """The checked TorchTrainer and configuration, or (None, config) for --dry_run."""
    # Imported here: ray, torch and the tasks load in seconds, which --help need not wait for.
    from trainer.common.cache import cache_dir
    from trainer.config.resolve import resolve_run
    from trainer.node.training_env import prepare_node, process_env
    from trainer.preflight.run_checks import check_run
    from trainer.ray.job import build_trainer, worker_hardware
    from trainer.ray.ray_cluster import connect, head_address, node_resources, plan_workers
    from trainer.ray.ray_flags import split_ray_flags

    asked, training_argv = split_ray_flags(argv)
    address = head_address(asked.address, os.environ)
    connect(address, os.environ)
    workers = plan_workers(asked, node_resources())
    hardware = worker_hardware(workers)
    config = resolve_run(training_argv, os.environ, hardware)
    refuse_secret_values(config)
    secrets = prepare_node(config, os.environ)
    checked = check_run(config, {**os.environ, **secrets})
    if SUBMITTED_JOB_VARIABLE in os.environ:
        leave_the_jobs_copy_of_the_project(config)
    handed_over, _ = config.without_secrets()  # Ray stores the loop's arguments
    worker_env = process_env(config, os.environ, cache_dir(os.environ), secrets)
    worker_env |= accelerate_launch_env(config)
    dry_run = config.launcher.dry_run
    for notice in [*config.notices, *checked.notices]:
        print(notice, file=sys.stderr if dry_run else sys.stdout, flush=True)
    if dry_run:
        description = {"workers": workers.__dict__, "hardware": hardware.__dict__,
                       "model": checked.model, "config": config.describe(),
                       "worker_env": worker_env}  # fmt: skip
        print(json.dumps(description, indent=2, default=str))
        return None, config
    print(
        f"ray: {workers.count} worker(s) of {workers.resources()} on {address} "
        f"(checks took {time.time() - launched_at:.1f} s)",
        flush=True,
    )
    trainer = build_trainer(config, handed_over.to_json(), workers, asked, worker_env, launched_at)
    return trainer, config


def refuse_secret_values(config) -> None:
    """Ray keeps a run's training-loop arguments (pickled into its storage path), so no
    secret value may travel in them: the workers read `--secret` references themselves
    (trainer/ray/worker.py), and a token given as a flag has no safe way there."""
    if config.training.hub_token:
        raise UserError(
            "--hub_token: a Ray run stores its arguments, so give the token as a reference, "
            "--secret HF_TOKEN=projects/P/secrets/S/versions/V, or as HF_TOKEN in the job's "
            "environment (python -m trainer.ray_submit --env_var HF_TOKEN)."
        )


def leave_the_jobs_copy_of_the_project(config) -> None:
    """A submitted job's driver and workers start in Ray's unpacked copy of the project
    (`runtime_env` working_dir), which Ray deletes while the job still runs (seen with Ray
    2.47: the driver's own `fit()` then fails in `os.getcwd()`). Outputs must not land
    there, and the driver leaves it before `fit()`."""
    output_dir = config.training.output_dir
    if not os.path.isabs(output_dir):
        raise UserError(
            f"--output_dir {output_dir}: a submitted Ray job runs in Ray's temporary copy of "
            "the project, deleted with the job: give an absolute path on the nodes (or a "
            "shared mount), and --checkpoint_dir/--model_dir gs://... for outputs that "
            "outlive the cluster."
        )
    os.chdir(tempfile.gettempdir())


def accelerate_launch_env(config) -> dict[str, str]:
    """What `accelerate launch` tells each process it starts (the plan's --mixed_precision
    and --use_deepspeed): the Trainer's accelerator reads it from the environment."""
    env = {"ACCELERATE_MIXED_PRECISION": config.mixed_precision,
           "ACCELERATE_DYNAMO_BACKEND": "NO"}  # fmt: skip
    if config.training.deepspeed is not None:
        env |= {"ACCELERATE_USE_DEEPSPEED": "true",
                "ACCELERATE_DEEPSPEED_CONFIG_FILE": config.training.deepspeed}  # fmt: skip
    return env


def print_help(argv: list[str], everything: bool) -> None:
    """The Ray entry's own flags, then every training flag as `python -m trainer --help`."""
    from trainer.command_line.help import render_help
    from trainer.command_line.parser import FlagParser
    from trainer.ray.ray_flags import RayArguments

    parser = FlagParser([RayArguments], add_help=False)
    parser.usage = "python -m trainer.ray [recipe.yaml] [Ray flags] [training flags]"
    print(parser.format_help().replace("optional arguments", "Ray flags"))
    print(render_help(argv, everything), end="")


if __name__ == "__main__":
    main()
