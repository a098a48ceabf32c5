"""The per-hardware training defaults, and how the launcher applies them (pure, no training)."""

from pathlib import Path

import pytest

from trainer.cluster import Topology
from trainer.deepspeed_config import resolve_deepspeed_config
from trainer.hardware import Hardware
from trainer.launch import LauncherArguments, build_launch_plan, prepare_launch
from trainer.performance import fast_defaults, flag_names

A100 = Hardware(gpu_count=8, gpu_name="NVIDIA A100-SXM4-40GB", compute_capability=(8, 0),
                cpu_count=96)  # fmt: skip
H100 = Hardware(gpu_count=8, gpu_name="NVIDIA H100 80GB HBM3", compute_capability=(9, 0),
                cpu_count=208)  # fmt: skip
T4 = Hardware(gpu_count=4, gpu_name="Tesla T4", compute_capability=(7, 5), cpu_count=32)
ONE_CPU_PER_GPU = Hardware(gpu_count=2, gpu_name="Tesla T4", compute_capability=(7, 5),
                           cpu_count=2)  # fmt: skip
CPU = Hardware(gpu_count=0, gpu_name=None, compute_capability=None, cpu_count=2)

LOADER = ["--dataloader_num_workers", "4", "--dataloader_persistent_workers", "true"]


def as_dict(flags: list[str]) -> dict[str, str]:
    return dict(zip(flags[::2], flags[1::2], strict=True))


@pytest.mark.parametrize(
    ("hardware", "precision", "expected"),
    [
        (A100, "bf16", ["--tf32", "true", *LOADER]),
        (H100, "bf16", ["--tf32", "true", *LOADER]),
        (T4, "fp16", LOADER),
        (CPU, "no", []),
    ],
)
def test_defaults_follow_the_hardware_and_its_precision(hardware, precision, expected):
    defaults = fast_defaults(hardware, set())
    assert defaults == expected
    assert hardware.mixed_precision == precision
    # TF32 only where the precision is bf16: the same Ampere+ test decides both.
    assert ("--tf32" in defaults) == (precision == "bf16")

    training = ["--learning_rate", "1e-5", *defaults]
    topology = Topology(1, 0, "127.0.0.1", 29500, max(1, hardware.gpu_count), "chief")
    plan = build_launch_plan(
        topology, hardware, LauncherArguments(), resolve_deepspeed_config("zero2"), training,
        hardware.mixed_precision, {}, Path("/cache"), python="python",
    )  # fmt: skip
    argv = plan.argv
    assert argv[argv.index("--mixed_precision") + 1] == precision
    module_flags = argv[argv.index("--module") + 2 :]
    assert module_flags[: len(training)] == training


def test_few_cpus_per_gpu_give_fewer_loader_workers():
    assert fast_defaults(ONE_CPU_PER_GPU, set()) == []
    four_cpus = Hardware(gpu_count=1, gpu_name="Tesla T4", compute_capability=(7, 5), cpu_count=4)
    assert as_dict(fast_defaults(four_cpus, set()))["--dataloader_num_workers"] == "2"


def test_a_user_flag_wins_over_each_default():
    assert fast_defaults(A100, {"--tf32"}) == LOADER
    # the user's own worker count: neither it nor the persistent-workers default is touched
    # (persistent workers with --dataloader_num_workers 0 would be an error)
    assert fast_defaults(A100, {"--dataloader_num_workers"}) == ["--tf32", "true"]
    assert as_dict(fast_defaults(T4, {"--dataloader_persistent_workers"})) == {
        "--dataloader_num_workers": "4"
    }


def test_flag_names_reads_both_spellings():
    argv = ["--tf32=false", "--dataloader_num_workers", "0", "value", "-x"]
    assert flag_names(argv) == {"--tf32", "--dataloader_num_workers"}


def test_dry_run_shows_defaults_and_keeps_user_flags(monkeypatch):
    monkeypatch.setattr("trainer.hardware.detect_hardware", lambda: A100)
    argv = ["--dry-run", "--model_name_or_path", "openai/whisper-small",
            "--dataset_name", "mozilla-foundation/common_voice_11_0",
            "--tf32", "false"]  # fmt: skip
    _, plan = prepare_launch(argv, {})
    command = plan.describe()["command"]
    training = command[command.index("--module") + 2 :]
    assert as_dict(training[training.index("--tf32") :][:2]) == {"--tf32": "false"}
    assert training.count("--tf32") == 1
    assert as_dict(training[training.index("--bf16") :][:2]) == {"--bf16": "true"}
    assert training[training.index("--dataloader_num_workers") + 1] == "4"
