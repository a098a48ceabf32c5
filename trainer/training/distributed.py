"""This process's place among the run's processes, and the process group's start and end."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from accelerate import PartialState


@dataclass(frozen=True)
class ProcessPlace:
    """Where this process sits, from the variables torchrun sets for every worker."""

    node_rank: int
    num_nodes: int
    is_local_main: bool
    is_global_main: bool

    @classmethod
    def from_env(cls) -> ProcessPlace:
        env = os.environ
        world, local_world = int(env.get("WORLD_SIZE", "1")), int(env.get("LOCAL_WORLD_SIZE", "1"))
        return cls(
            # torchrun sets GROUP_RANK; Ray Train sets NODE_RANK (python -m trainer.ray)
            node_rank=int(env.get("GROUP_RANK", env.get("NODE_RANK", "0"))),
            num_nodes=max(1, world // local_world),
            is_local_main=env.get("LOCAL_RANK", "0") == "0",
            is_global_main=env.get("RANK", "0") == "0",
        )


def use_gloo_on_cpu(ddp_timeout: int, deepspeed: bool) -> None:
    """Without CUDA, accelerate leaves the backend unset and every rank thinks it is alone.

    Creating the process group over gloo before TrainingArguments exists (whose resolved
    `accelerator_config` has the Trainer use this state, see trainer/config/resolve.py) makes
    multi-process CPU runs (tests, demos) real. Without DeepSpeed the state must be told it is
    a CPU one: otherwise accelerate calls it DistributedType.NO, the Trainer never wraps the
    model in DDP, and each rank trains its own copy. With DeepSpeed it must not be (that would
    make it MULTI_CPU instead of DEEPSPEED). One process without DeepSpeed is started by
    accelerate itself, not torchrun (no LOCAL_RANK): it gets a CPU state of its own."""
    if torch.cuda.is_available():
        return
    if "LOCAL_RANK" not in os.environ:
        PartialState(cpu=True)
        return
    PartialState(cpu=not deepspeed, backend="gloo", timeout=timedelta(seconds=ddp_timeout))


def release_process_group() -> None:
    """Destroy the process group at a run's end, as torch asks: left to the interpreter's exit,
    gloo's threads can abort a finished process ("terminate called without an active
    exception", SIGABRT: pytorch/pytorch#179291), and torchrun reports a delivered run as
    failed. Only after success: failed peers may be in a collective."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
