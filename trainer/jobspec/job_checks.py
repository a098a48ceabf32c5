"""The run a job spec's nodes will make, checked before its files are written, for both of
`python -m trainer.jobspec`'s training jobs (config.yaml's and every tuning trial's): no
secret in the spec, the run resolved and preflighted as the chief's launcher will on the
spec's machines (a /gcs/ recipe or DeepSpeed JSON read through Cloud Storage), and a
--spot job's warning when a micro-batch would outlast the stop grace."""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from trainer.command_line.recipes import RECIPES_DIR
from trainer.common.errors import UserError
from trainer.common.secrets import SECRET_FLAG_VARIABLES, looks_secret
from trainer.config.deepspeed import preset_names
from trainer.config.resolve import resolve_run
from trainer.jobspec.custom_job import JobSpecArguments, accelerator, container_args, node_env
from trainer.preflight.run_checks import check_run
from trainer.preflight.stop_grace import stop_grace_warning
from trainer.preflight.vertex_machines import machine_hardware
from trainer.settings.run_config import RunConfig
from trainer.storage.failure_kinds import brief
from trainer.storage.store import open_store


def refuse_secrets(options: JobSpecArguments, training_flags: list[str]) -> None:
    """A job spec is readable by everyone who can list the project's jobs, and lands in git:
    it may name secrets (`--secret NAME=projects/...`, resolved on the nodes), never hold one."""
    names = [item.split("=", 1)[0] for item in options.env]
    names += [flag.split("=", 1)[0] for flag in training_flags if flag.startswith("--")]
    for name in names:
        if looks_secret(name):
            flag = name.lstrip("-").replace("-", "_")
            variable = SECRET_FLAG_VARIABLES.get(flag, flag.upper())
            raise UserError(
                f"{name} looks like a secret, and a job spec is readable by everyone who can "
                "list the project's jobs: store it in Secret Manager and pass --secret "
                f"{variable}=projects/PROJECT/secrets/SECRET/versions/latest instead "
                "(docs/deploy.md)."
            )


def check_the_run(
    options: JobSpecArguments, training_flags: list[str], env: Mapping[str, str]
) -> tuple[RunConfig, dict]:
    """The run every node will make, resolved as the chief's launcher will, on the spec's
    machines (GPU type, count and memory; all nodes' world size), and checked by the same
    preflight (trainer/preflight/run_checks.py) but for what only a node can see: UserError
    for the first problem. A /gcs/ recipe or DeepSpeed JSON is read through Cloud Storage.
    Returns the run and the model's plan (parameters, memory and micro-batch time per GPU)."""
    if options.deepspeed not in preset_names() and not options.deepspeed.startswith("/gcs/"):
        raise UserError(
            f"--deepspeed {options.deepspeed} is neither a preset ({', '.join(preset_names())}) "
            "nor a /gcs/BUCKET/... path the nodes can read."
        )
    recipe = options.recipe
    if not recipe.startswith("/gcs/") and (
        Path(recipe).name != recipe or not (RECIPES_DIR / recipe).is_file()
    ):
        raise UserError(
            f"--recipe {recipe} is not shipped in the image: put it in trainer/recipes/ and "
            "rebuild the image, or upload it and give its /gcs/BUCKET/... path."
        )
    gpu, count = accelerator(options)
    hardware = machine_hardware(options.machine_type, gpu, count)
    chief_env = {**env, **node_env(options, count)}
    with tempfile.TemporaryDirectory() as folder:
        scratch = Path(folder)
        recipe, _, deepspeed, *flags = container_args(options, training_flags)
        argv = [read_here(recipe, scratch), "--deepspeed", read_here(deepspeed, scratch), *flags]
        config = resolve_run(argv, chief_env, hardware)
        if config.launcher.dry_run:
            raise UserError("--dry-run in a job spec would make every node exit without training.")
        skip_hub_check = options.skip_hub_check or config.launcher.skip_hub_check
        config = replace(config, launcher=replace(config.launcher, skip_hub_check=skip_hub_check))
        plan = check_run(config, chief_env, on_node=False).model
    return config, plan


def warn_of_spot_losses(options: JobSpecArguments, run: RunConfig, plan: dict) -> None:
    """With --spot, one `warning:` line (on stderr, beside the files written or compared with
    --check) when the plan's estimate of a micro-batch on the spec's GPU exceeds
    --stop_grace_seconds: a preemption would then lose the work since the newest complete
    checkpoint (trainer/preflight/stop_grace.py). Without --spot a SIGTERM is rare (a
    stopped job, a VM's maintenance), and the training processes warn on any job once they
    have timed their micro-batches."""
    warning = stop_grace_warning(run, plan) if options.spot else None
    if warning:
        print(warning, file=sys.stderr, flush=True)


def read_here(path: str, scratch: Path) -> str:
    """A file the nodes read through the bucket's mount (/gcs/BUCKET/...), copied into a
    folder of its own in `scratch` (a recipe and a DeepSpeed JSON may share a name) through
    Cloud Storage; any other path as it is."""
    if not path.startswith("/gcs/"):
        return path
    folder, name = path.rsplit("/", 1)
    try:
        text = open_store(folder).read_text(name)
    except UserError as error:  # no credentials: its line says what to do
        raise UserError(f"{path} cannot be read from here to check the job: {error}") from None
    except Exception as error:  # noqa: BLE001 - any storage failure
        raise UserError(
            f"{path} cannot be read from here to check the job ({brief(error)}): the nodes "
            "read it through the bucket's mount; check that it exists and your credentials "
            "can read it."
        ) from None
    if text is None:
        raise UserError(
            f"{path} does not exist: upload it first (gcloud storage cp FILE "
            f"gs://{path.removeprefix('/gcs/')})."
        )
    copy = Path(tempfile.mkdtemp(dir=scratch)) / name
    copy.write_text(text)
    return str(copy)
