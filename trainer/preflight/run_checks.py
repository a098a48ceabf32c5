"""Every check of a resolved run that needs no GPU, made before anything is launched, by
every way in: the CustomJob launcher on each node (trainer/launcher/prepare.py),
`python -m trainer.ray` before `fit()`, and `python -m trainer.jobspec` before it writes a
job spec (for the spec's machines). They run the code training runs: the task's own input
checks, the training processes' TrainingArguments (trainer/preflight/training_checks.py),
the model's plan against the GPU (trainer/preflight/model_plan.py), the Hub's answer about
each uncached id (trainer/preflight/hub_checks.py).

What only a node can see is checked on the node: its data paths (local, `/gcs/`, a gs://
copy), its output locations and who owns them, the Hub token it will write with. The
node's own hardware (driver, GPUs visible, /dev/shm) is trainer/node's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from trainer.preflight.hub_checks import check_hub_ids, check_hub_writes, hub_ids
from trainer.preflight.model_plan import plan_model
from trainer.preflight.training_checks import check_training_arguments
from trainer.registry.permission import check_register_permission
from trainer.registry.run_registration import run_registration
from trainer.settings.run_config import RunConfig
from trainer.storage.locations import check_output_locations
from trainer.storage.run_records import RunIdentity, check_ownership, claim
from trainer.tasks import build_task
from trainer.tasks.base import Task


@dataclass(frozen=True)
class Preflight:
    """What the checks found, for the way in to show: the model's plan (parameters, memory
    per GPU) and notice lines about the data (one half of a sentence pair, say)."""

    model: dict
    notices: tuple[str, ...] = ()


def check_run(config: RunConfig, env: Mapping[str, str], on_node: bool = True) -> Preflight:
    """UserError (one line) for the first check that fails; else what the checks found
    (`Preflight`). `on_node` false (`trainer.jobspec`, before the job exists) leaves to the
    node what only it can see; a dry run reads and writes no output location. The output
    locations come first: a restart of a job whose run already ended stops there
    (`RunAlreadyEnded`) before fetching any dataset, and a directory another job owns is
    refused; the chief claims it for this job once every check has passed
    (trainer/storage/run_records.py)."""
    task = build_task(config)
    outputs = on_node and not config.launcher.dry_run
    chief_writes = outputs and config.topology.node_rank == 0
    identity = RunIdentity.from_env(env)
    owner = check_outputs(config, identity) if outputs else None
    check_registration(config, env, on_node, chief_writes)
    sources = task.sources()  # several when streams are interleaved
    notices = input_notices(sources) if on_node else []
    task.check_model()
    if not config.launcher.skip_hub_check:  # before the plan reads the model's config
        datasets = [source.data_args.dataset_name for source in sources]
        check_hub_ids(hub_ids_of(config, datasets), env, config.model.cache_dir)
    # before TrainingArguments: under ZeRO-3 they make every model built after them, even
    # on the meta device, a DeepSpeed-partitioned one
    model = plan_model(config, task, config_readable=on_node)
    args = check_training_arguments(config, packages_here=on_node)
    if on_node:  # a job spec's nodes write with their own token (--secret)
        check_hub_writes(args.push_to_hub, args.hub_token, env)
    if chief_writes:
        claim(config.locations.checkpoints, identity, owner)
    return Preflight(model, tuple(dict.fromkeys(notices)))  # interleaved sources may repeat one


def check_registration(
    config: RunConfig, env: Mapping[str, str], on_node: bool, chief_writes: bool
) -> None:
    """--register_model's settings; and on the chief of a run that writes its outputs, that
    the job's own credentials may register a model: found before training, not after it."""
    registration = run_registration(config, env, on_node=on_node)
    if registration is not None and chief_writes:
        check_register_permission(registration.place)


def input_notices(sources: list[Task]) -> list[str]:
    """Every data source's own input check (a node's data paths), and the notice lines they
    leave: one half of a sentence pair, say."""
    return [line for source in sources for line in source.check_inputs()]


def hub_ids_of(config: RunConfig, datasets: list[str | None]) -> list[tuple[str, str]]:
    """The Hub repositories the run reads: its model and every dataset it mixes."""
    ids = hub_ids(config.model.model_name_or_path, None)
    return ids + [repo for dataset in datasets for repo in hub_ids(None, dataset)]


def check_outputs(config: RunConfig, identity: RunIdentity):
    """The output locations can be written, and this job may use them; who owns them."""
    check_output_locations(config.locations)
    return check_ownership(
        config.locations.checkpoints, identity, config.outputs.resume_from_output_dir
    )
