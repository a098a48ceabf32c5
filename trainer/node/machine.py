"""What accelerators this node has, and what that implies for numeric precision.

`detect_hardware`, `gpu_evidence` and `shared_memory_bytes` read the machine; the checks
that decide what to do with their answers are pure functions, tested with made-up inputs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from trainer.common.errors import UserError
from trainer.settings.run_config import Hardware

DRIVER_VERSION_FILE = Path("/proc/driver/nvidia/version")
COMPAT_DIR = Path("/usr/local/cuda/compat")
"""Where the nvidia/cuda base image's `cuda-compat-<major>-<minor>` package puts CUDA's
forward-compatibility libcuda (trainer.launcher.cuda_driver puts it on LD_LIBRARY_PATH if
needed)."""
SHARED_MEMORY = Path("/dev/shm")


def detect_hardware() -> Hardware:
    import torch

    cpu_count = len(os.sched_getaffinity(0))
    shm = shared_memory_bytes()
    if not torch.cuda.is_available():
        return Hardware(gpu_count=0, gpu_name=None, compute_capability=None,
                        cpu_count=cpu_count, shm_bytes=shm)  # fmt: skip
    count = torch.cuda.device_count()
    capabilities = [torch.cuda.get_device_capability(i) for i in range(count)]
    memory = [torch.cuda.get_device_properties(i).total_memory for i in range(count)]
    return Hardware(
        gpu_count=count,
        gpu_name=torch.cuda.get_device_name(0),
        compute_capability=min(capabilities),
        cpu_count=cpu_count,
        shm_bytes=shm,
        gpu_memory_bytes=min(memory),
    )


@dataclass(frozen=True)
class GpuEvidence:
    """What says this node has NVIDIA GPUs, whether or not torch can use them."""

    device_files: tuple[str, ...]
    """Names of /dev/nvidia* entries (nvidia0, nvidiactl, nvidia-uvm, ...)."""
    driver_version: str | None
    """The first line of /proc/driver/nvidia/version; None when no driver is loaded."""
    torch_cuda: str | None
    """torch.version.cuda: the CUDA this torch build needs (None for a CPU build)."""


def gpu_evidence() -> GpuEvidence:
    import torch

    dev = Path("/dev")
    files = tuple(sorted(p.name for p in dev.glob("nvidia*"))) if dev.is_dir() else ()
    driver = None
    if DRIVER_VERSION_FILE.is_file():
        lines = DRIVER_VERSION_FILE.read_text(errors="replace").strip().splitlines()
        driver = " ".join(lines[0].split()) if lines else ""
    return GpuEvidence(files, driver, torch.version.cuda)


def expected_gpus(requested: int | None, evidence: GpuEvidence, env: Mapping[str, str]) -> int:
    """How many GPUs torch must see here: the worker pool's count, else 1 if a GPU device
    file exists (unless CUDA_VISIBLE_DEVICES is set empty or -1: CPU on purpose)."""
    cpu_on_purpose = env.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1")
    has_device = any(re.fullmatch(r"nvidia\d+", name) for name in evidence.device_files)
    return max(requested or 0, 1 if has_device and not cpu_on_purpose else 0)


def check_gpus_usable(
    visible: int, requested: int | None, evidence: GpuEvidence, env: Mapping[str, str]
) -> None:
    """Refuse to plan a CPU run on a node that was given GPUs torch cannot use: when CUDA cannot
    start (host driver older than the image's CUDA, driver not mounted), torch only warns and
    reports no GPU, and the launcher would train on CPU until the job times out, every GPU of
    the job billed."""
    expected = expected_gpus(requested, evidence, env)
    if visible >= expected:
        return
    asked = (
        f"This node's worker pool asked for {requested} GPU(s)"
        if requested
        else f"This node has GPU device files ({', '.join(evidence.device_files)})"
    )
    driver = evidence.driver_version or "none loaded (no /proc/driver/nvidia/version)"
    compat = str(COMPAT_DIR) in env.get("LD_LIBRARY_PATH", "").split(":")
    tried = (
        " CUDA's forward-compatibility libraries were in use and did not help either (they "
        "work on data-center GPUs only)."
        if compat
        else ""
    )
    raise UserError(
        f"{asked} but torch sees {visible}: CUDA cannot start. "
        f"NVIDIA driver: {driver}; torch.version.cuda: {evidence.torch_cuda}.{tried} "
        "The host driver must support that CUDA version (CUDA 13 needs driver 580 or newer): "
        "use a machine with a newer driver, or an image built for the node's CUDA."
    )


def shared_memory_bytes() -> int | None:
    """Size of /dev/shm (None if there is none): loader workers and NCCL use it."""
    try:
        stats = os.statvfs(SHARED_MEMORY)
    except OSError:
        return None
    return stats.f_frsize * stats.f_blocks
