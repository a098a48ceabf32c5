"""What the launcher found on this node (trainer/launcher/hardware.py detects it): one of
the inputs the run's configuration is resolved from."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hardware:
    gpu_count: int
    gpu_name: str | None
    compute_capability: tuple[int, int] | None
    cpu_count: int
    shm_bytes: int | None = None
    """The size of /dev/shm, where loader workers hand over batches (None: not present)."""
    gpu_memory_bytes: int | None = None
    """The smallest GPU's memory (None on a CPU node): what a training step must fit in."""

    @property
    def mixed_precision(self) -> str:
        """bf16 on Ampere and newer (compute capability 8.0+), fp16 on older GPUs, none on CPU."""
        if self.compute_capability is None:
            return "no"
        return "bf16" if self.compute_capability >= (8, 0) else "fp16"

    @property
    def supports_bf16(self) -> bool:
        return self.mixed_precision == "bf16"
