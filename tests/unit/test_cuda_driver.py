"""The launcher's first check: does this node's NVIDIA driver run torch's CUDA? The decision
is fed made-up driver versions (the /proc/driver/nvidia/version line of each branch);
tests/unit/test_launch_guards.py runs the launcher itself with a faked driver file."""

from __future__ import annotations

import pytest

from tests.support.helpers import TORCH_2_13, proc
from trainer.common.errors import UserError
from trainer.launcher import cuda_driver
from trainer.launcher.cuda_driver import (
    check_cuda_driver,
    library_path_with_compat,
    parse_driver_version,
    torch_cuda_version,
)
from trainer.node.machine import COMPAT_DIR, GpuEvidence, check_gpus_usable

TORCH_CU128 = ['nvidia-cuda-runtime-cu12==12.8.90; platform_system == "Linux"', "sympy"]


@pytest.mark.parametrize(
    ("text", "version"),
    [
        (proc("535.183.01"), (535, 183, 1)),
        (proc("580.95.05", open_module=True), (580, 95, 5)),
        (proc("550.90.07"), (550, 90, 7)),
        ("NVRM version: something else entirely\n", None),
    ],
)
def test_driver_version_is_read_from_the_kernel_modules_line(text, version):
    assert parse_driver_version(text) == version


@pytest.mark.parametrize(
    ("requirements", "cuda"),
    [(TORCH_2_13, (13, 0)), (TORCH_CU128, (12, 8)), (["filelock", "sympy>=1.13"], None)],
)
def test_torchs_cuda_comes_from_its_wheels_requirements(requirements, cuda):
    assert torch_cuda_version(requirements) == cuda


@pytest.mark.parametrize(
    ("driver", "cuda", "line", "compat"),
    [
        ("580.95.05", (13, 0), "NVIDIA driver 580.95.05, torch's CUDA 13.0: native", False),
        ("590.44.01", (13, 0), "NVIDIA driver 590.44.01, torch's CUDA 13.0: native", False),
        ("580.65.06", (13, 0), "NVIDIA driver 580.65.06, torch's CUDA 13.0: native", False),
        ("550.90.07", (12, 8), "NVIDIA driver 550.90.07, torch's CUDA 12.8: native", False),
        ("575.57.08", (13, 0), "NVIDIA driver 575.57.08: torch's CUDA 13.0 needs", True),
        ("570.133.20", (13, 0), "NVIDIA driver 570.133.20: torch's CUDA 13.0 needs", True),
        ("550.90.07", (13, 0), "NVIDIA driver 550.90.07: torch's CUDA 13.0 needs", True),
        ("535.183.01", (13, 0), "NVIDIA driver 535.183.01: torch's CUDA 13.0 needs", True),
    ],
)
def test_new_drivers_run_natively_and_older_branches_through_forward_compatibility(
    driver, cuda, line, compat
):
    check = check_cuda_driver(proc(driver), cuda, compat_present=True, compat_active=False)
    assert check.line.startswith(line) and check.use_compat is compat
    if compat:
        assert "driver 580.65.06 or newer" in check.line and str(COMPAT_DIR) in check.line


@pytest.mark.parametrize(
    ("driver", "cuda", "expected"),
    [
        ("525.147.05", (13, 0), "driver 580.65.06 or newer, or 535+ on a data-center GPU"),
        ("470.256.02", (12, 8), "torch's CUDA 12.8 needs driver 525.60.13 or newer. Use a"),
    ],
)
def test_a_driver_too_old_for_any_route_is_one_clear_error(driver, cuda, expected):
    with pytest.raises(UserError) as error:
        check_cuda_driver(proc(driver), cuda, compat_present=True, compat_active=False)
    message = str(error.value)
    assert message.startswith(f"NVIDIA driver {driver} is too old: ") and expected in message
    assert "\n" not in message


def test_forward_compatibility_without_its_libraries_is_an_error():
    with pytest.raises(UserError, match=f"not in {COMPAT_DIR}"):
        check_cuda_driver(proc("550.90.07"), (13, 0), compat_present=False, compat_active=False)


@pytest.mark.parametrize(
    ("text", "cuda", "line"),
    [
        (None, (13, 0), "NVIDIA driver: none loaded (a CPU run); torch's CUDA 13.0"),
        (proc("525.147.05"), None, "torch is a CPU build: no NVIDIA driver is used"),
    ],
)
def test_cpu_runs_have_nothing_to_check(text, cuda, line):
    assert check_cuda_driver(text, cuda, False, False) == cuda_driver.CudaCheck(line, False)


def test_compat_libraries_go_first_on_the_library_path_once():
    env = {"LD_LIBRARY_PATH": "/usr/local/nvidia/lib:/usr/local/nvidia/lib64"}
    path, active = library_path_with_compat(env)
    assert path == f"{COMPAT_DIR}:/usr/local/nvidia/lib:/usr/local/nvidia/lib64" and not active
    assert library_path_with_compat({"LD_LIBRARY_PATH": path}) == (path, True)
    assert library_path_with_compat({}) == (str(COMPAT_DIR), False)


def test_cuda_failing_even_with_compat_says_so():
    env = {"LD_LIBRARY_PATH": f"{COMPAT_DIR}:/usr/local/nvidia/lib64"}
    evidence = GpuEvidence(("nvidia0",), proc("550.90.07").splitlines()[0], "13.0")
    with pytest.raises(UserError, match="forward-compatibility libraries were in use"):
        check_gpus_usable(0, 1, evidence, env)
