"""One line, at the start of every multi-node run, with the fabric's measured speed.

Nodes that should talk over a fast fabric (GPUDirect-TCPX/TCPXO on A3, hundreds of GB/s)
but fall back to plain TCP (a few GB/s) still train, only many times slower; nothing else
says so until the bill does. A few all-reduces between all processes, before the first
step, cost seconds and give the number NCCL's own `all_reduce_perf` calls bus bandwidth
(the per-link rate, comparable across process counts: algorithm bandwidth x 2(n-1)/n).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from trainer.training.distributed import ProcessPlace

GPU_PAYLOAD_BYTES = 64 * 2**20
"""Large enough to reach a link's bandwidth rather than its latency (NCCL's tests plateau
from tens of MiB on)."""
CPU_PAYLOAD_BYTES = 4 * 2**20
"""CPU runs (gloo: tests, demos) measure the same way with less data."""
ROUNDS = 5


def report_fabric(place: ProcessPlace, args) -> None:
    """The inter-node all-reduce speed, measured by all processes, printed by the global main one;
    `args` makes the process group on first device use (the run's backend and timeout)."""
    args.device  # noqa: B018 (the property's side effect is the point)
    bandwidth, payload = measure_bus_bandwidth()
    if place.is_global_main:
        print(fabric_line(bandwidth, payload, place.num_nodes, dist.get_backend()), flush=True)


def measure_bus_bandwidth() -> tuple[float, int]:
    """All-reduce a payload `ROUNDS` times among all processes (a collective); (bus bandwidth in
    GB/s, payload bytes). The slowest process's time counts, as a step waits for it."""
    on_gpu = torch.cuda.is_available() and dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    payload = GPU_PAYLOAD_BYTES if on_gpu else CPU_PAYLOAD_BYTES
    tensor = torch.ones(payload // 4, dtype=torch.float32, device=device)
    dist.all_reduce(tensor)  # connections and buffers are set up on first use: not timed
    _wait(on_gpu)
    start = time.perf_counter()
    for _ in range(ROUNDS):
        dist.all_reduce(tensor)
    _wait(on_gpu)
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    world = dist.get_world_size()
    algorithm_bandwidth = payload * ROUNDS / elapsed.item()
    return algorithm_bandwidth * 2 * (world - 1) / world / 1e9, payload


def fabric_line(bandwidth_gbs: float, payload: int, num_nodes: int, backend: str) -> str:
    return (
        f"fabric: all-reduce bus bandwidth {bandwidth_gbs:.2f} GB/s between {num_nodes} nodes "
        f"({backend}, {payload // 2**20} MiB x {ROUNDS}); plain TCP between GPU nodes gives a "
        "few GB/s, A3's GPUDirect fabric hundreds (docs/deploy.md)"
    )


def _wait(on_gpu: bool) -> None:
    if on_gpu:
        torch.cuda.synchronize()
    dist.barrier()
