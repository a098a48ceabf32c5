"""The training processes' process group on CPU, destroyed before the interpreter exits
(release_process_group): left to the exit, gloo's threads can abort it. One distributed
state for all of them (trainer.training.distributed.use_gloo_on_cpu), in two real
processes: tests/processes/test_process_group_release_runs.py."""

from __future__ import annotations

import torch
import torch.distributed as dist

from tests.support.helpers import free_port
from trainer.training.distributed import release_process_group


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
