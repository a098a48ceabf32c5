"""The training processes' process group on CPU, destroyed before the interpreter exits
(release_process_group): left to the exit, gloo's threads can abort it. One distributed
state for all of them (trainer.training.distributed.use_gloo_on_cpu), in two real
processes: tests/processes/test_process_group_release_runs.py."""

from __future__ import annotations

import torch
import torch.distributed as dist
from accelerate import PartialState
from transformers import TrainingArguments

from tests.support.helpers import free_port
from trainer.training.distributed import release_process_group, use_gloo_on_cpu


def test_a_finished_process_releases_its_process_group_once():
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    try:
        total = torch.ones(1)
        dist.all_reduce(total)  # the group has been used, as training uses it
        release_process_group()
        assert not dist.is_initialized()
        release_process_group()  # nothing left to release: no error
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_one_process_started_without_torchrun_gets_the_state_its_arguments_ask_for(monkeypatch):
    """`--nproc_per_node 1 --deepspeed none` on CPU: accelerate starts the process itself (no
    LOCAL_RANK), and the run's TrainingArguments ask to use the configured state
    (trainer/config/resolve.py); without one they refuse, and the run ended with exit 78."""
    for name in ("LOCAL_RANK", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    PartialState._reset_state()
    try:
        use_gloo_on_cpu(ddp_timeout=60, deepspeed=False)
        arguments = TrainingArguments(
            output_dir="unused", accelerator_config={"use_configured_state": True}
        )
        assert arguments.device.type == "cpu" and arguments.world_size == 1
    finally:
        PartialState._reset_state()
