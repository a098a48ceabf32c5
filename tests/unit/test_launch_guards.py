"""Checks the launcher makes about the node itself before it launches anything: an NVIDIA
driver too old for torch's CUDA (tests/unit/test_cuda_driver.py has the decision), GPUs torch
cannot use, a chief whose name does not resolve, and a /dev/shm too small for the loader
workers. The decisions are pure functions fed made-up inputs; one run of the real
launcher per guard shows it ends in one `error:` line (or a warning) before any launch.
"""

from __future__ import annotations

import json

import pytest

from tests.support.helpers import TORCH_2_13, launch_is_a_tripwire, proc
from trainer.common.errors import UserError
from trainer.config.hardware_defaults import (
    MIB,
    SHM_NCCL_RESERVE,
    SHM_PER_LOADER_WORKER,
    loader_workers_for_shm,
)
from trainer.config.topology import GPUS_PER_REPLICA_VARIABLE as GPUS
from trainer.config.topology import requested_accelerators
from trainer.launcher import cuda_driver, prepare
from trainer.launcher import main as launch
from trainer.node.machine import GpuEvidence, check_gpus_usable, expected_gpus
from trainer.settings.run_config import Hardware
from trainer.training.callbacks import reports_to_tuning

DRIVER_535 = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024"
)
NO_GPU_FILES = GpuEvidence(device_files=(), driver_version=None, torch_cuda="13.0")
GPU_FILES = GpuEvidence(("nvidia-uvm", "nvidia0", "nvidia1", "nvidiactl"), DRIVER_535, "13.0")
CONTROL_ONLY = GpuEvidence(("nvidiactl",), None, "13.0")


def vertex_spec(pool: str, job: object, chief: str = "cmle-training-workerpool0-ab-0") -> str:
    return json.dumps(
        {
            "cluster": {"workerpool0": [f"{chief}:2222"], "workerpool1": ["w-0:2222"]},
            "environment": "cloud",
            "task": {"type": pool, "index": 0},
            "job": job,
        }
    )


PROTO_JOB = {  # the spelling of Vertex AI's documented example: proto field names
    "worker_pool_specs": [
        {"machine_spec": {"machine_type": "a2-highgpu-8g", "accelerator_count": 8}},
        {"machine_spec": {"machine_type": "g2-standard-24", "accelerator_count": 2}},
    ]
}
REST_JOB = {"workerPoolSpecs": [{"machineSpec": {"acceleratorCount": 4}}]}
PUBLISHED_JOB = '{"python_module":"","package_uris":[],"job_args":[]}'  # the Vertex SDK's data


@pytest.mark.parametrize(
    ("env", "count"),
    [
        ({"CLUSTER_SPEC": vertex_spec("workerpool0", PROTO_JOB)}, 8),
        ({"CLUSTER_SPEC": vertex_spec("workerpool1", PROTO_JOB)}, 2),  # this pool's own count
        ({"CLUSTER_SPEC": vertex_spec("workerpool0", REST_JOB)}, 4),
        ({"CLUSTER_SPEC": vertex_spec("workerpool0", json.dumps(PROTO_JOB))}, 8),  # as a string
        ({"CLUSTER_SPEC": vertex_spec("workerpool0", {"worker_pool_specs": [{}]})}, None),
        ({"CLUSTER_SPEC": vertex_spec("workerpool1", REST_JOB)}, None),  # pool not listed
        ({"CLUSTER_SPEC": vertex_spec("workerpool0", None)}, None),
        ({"CLUSTER_SPEC": vertex_spec("workerpool1", PUBLISHED_JOB)}, None),
        ({}, None),
        # The job spec's env says it, whatever CLUSTER_SPEC carries.
        ({"CLUSTER_SPEC": vertex_spec("workerpool1", PUBLISHED_JOB), GPUS: "4"}, 4),
        ({"CLUSTER_SPEC": vertex_spec("workerpool0", PROTO_JOB), GPUS: "2"}, 2),
        ({GPUS: "0"}, 0),
    ],
)
def test_requested_accelerators_come_from_the_pools_env_or_machine_spec(env, count):
    assert requested_accelerators(env) == count


@pytest.mark.parametrize(
    ("env", "reports"),
    [
        ({"CLUSTER_SPEC": json.dumps({"task": {"type": "workerpool0", "trial": "3"}})}, True),
        ({"CLUSTER_SPEC": vertex_spec("workerpool0", PUBLISHED_JOB)}, True),  # no trial mark
        ({"CLOUD_ML_TRIAL_ID": "3"}, True),
        ({"CLOUD_ML_HP_METRIC_FILE": "/tmp/metrics"}, True),
        ({"AIP_MODEL_DIR": "gs://b/model/"}, False),  # off Vertex AI's cluster: not asked
        ({}, False),
    ],
)
def test_evaluations_reach_hyperparameter_tuning_on_vertex_whatever_marks_the_trial(env, reports):
    assert reports_to_tuning(env) is reports


def test_a_gpu_count_that_is_not_a_number_is_one_line():
    with pytest.raises(UserError, match=f"^{GPUS}=eight is not a GPU count"):
        requested_accelerators({GPUS: "eight"})


@pytest.mark.parametrize(
    ("visible", "requested", "evidence", "env", "expected"),
    [
        (8, 8, GPU_FILES, {}, 8),
        (0, None, NO_GPU_FILES, {}, 0),  # a CPU machine: nothing asks for a GPU
        (0, None, GPU_FILES, {}, 1),  # a device file, no job spec: at least one GPU
        (0, None, CONTROL_ONLY, {}, 0),  # nvidiactl alone is no GPU
        (0, None, GPU_FILES, {"CUDA_VISIBLE_DEVICES": ""}, 0),  # CPU on purpose
        (0, 8, GPU_FILES, {"CUDA_VISIBLE_DEVICES": ""}, 8),  # but the pool's ask stands
        (1, 2, NO_GPU_FILES, {}, 2),
    ],
)
def test_expected_gpus(visible, requested, evidence, env, expected):
    assert expected_gpus(requested, evidence, env) == expected
    if visible >= expected:
        check_gpus_usable(visible, requested, evidence, env)
    else:
        with pytest.raises(UserError):
            check_gpus_usable(visible, requested, evidence, env)


def test_unusable_gpus_error_names_driver_cuda_and_requested_count():
    with pytest.raises(UserError) as error:
        check_gpus_usable(0, 8, GPU_FILES, {})
    message = str(error.value)
    assert "asked for 8 GPU(s) but torch sees 0" in message
    assert "535.183.01" in message and "torch.version.cuda: 13.0" in message
    assert "\n" not in message


def test_missing_driver_and_device_files_are_said_so():
    with pytest.raises(UserError) as error:
        check_gpus_usable(0, None, GpuEvidence(("nvidia0",), None, "13.0"), {})
    assert "has GPU device files (nvidia0) but torch sees 0" in str(error.value)
    assert "no /proc/driver/nvidia/version" in str(error.value)


@pytest.fixture
def no_launch(monkeypatch, tmp_path):
    """Run the launcher in-process; reaching the launch of accelerate fails the test."""

    def never_launch(*args):
        raise AssertionError(f"the launcher got as far as the launch: {args}")

    launch_is_a_tripwire(monkeypatch, never_launch)
    monkeypatch.chdir(tmp_path)
    for name in ("CLUSTER_SPEC", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)


def run_launcher(args: list[str], capsys) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `python -m trainer ARGS`, run in-process."""
    try:
        launch.main(args)
        code = 0
    except SystemExit as exit_info:
        code = exit_info.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def demo_flags(demo_assets) -> list[str]:
    return ["--model_name_or_path", str(demo_assets.model_dir),
            "--dataset_name", str(demo_assets.dataset_dir),
            "--text_column_name", "transcription"]  # fmt: skip


@pytest.fixture
def fake_node(monkeypatch, tmp_path):
    """A node whose driver file says `version` and whose torch is the CUDA 13.0 build."""

    def node(version: str) -> None:
        driver_file = tmp_path / "version"
        driver_file.write_text(proc(version))
        monkeypatch.setattr(cuda_driver, "DRIVER_VERSION_FILE", driver_file)
        (tmp_path / "compat").mkdir(exist_ok=True)  # the base image's cuda-compat libraries
        monkeypatch.setattr(cuda_driver, "COMPAT_DIR", tmp_path / "compat")
        monkeypatch.setattr("importlib.metadata.requires", lambda name: TORCH_2_13)

    return node


def test_an_old_driver_restarts_the_launcher_with_the_compat_libraries(monkeypatch, fake_node):
    fake_node("550.90.07")
    started = []
    monkeypatch.setattr(cuda_driver.os, "execve", lambda *args: started.append(args))
    env = {"LD_LIBRARY_PATH": "/usr/local/nvidia/lib64", "HF_HOME": "/cache"}
    cuda_driver.ensure_cuda_driver(["whisper-small.yaml", "--dry-run"], env)
    [(program, argv, new_env)] = started
    assert argv == [program, "-m", "trainer", "whisper-small.yaml", "--dry-run"]
    assert new_env["LD_LIBRARY_PATH"] == f"{cuda_driver.COMPAT_DIR}:/usr/local/nvidia/lib64"
    assert new_env["HF_HOME"] == "/cache"

    # The restarted launcher finds them in place and goes on.
    line = cuda_driver.ensure_cuda_driver(["--dry-run"], new_env)
    assert line.endswith("(in use)") and len(started) == 1


def test_a_driver_too_old_stops_the_launcher_before_anything_else(no_launch, fake_node, capsys):
    fake_node("525.147.05")
    code, out, err = run_launcher(["--dry-run"], capsys)
    assert (code, out) == (2, "")
    assert err.startswith("error: NVIDIA driver 525.147.05 is too old: ")
    assert err.count("\n") == 1


def test_the_driver_line_is_logged_with_the_plan(no_launch, capsys, demo_assets, monkeypatch):
    monkeypatch.setattr(cuda_driver, "DRIVER_VERSION_FILE", demo_assets.model_dir / "absent")
    monkeypatch.setattr("importlib.metadata.requires", lambda name: TORCH_2_13)
    code, out, err = run_launcher([*demo_flags(demo_assets), "--dry-run"], capsys)
    assert code == 0
    assert err.splitlines()[0] == "NVIDIA driver: none loaded (a CPU run); torch's CUDA 13.0"
    assert json.loads(out)["hardware"]["gpu_count"] == 0


def test_gpu_job_on_a_node_where_torch_sees_none_stops_before_launch(
    no_launch, monkeypatch, capsys, demo_assets
):
    """This machine has no GPU (torch sees 0), as a GPU node whose driver CUDA cannot use."""
    monkeypatch.setenv("CLUSTER_SPEC", vertex_spec("workerpool0", PROTO_JOB))
    code, out, err = run_launcher([*demo_flags(demo_assets), "--dry-run"], capsys)
    assert (code, out) == (2, "")
    assert err.startswith("error: This node's worker pool asked for 8 GPU(s) but torch sees 0")
    assert "torch.version.cuda:" in err and err.count("\n") == 1


def test_seen_gpus_pass_the_check(monkeypatch, demo_assets, demo_cache):
    a100s = Hardware(8, "NVIDIA A100-SXM4-40GB", (8, 0), 96)
    monkeypatch.setattr("trainer.node.machine.detect_hardware", lambda: a100s)
    monkeypatch.setenv("TRAINER_CACHE_DIR", str(demo_cache))
    env = {"CLUSTER_SPEC": vertex_spec("workerpool0", PROTO_JOB)}
    plan = prepare.prepare_launch([*demo_flags(demo_assets), "--dry-run"], env)
    assert plan.config.topology.nproc_per_node == 8


def test_name_resolution_retries_with_backoff_until_it_resolves():
    now, sleeps, failures = [0.0], [], [3]

    def resolve(host):
        if failures[0]:
            failures[0] -= 1
            raise OSError("Name or service not known")

    def sleep(seconds):
        sleeps.append(seconds)
        now[0] += seconds

    launch.wait_for_name("chief", 60, resolve, sleep, lambda: now[0])
    assert sleeps == [1.0, 2.0, 4.0]


def test_name_resolution_gives_up_at_the_deadline():
    now, sleeps = [0.0], []

    def never(host):
        now[0] += 0.5  # each lookup takes time too
        raise OSError("Name or service not known")

    def sleep(seconds):
        sleeps.append(seconds)
        now[0] += seconds

    with pytest.raises(UserError, match=r"did not resolve within 10 s"):
        launch.wait_for_name("chief", 10, never, sleep, lambda: now[0])
    assert sum(sleeps) <= 10 and sleeps[:3] == [1.0, 2.0, 4.0]


def test_worker_stops_when_the_chief_never_resolves(no_launch, monkeypatch, capsys, demo_assets):
    """A real lookup of a name that cannot exist (RFC 6761 .invalid), with a 1 s budget."""
    spec = vertex_spec("workerpool1", None, chief="no-such-chief.invalid")
    monkeypatch.setenv("CLUSTER_SPEC", spec)
    code, out, err = run_launcher(
        [*demo_flags(demo_assets), "--chief_resolve_timeout", "1"], capsys
    )
    assert code == 2
    assert "waiting for the chief's address no-such-chief.invalid" in out
    last = err.strip().splitlines()
    assert len(last) == 1 and last[0].startswith(
        "error: The chief's address no-such-chief.invalid did not resolve within 1 s"
    )


def test_the_chief_does_not_wait_for_its_own_name(monkeypatch, demo_assets, demo_cache):
    monkeypatch.setenv("TRAINER_CACHE_DIR", str(demo_cache))
    env = {"CLUSTER_SPEC": vertex_spec("workerpool0", None, chief="no-such-chief.invalid")}
    plan = prepare.prepare_launch([*demo_flags(demo_assets), "--dry-run"], env)
    assert plan.config.topology.master_addr == "127.0.0.1"
    command = plan.argv
    assert command[command.index("--main_process_ip") + 1] == "127.0.0.1"


GIB = 1024 * MIB


@pytest.mark.parametrize(
    ("shm", "workers", "procs", "allowed"),
    [
        (None, 4, 8, 4),  # no /dev/shm to measure: leave it
        (64 * MIB, 4, 1, 0),  # Docker's default
        (64 * MIB, 0, 1, 0),
        (1 * GIB, 4, 1, 4),
        (1 * GIB - 1, 4, 1, 3),
        (SHM_NCCL_RESERVE + 8 * 2 * SHM_PER_LOADER_WORKER, 4, 8, 2),
        (SHM_NCCL_RESERVE // 2, 4, 8, 0),  # less than NCCL's reserve
        (64 * GIB, 4, 8, 4),
    ],
)
def test_loader_workers_fit_shared_memory(shm, workers, procs, allowed):
    fitted, warning = loader_workers_for_shm(shm, workers, procs)
    assert fitted == allowed
    assert (warning is None) == (fitted == workers)
    if warning:
        assert f"from {workers} to {allowed}" in warning and "--shm-size" in warning


def test_small_shm_lowers_the_recipes_workers_with_a_warning(
    no_launch, monkeypatch, capsys, demo_assets
):
    monkeypatch.setattr("trainer.node.machine.shared_memory_bytes", lambda: 64 * MIB)
    code, out, err = run_launcher(
        [*demo_flags(demo_assets), "--dataloader_num_workers", "4", "--dry-run"], capsys
    )
    assert code == 0
    plan = json.loads(out)
    training = plan["config"]["flags"]["training"]
    assert training["dataloader_num_workers"] == 0
    assert training["dataloader_persistent_workers"] is False
    assert "/dev/shm: 64 MiB" in err
    assert "warning: /dev/shm is 64 MiB: lowering --dataloader_num_workers from 4 to 0" in err


def test_enough_shm_keeps_the_workers(no_launch, monkeypatch, capsys, demo_assets):
    monkeypatch.setattr("trainer.node.machine.shared_memory_bytes", lambda: 16 * GIB)
    code, out, err = run_launcher(
        [*demo_flags(demo_assets), "--dataloader_num_workers", "4", "--dry-run"], capsys
    )
    assert code == 0
    training = json.loads(out)["config"]["flags"]["training"]
    assert training["dataloader_num_workers"] == 4
    assert "warning" not in err and "/dev/shm: 16384 MiB" in err
