"""How `python -m trainer.ray` plans its Ray Train workers (pure: made-up node resources);
the runs on a real cluster are tests/processes/test_ray_runs.py's."""

from __future__ import annotations

import pytest

from trainer.common.errors import UserError
from trainer.ray.ray_cluster import plan_workers
from trainer.ray.ray_flags import RayArguments

GPU_NODES = [{"CPU": 8, "GPU": 2}, {"CPU": 8, "GPU": 2}, {"CPU": 4}]


def test_workers_default_to_every_gpu_and_fit_node_by_node():
    workers = plan_workers(RayArguments(), GPU_NODES)
    assert (workers.count, workers.use_gpu, workers.resources()) == (4, True, {"CPU": 1, "GPU": 1})
    on_cpu = plan_workers(RayArguments(use_gpu=False), GPU_NODES)
    assert (on_cpu.count, on_cpu.resources()) == (3, {"CPU": 1})


@pytest.mark.parametrize(
    "asked",
    [
        RayArguments(num_workers=5),
        RayArguments(num_workers=2, gpus_per_worker=3),
        RayArguments(use_gpu=True, num_workers=1, cpus_per_worker=9),
    ],  # fmt: skip
)
def test_workers_the_nodes_can_never_hold_are_refused(asked):
    """3 GPUs per worker fit no node of 2, though the cluster has 4 in all."""
    with pytest.raises(UserError, match="cannot all be placed"):
        plan_workers(asked, GPU_NODES)
