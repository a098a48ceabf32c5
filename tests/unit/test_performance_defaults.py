"""The per-hardware training defaults, and how the launcher applies them (pure, no training)."""

from pathlib import Path

import pytest
import torch

from trainer.config.deepspeed import resolve_deepspeed_config
from trainer.config.hardware_defaults import fast_defaults, flag_names
from trainer.config.resolve import resolve_run
from trainer.launcher.plan import build_launch_plan
from trainer.launcher.prepare import prepare_launch
from trainer.settings.run_config import Hardware
from trainer.tasks.step_memory import TrainingFootprint, gradient_checkpointing_needed

A100 = Hardware(gpu_count=8, gpu_name="NVIDIA A100-SXM4-40GB", compute_capability=(8, 0),
                cpu_count=96)  # fmt: skip
H100 = Hardware(gpu_count=8, gpu_name="NVIDIA H100 80GB HBM3", compute_capability=(9, 0),
                cpu_count=208)  # fmt: skip
T4 = Hardware(gpu_count=4, gpu_name="Tesla T4", compute_capability=(7, 5), cpu_count=32)
ONE_CPU_PER_GPU = Hardware(gpu_count=2, gpu_name="Tesla T4", compute_capability=(7, 5),
                           cpu_count=2)  # fmt: skip
CPU = Hardware(gpu_count=0, gpu_name=None, compute_capability=None, cpu_count=2)

KERNELS = ["--optim", "adamw_torch_fused"]
LOADER = ["--dataloader_num_workers", "4", "--dataloader_persistent_workers", "true"]


def as_dict(flags: list[str]) -> dict[str, str]:
    return dict(zip(flags[::2], flags[1::2], strict=True))


@pytest.mark.parametrize(
    ("hardware", "precision", "expected"),
    [
        (A100, "bf16", [*KERNELS, "--tf32", "true", *LOADER]),
        (H100, "bf16", [*KERNELS, "--tf32", "true", *LOADER]),
        (T4, "fp16", [*KERNELS, *LOADER]),
        (CPU, "no", [*KERNELS, "--dataloader_pin_memory", "false"]),
    ],
)
def test_defaults_follow_the_hardware_and_its_precision(hardware, precision, expected):
    defaults = fast_defaults(hardware, set())
    assert defaults == expected
    assert hardware.mixed_precision == precision
    # TF32 only where the precision is bf16: the same Ampere+ test decides both.
    assert ("--tf32" in defaults) == (precision == "bf16")

    argv = ["--task", "speech-recognition", "--model_name_or_path", "org/m", "--dataset_name",
            "org/d", "--learning_rate", "1e-5"]  # fmt: skip
    config = resolve_run(argv, {}, hardware)
    plan = build_launch_plan(config, {}, Path("/cache"), python="python")
    assert plan.argv[plan.argv.index("--mixed_precision") + 1] == precision
    training = config.training.values
    assert training["optim"] == "adamw_torch_fused" and training["learning_rate"] == 1e-5
    assert training["tf32"] is (True if precision == "bf16" else None)
    assert training["bf16"] is (precision == "bf16") and training["fp16"] is (precision == "fp16")
    assert "--optim" not in config.given, "a default is not a flag the user gave"


def test_few_cpus_per_gpu_give_fewer_loader_workers():
    assert fast_defaults(ONE_CPU_PER_GPU, set()) == KERNELS
    four_cpus = Hardware(gpu_count=1, gpu_name="Tesla T4", compute_capability=(7, 5), cpu_count=4)
    assert as_dict(fast_defaults(four_cpus, set()))["--dataloader_num_workers"] == "2"


def test_a_user_flag_wins_over_each_default():
    assert fast_defaults(A100, {"--tf32"}) == [*KERNELS, *LOADER]
    assert fast_defaults(A100, {"--optim"}) == [
        "--tf32", "true", *LOADER
    ]  # fmt: skip
    # the user's own worker count: neither it nor the persistent-workers default is touched
    # (persistent workers with --dataloader_num_workers 0 would be an error)
    assert fast_defaults(A100, {"--dataloader_num_workers"}) == [*KERNELS, "--tf32", "true"]
    assert as_dict(fast_defaults(T4, {"--dataloader_persistent_workers"})) == {
        **as_dict(KERNELS),
        "--dataloader_num_workers": "4",
    }


def test_flag_names_reads_both_spellings():
    argv = ["--tf32=false", "--dataloader_num_workers", "0", "value", "-x"]
    assert flag_names(argv) == {"--tf32", "--dataloader_num_workers"}


def test_dry_run_shows_defaults_and_keeps_user_flags(monkeypatch):
    monkeypatch.setattr("trainer.node.machine.detect_hardware", lambda: A100)
    argv = ["--dry-run", "--skip_hub_check", "--task", "speech-recognition",
            "--model_name_or_path", "openai/whisper-small",
            "--dataset_name", "mozilla-foundation/common_voice_11_0",
            "--tf32", "false"]  # fmt: skip
    plan = prepare_launch(argv, {})
    config = plan.describe()["config"]
    training = config["flags"]["training"]
    assert training["tf32"] is False, "the user's --tf32 false wins over the A100 default"
    assert training["bf16"] is True and training["dataloader_num_workers"] == 4
    assert "--tf32" in config["given"] and "--bf16" not in config["given"]


GIB = 2**30
A100_40GB, H100_80GB, T4_16GB = 39.4 * GIB, 79.1 * GIB, 14.6 * GIB  # what CUDA reports


def whisper_footprint(size: str, precision: str, batch: int = 16, world: int = 1, stage=2):
    """The speech task's estimate for a released Whisper size, built on the meta device."""
    import torch
    from transformers import WhisperForConditionalGeneration

    from trainer.tasks.speech_recognition.spec import SpeechArguments
    from trainer.tasks.speech_recognition.training import SpeechRecognitionTask
    from trainer.tasks.speech_recognition.whisper_sizes import whisper_config

    with torch.device("meta"):
        model = WhisperForConditionalGeneration(whisper_config(size))
    task = SpeechRecognitionTask(None, None, SpeechArguments(), {"generation_max_length": 225})
    full, checkpointed = task.activation_values_per_sample(model)
    parameters = model.num_parameters()
    return TrainingFootprint(
        parameters=parameters, trainable_parameters=parameters, activation_values=full,
        checkpointed_activation_values=checkpointed, batch_size=batch,
        mixed_precision=precision != "fp32", zero_stage=stage, optimizer_offloaded=False,
        world_size=world,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("size", "precision", "gpu_bytes", "world", "needed"),
    [
        ("small", "bf16", A100_40GB, 1, False),
        ("small", "bf16", H100_80GB, 1, False),
        ("small", "fp16", T4_16GB, 1, True),
        ("small", "fp32", T4_16GB, 1, True),
        ("large-v3", "bf16", A100_40GB, 1, True),
        ("large-v3", "bf16", A100_40GB, 16, True),  # config.yaml: 2 nodes x 8 A100
        ("large-v3", "bf16", H100_80GB, 1, False),
    ],
)
def test_gradient_checkpointing_only_where_memory_needs_it(
    size, precision, gpu_bytes, world, needed
):
    footprint = whisper_footprint(size, precision, world=world)
    assert gradient_checkpointing_needed(footprint, gpu_bytes) is needed
    with_checkpointing = footprint.step_bytes(checkpointing=True)
    assert with_checkpointing < 0.5 * footprint.step_bytes(checkpointing=False)
    if needed:  # and it is enough: the step then fits
        assert with_checkpointing < 0.9 * gpu_bytes - 2 * GIB


def test_memory_estimate_scales_as_the_zero_stages_say():
    """Per parameter (mixed precision, 16 GPUs): plain DDP 16 bytes; ZeRO-2 2 + (2 + 12) / 16;
    ZeRO-3 (2 + 2 + 12) / 16; and whisper-small's model states under ZeRO-2 on one GPU are
    16 bytes per parameter: 242 M parameters, 3.6 GiB."""
    small = whisper_footprint("small", "bf16", world=16)
    per_parameter = {
        stage: whisper_footprint("small", "bf16", world=16, stage=stage).model_state_bytes()
        / small.parameters
        for stage in (None, 2, 3)
    }
    assert per_parameter == pytest.approx({None: 16, 2: 2 + 14 / 16, 3: 16 / 16})
    one_gpu = whisper_footprint("small", "bf16")
    assert one_gpu.parameters == pytest.approx(241.7e6, rel=0.01)
    assert one_gpu.model_state_bytes() / GIB == pytest.approx(3.6, abs=0.05)


def bytes_saved_for_backward(model, dtype=torch.float32) -> int:
    """What autograd keeps for one sample's backward pass (counted with saved-tensor hooks),
    weights excluded: one 30 s clip and 225 label tokens."""
    features = torch.randn(1, model.config.num_mel_bins, 3000, dtype=dtype)
    labels = torch.randint(0, 50_000, (1, 225))
    storages: dict[int, int] = {}

    def keep(tensor):
        storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
        model(input_features=features, labels=labels)
    return sum(size for pointer, size in storages.items() if pointer not in weights)


@pytest.mark.parametrize(("precision", "stage"), [("fp32", 2), ("bf16", 2), ("bf16", None)])
def test_activation_estimate_matches_what_autograd_saves(precision, stage):
    """whisper-tiny at its real size: the estimate is within 20% of the bytes autograd
    really keeps; bf16 as DeepSpeed holds the model (16-bit weights), and as autocast runs
    it without DeepSpeed (fp32 weights)."""
    from transformers import WhisperForConditionalGeneration

    from trainer.tasks.speech_recognition.whisper_sizes import whisper_config

    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(whisper_config("tiny", decoder_start_token_id=1))
    if precision == "bf16" and stage is not None:
        model = model.to(torch.bfloat16)
        measured = bytes_saved_for_backward(model, torch.bfloat16)
    elif precision == "bf16":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            measured = bytes_saved_for_backward(model)
    else:
        measured = bytes_saved_for_backward(model)
    estimate = whisper_footprint("tiny", precision, batch=1, stage=stage)
    assert estimate.activation_bytes_per_sample(checkpointing=False) == pytest.approx(
        measured, rel=0.2
    )


def test_zero_settings_are_read_from_the_deepspeed_config():
    from trainer.tasks.step_memory import deepspeed_zero_settings

    assert deepspeed_zero_settings(str(resolve_deepspeed_config("zero2"))) == (2, False)
    assert deepspeed_zero_settings(str(resolve_deepspeed_config("zero3"))) == (3, False)
    assert deepspeed_zero_settings(str(resolve_deepspeed_config("zero3-offload"))) == (3, True)
    assert deepspeed_zero_settings(None) == (None, False)
