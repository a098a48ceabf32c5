"""The `accelerate launch` command and environment for this node, from the resolved run
configuration: a pure function, so the same configuration always gives the same command,
which is what the tests check. `--dry-run` prints it."""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trainer.common.handoff import RUN_CONFIG_VARIABLE, TRAINING_MODULE
from trainer.common.secrets import MASK
from trainer.launcher.accelerate_launch import AGENT_MODULE
from trainer.node.training_env import process_env
from trainer.settings.run_config import RunConfig

VERTEX_NODE_LEVEL_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
"""Vertex AI sets these per NODE; torchrun sets its own per PROCESS, so ours are dropped."""

SHUTDOWN_MARGIN_SECONDS = 5
"""On SIGTERM torchrun's agent passes the signal on to the training processes and kills
them TORCH_ELASTIC_SHUTDOWN_TIMEOUT seconds later (30 by default): the plan gives them
--stop_grace_seconds for their uploads plus this much to report and exit."""


@dataclass(frozen=True)
class LaunchPlan:
    config: RunConfig
    argv: list[str]
    env: dict[str, str]
    """Variables set for the launched processes (on top of the current environment); the
    resolved configuration among them."""
    unset_env: list[str]
    """Variables removed from the current environment before launching."""
    notices: list[str] = field(default_factory=list)
    """Lines for the log: what the launcher found and what it changed because of it."""
    secret_env: dict[str, str] = field(default_factory=dict, repr=False)
    """Secret variables for the launched processes (`--hub_token` as HF_TOKEN, `--secret`
    values): set like `env`, shown by name only."""
    model: dict | None = None
    """The model's plan (trainer/preflight/model_plan.py): trainable and total parameters,
    and a training step's estimated memory per GPU."""

    def describe(self) -> dict:
        topology = self.config.topology
        return {
            "topology": {**asdict(topology), "world_size": topology.world_size},
            "hardware": asdict(self.config.hardware),
            "config": self.config.describe(),
            "model": self.model,
            "command": self.argv,
            "env": {k: v for k, v in self.env.items() if k != RUN_CONFIG_VARIABLE}
            | {name: MASK for name in self.secret_env},
            "unset_env": self.unset_env,
            "notices": self.notices,
        }


def build_launch_plan(
    config: RunConfig,
    current_env: Mapping[str, str],
    cache_dir: Path,
    python: str = sys.executable,
    secrets: Mapping[str, str] | None = None,
    model: dict | None = None,
    notices: Sequence[str] = (),
) -> LaunchPlan:
    """The `accelerate launch` command and environment for this node (pure). `secrets`: the
    `--secret` variables' values (trainer/node/secret_manager.py); `model`: the dry run's plan;
    `notices`: the checks' lines, after the resolution's."""
    handed_over, secret_env = config.without_secrets()
    secret_env |= secrets or {}
    procs = config.topology.nproc_per_node
    env = process_env(config, current_env, cache_dir, secret_env) | {
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(
            math.ceil(config.outputs.stop_grace_seconds) + SHUTDOWN_MARGIN_SECONDS
        ),
        "OMP_NUM_THREADS": current_env.get(
            "OMP_NUM_THREADS", str(max(1, config.hardware.cpu_count // procs))
        ),
        RUN_CONFIG_VARIABLE: handed_over.to_json(),
    }
    unset = [name for name in VERTEX_NODE_LEVEL_VARIABLES if name in current_env]
    argv = accelerate_argv(config, python)
    return LaunchPlan(config, argv, env, unset, [*config.notices, *notices], secret_env, model)


def accelerate_argv(config: RunConfig, python: str) -> list[str]:
    """`accelerate launch` (through trainer.launcher.accelerate_launch, which ends a failed
    run in one line) with this node's place and the run's precision and DeepSpeed."""
    topology = config.topology
    argv = [
        python, "-m", AGENT_MODULE,
        "--num_machines", str(topology.num_nodes),
        "--machine_rank", str(topology.node_rank),
        "--num_processes", str(topology.world_size),
        "--main_process_ip", topology.master_addr,
        "--main_process_port", str(topology.master_port),
        "--mixed_precision", config.mixed_precision,
        "--dynamo_backend", "no",
        "--rdzv_backend", "static",
        "--rdzv_conf", f"timeout={config.launcher.rdzv_timeout}",
        "--max_restarts", "0",
    ]  # fmt: skip
    if config.training.deepspeed is not None:
        argv += [
            "--use_deepspeed",
            "--deepspeed_config_file", config.training.deepspeed,
            "--deepspeed_multinode_launcher", "standard",
        ]  # fmt: skip
    elif topology.world_size > 1:
        argv.append("--multi_gpu")
    return [*argv, "--module", TRAINING_MODULE]  # its flags come in RUN_CONFIG_VARIABLE
