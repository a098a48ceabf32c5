"""What a node sets up for its training processes, whoever starts them (torchrun for the
CustomJob launcher, Ray Train for `python -m trainer.ray`): the values of the run's
`--secret` references, the demo's assets when the run is the demo, and the environment
variables every process gets."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from trainer.common.cache import torch_extensions_dir
from trainer.common.handoff import SECRET_VARIABLES_VARIABLE
from trainer.node.demo_assets import prepare_demo
from trainer.node.secret_manager import resolve_secrets
from trainer.settings.run_config import RunConfig
from trainer.tasks.registry import task_spec


def prepare_node(config: RunConfig, env: Mapping[str, str]) -> dict[str, str]:
    """Read the run's `--secret`s (before anything starts; their values by variable name), and
    build the demo's assets if it is the demo (on every node, once: nodes share no disk)."""
    secrets = resolve_secrets(config.launcher.secret, env)
    if config.demo is not None:
        prepare_demo(task_spec(config.task), config.demo)
    return secrets


def process_env(
    config: RunConfig, current_env: Mapping[str, str], cache_dir: Path, secrets: Iterable[str]
) -> dict[str, str]:
    """Variables for every training process of this node: unbuffered output, which variables hold
    secrets (failure reports mask them), on CPU DeepSpeed's CPU accelerator and its op."""
    env = {"PYTHONUNBUFFERED": "1"}
    if names := sorted(secrets):
        env[SECRET_VARIABLES_VARIABLE] = ",".join(names)
    if config.hardware.gpu_count == 0:
        env["DS_ACCELERATOR"] = "cpu"
        env["TORCH_EXTENSIONS_DIR"] = str(torch_extensions_dir(current_env, cache_dir))
    return env
