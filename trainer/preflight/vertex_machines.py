"""The Vertex AI machines a job spec can ask for, and what a training node of each has: the
hardware `python -m trainer.jobspec` checks the run against (the launcher detects the same on
the node, trainer/node/machine.py). Sources: Vertex AI's "Configure compute resources for
custom training" (machine types, GPU counts, vCPUs) and NVIDIA's data sheets (compute
capability, memory as nvidia-smi reports it).
"""

from __future__ import annotations

import re

from trainer.common.errors import UserError
from trainer.settings.run_config import Hardware

MIB = 2**20

ACCELERATORS = {
    "NVIDIA_TESLA_T4": ("Tesla T4", (7, 5), 15360 * MIB),
    "NVIDIA_L4": ("NVIDIA L4", (8, 9), 23034 * MIB),
    "NVIDIA_TESLA_A100": ("NVIDIA A100-SXM4-40GB", (8, 0), 40960 * MIB),
    "NVIDIA_A100_80GB": ("NVIDIA A100-SXM4-80GB", (8, 0), 81920 * MIB),
    "NVIDIA_H100_80GB": ("NVIDIA H100 80GB HBM3", (9, 0), 81559 * MIB),
    "NVIDIA_H100_MEGA_80GB": ("NVIDIA H100 80GB HBM3", (9, 0), 81559 * MIB),
    "NVIDIA_H200_141GB": ("NVIDIA H200", (9, 0), 143771 * MIB),
}
"""Vertex AI accelerator type -> (the name torch reports, compute capability, memory)."""

T4_MACHINES = {f"n1-standard-{cpus}": ("NVIDIA_TESLA_T4", (1, 2, 4)) for cpus in (4, 8, 16, 32)}
T4_MACHINES.update({f"n1-standard-{cpus}": ("NVIDIA_TESLA_T4", (4,)) for cpus in (64, 96)})
GPU_MACHINES: dict[str, tuple[str, tuple[int, ...]]] = {
    **{f"a2-highgpu-{n}g": ("NVIDIA_TESLA_A100", (n,)) for n in (1, 2, 4, 8)},
    "a2-megagpu-16g": ("NVIDIA_TESLA_A100", (16,)),
    **{f"a2-ultragpu-{n}g": ("NVIDIA_A100_80GB", (n,)) for n in (1, 2, 4, 8)},
    "a3-highgpu-8g": ("NVIDIA_H100_80GB", (8,)),
    "a3-megagpu-8g": ("NVIDIA_H100_MEGA_80GB", (8,)),
    "a3-ultragpu-8g": ("NVIDIA_H200_141GB", (8,)),
    **{f"g2-standard-{cpus}": ("NVIDIA_L4", (1,)) for cpus in (4, 8, 12, 16, 32)},
    "g2-standard-24": ("NVIDIA_L4", (2,)),
    "g2-standard-48": ("NVIDIA_L4", (4,)),
    "g2-standard-96": ("NVIDIA_L4", (8,)),
    **T4_MACHINES,
}
"""Vertex AI machine type -> (accelerator type, accelerator counts it can have): only GPUs the
image's DeepSpeed ops are compiled for (TORCH_CUDA_ARCH_LIST in docker/ds-build.env: T4, A100,
L4, H100/H200). Add a row here (and its GPU to `ACCELERATORS`) for another machine."""

CPUS_PER_GPU = 4
"""vCPUs one GPU's training process needs: itself plus about three data-loader workers decoding
and batching (each `n1-standard` vCPU brings 3.75 GB of memory, so 15 GB per GPU). A T4 fed by
one vCPU waits for its data: n1-standard-4 offers 4 T4s, which its 4 vCPUs cannot feed."""


def default_gpu_count(machine_type: str, counts: tuple[int, ...]) -> int:
    """The GPUs a machine gets unless --accelerator_count says: the most it offers that its
    vCPUs can feed (`CPUS_PER_GPU`), for the machine types whose vCPUs the name gives
    (`n1-standard-N`, `g2-standard-N`); the others come with one GPU count each."""
    vcpus = re.fullmatch(r"[a-z0-9]+-standard-(\d+)", machine_type)
    fed = [count for count in counts if not vcpus or count * CPUS_PER_GPU <= int(vcpus[1])]
    return max(fed or counts[:1])


VCPUS = {"a2-megagpu-16g": 96, "a3-highgpu-8g": 208, "a3-megagpu-8g": 208, "a3-ultragpu-8g": 224}
"""vCPUs of the machine types whose name does not give them (a2: 12 per GPU)."""


def machine_vcpus(machine_type: str) -> int:
    named = re.fullmatch(r"[a-z0-9]+-standard-(\d+)", machine_type)
    if named:
        return int(named[1])
    gpus = re.fullmatch(r"a2-(?:high|ultra)gpu-(\d+)g", machine_type)
    return 12 * int(gpus[1]) if gpus else VCPUS[machine_type]


def resolve_accelerator(machine_type: str, gpu: str | None, count: int | None) -> tuple[str, int]:
    """The machine's accelerator type and count, or a UserError saying what would work."""
    if machine_type not in GPU_MACHINES:
        raise UserError(
            f"--machine_type {machine_type} is not in the GPU machine table "
            f"({', '.join(sorted(GPU_MACHINES))}); add it to GPU_MACHINES in "
            "trainer/preflight/vertex_machines.py."
        )
    offered, counts = GPU_MACHINES[machine_type]
    if gpu not in (None, offered):
        raise UserError(
            f"{machine_type} comes with {offered}, not {gpu}; pick a machine type that has {gpu}."
        )
    count = default_gpu_count(machine_type, counts) if count is None else count
    if count not in counts:
        fits = sorted(m for m, (g, c) in GPU_MACHINES.items() if g == offered and count in c)
        hint = f"use {' or '.join(fits)}" if fits else f"no machine type has {count} of them"
        raise UserError(
            f"{machine_type} offers {' or '.join(map(str, counts))} x {offered}, not "
            f"--accelerator_count {count} ({hint})."
        )
    return offered, count


def machine_hardware(machine_type: str, gpu: str, count: int) -> Hardware:
    """What a node of this machine type with `count` GPUs of type `gpu` has; /dev/shm is
    unknown until the node runs (its launcher fits the loader workers to it)."""
    name, capability, memory = ACCELERATORS[gpu]
    return Hardware(
        gpu_count=count,
        gpu_name=name,
        compute_capability=capability,
        cpu_count=machine_vcpus(machine_type),
        gpu_memory_bytes=memory,
    )
