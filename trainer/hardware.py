"""What accelerators this node has, and what that implies for numeric precision."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Hardware:
    gpu_count: int
    gpu_name: str | None
    compute_capability: tuple[int, int] | None
    cpu_count: int

    @property
    def mixed_precision(self) -> str:
        """bf16 on Ampere and newer (compute capability 8.0+), fp16 on older GPUs, none on CPU."""
        if self.compute_capability is None:
            return "no"
        return "bf16" if self.compute_capability >= (8, 0) else "fp16"

    @property
    def supports_bf16(self) -> bool:
        return self.mixed_precision == "bf16"


def detect_hardware() -> Hardware:
    import torch

    cpu_count = len(os.sched_getaffinity(0))
    if not torch.cuda.is_available():
        return Hardware(gpu_count=0, gpu_name=None, compute_capability=None, cpu_count=cpu_count)
    count = torch.cuda.device_count()
    capabilities = [torch.cuda.get_device_capability(i) for i in range(count)]
    return Hardware(
        gpu_count=count,
        gpu_name=torch.cuda.get_device_name(0),
        compute_capability=min(capabilities),
        cpu_count=cpu_count,
    )
