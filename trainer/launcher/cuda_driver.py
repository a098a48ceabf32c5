"""Does this node's NVIDIA driver run the CUDA torch was built with? Decided before torch loads.

torch 2.13's wheels are CUDA 13.0 builds, which need an R580 driver or newer; Vertex AI nodes
may run an older branch (docs/deploy.md, "GPU drivers"). There nothing fails where the cause is
visible: torch reports no GPU, or a collective dies deep in DeepSpeed. So the launcher decides
first, from two cheap reads that load no CUDA: the kernel driver's version
(/proc/driver/nvidia/version) and the CUDA version of torch's wheel (its requirement on
NVIDIA's `cuda-toolkit` wheels, in the package metadata).
- New enough: CUDA runs natively.
- An older branch that CUDA's forward compatibility covers, with its libraries present (the
  `cuda-compat` package of the nvidia/cuda base image, data-center GPUs only): the launcher
  starts again with them first on LD_LIBRARY_PATH (read only when a process starts), inherited
  by every process it launches. Never on a new enough driver: an older libcuda on a newer
  kernel module fails (CUDA error 803), so the image cannot put them on everyone's path.
- Older still, or no compatibility libraries: one `error:` line, before anything starts.

`check_cuda_driver` is pure and is tested with made-up driver versions.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from trainer.common.errors import UserError
from trainer.node.machine import COMPAT_DIR, DRIVER_VERSION_FILE

NATIVE_DRIVER = {12: (525, 60, 13), 13: (580, 65, 6)}
"""Oldest Linux driver that runs each CUDA major version (minor version compatibility),
from NVIDIA's CUDA toolkit release notes."""

FORWARD_COMPATIBLE_BRANCH = {13: 535}
"""Oldest driver branch on which the launcher tries CUDA 13's forward-compatibility libraries:
R535, the oldest long-term-support branch in NVIDIA's matrix when CUDA 13 shipped (NeMo images
bridge CUDA 13 to R535 hosts the same way); older branches had reached their end of life."""


@dataclass(frozen=True)
class CudaCheck:
    line: str
    """What the launcher logs at start: driver, torch's CUDA, and how they meet."""
    use_compat: bool
    """True when CUDA must run through the forward-compatibility libraries."""


def parse_driver_version(proc_text: str) -> tuple[int, ...] | None:
    """`NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May ...` -> (535, 183, 1)
    (the kernel module: what CUDA's compatibility rules are about)."""
    match = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d+(?:\.\d+)+)", proc_text)
    return tuple(int(part) for part in match.group(1).split(".")) if match else None


def torch_cuda_version(torch_requirements: list[str]) -> tuple[int, int] | None:
    """The CUDA version of a torch wheel, from its requirements: `cuda-toolkit[...]==13.0.3`
    (CUDA 13 wheels) or `nvidia-cuda-runtime-cu12==12.8.90` (CUDA 12); None: a CPU build."""
    for requirement in torch_requirements:
        match = re.match(
            r"(?:cuda-toolkit\[[^]]*\]|nvidia-cuda-runtime(?:-cu\d+)?)\s*==\s*(\d+)\.(\d+)",
            requirement,
        )
        if match:
            return int(match.group(1)), int(match.group(2))
    return None


def dotted(version: tuple[int, ...]) -> str:
    return ".".join(f"{part:02d}" if i else str(part) for i, part in enumerate(version))


def check_cuda_driver(
    proc_text: str | None,
    torch_cuda: tuple[int, int] | None,
    compat_present: bool,
    compat_active: bool,
) -> CudaCheck:
    """How torch's CUDA meets this node's driver; UserError when it cannot run here."""
    if torch_cuda is None:
        return CudaCheck("torch is a CPU build: no NVIDIA driver is used", False)
    cuda = f"{torch_cuda[0]}.{torch_cuda[1]}"
    driver = None if proc_text is None else parse_driver_version(proc_text)
    native = NATIVE_DRIVER.get(torch_cuda[0])
    if driver is None or native is None:
        return unchecked_driver(proc_text, driver, cuda)
    if driver >= native:
        return CudaCheck(f"NVIDIA driver {dotted(driver)}, torch's CUDA {cuda}: native", False)
    needs = f"torch's CUDA {cuda} needs driver {dotted(native)} or newer"
    refuse_a_driver_without_compatibility(driver, torch_cuda[0], needs)
    return through_compat_libraries(driver, needs, compat_present, compat_active)


def unchecked_driver(proc_text: str | None, driver: tuple[int, ...] | None, cuda: str) -> CudaCheck:
    """The line for a driver that cannot be held against torch's CUDA: none loaded (a CPU
    run), a version file this cannot read, or a CUDA major version without a known oldest
    driver. Nothing is refused then: the line says why the versions were not compared."""
    if proc_text is None:
        return CudaCheck(f"NVIDIA driver: none loaded (a CPU run); torch's CUDA {cuda}", False)
    if driver is None:
        return CudaCheck(f"NVIDIA driver: unrecognised ({proc_text.strip()!r}); CUDA {cuda}", False)
    return CudaCheck(f"NVIDIA driver {dotted(driver)}, CUDA {cuda}: not checked", False)


def refuse_a_driver_without_compatibility(
    driver: tuple[int, ...], cuda_major: int, needs: str
) -> None:
    """UserError for a driver too old for torch's CUDA that forward compatibility does not
    cover either (no compatible branch known for this CUDA, or one older than it), saying
    what would run."""
    compat_branch = FORWARD_COMPATIBLE_BRANCH.get(cuda_major)
    if compat_branch is not None and driver[0] >= compat_branch:
        return
    compat = (
        f", or {compat_branch}+ on a data-center GPU with CUDA's forward-compatibility libraries"
        if compat_branch
        else ""
    )
    raise UserError(
        f"NVIDIA driver {dotted(driver)} is too old: {needs}{compat}. Use a machine whose "
        "driver is newer (docs/deploy.md, GPU drivers)."
    )


def through_compat_libraries(
    driver: tuple[int, ...], needs: str, compat_present: bool, compat_active: bool
) -> CudaCheck:
    """A driver forward compatibility covers: CUDA runs through its libraries, which the
    image must hold (UserError if not); the line says whether they are on the path yet."""
    if not compat_present:
        raise UserError(
            f"NVIDIA driver {dotted(driver)} is too old: {needs}, and CUDA's "
            f"forward-compatibility libraries are not in {COMPAT_DIR} (the nvidia/cuda base "
            "image has them). Use the image, or a machine whose driver is newer."
        )
    how = "in use" if compat_active else "starting again with them"
    return CudaCheck(
        f"NVIDIA driver {dotted(driver)}: {needs}; CUDA forward compatibility from "
        f"{COMPAT_DIR} ({how})",
        True,
    )


def library_path_with_compat(env: Mapping[str, str]) -> tuple[str, bool]:
    """LD_LIBRARY_PATH with COMPAT_DIR first, and whether it was already on it."""
    entries = [entry for entry in env.get("LD_LIBRARY_PATH", "").split(":") if entry]
    active = str(COMPAT_DIR) in entries
    return ":".join([str(COMPAT_DIR), *[e for e in entries if e != str(COMPAT_DIR)]]), active


def ensure_cuda_driver(argv: list[str], env: Mapping[str, str]) -> str:
    """Check this node (I/O: two small reads); restart the launcher with the forward-
    compatibility libraries when they are needed. Returns the line to log."""
    from importlib.metadata import PackageNotFoundError, requires

    try:
        torch_cuda = torch_cuda_version(requires("torch") or [])
    except PackageNotFoundError:
        torch_cuda = None
    proc_text = (
        DRIVER_VERSION_FILE.read_text(errors="replace") if DRIVER_VERSION_FILE.is_file() else None
    )
    library_path, active = library_path_with_compat(env)
    check = check_cuda_driver(proc_text, torch_cuda, COMPAT_DIR.is_dir(), active)
    if check.use_compat and not active:
        command = [sys.executable, "-m", "trainer", *argv]
        os.execve(sys.executable, command, {**env, "LD_LIBRARY_PATH": library_path})
    return check.line
