"""The accelerate command built from a topology, the hardware and the flags (pure)."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from trainer.common.cache import build_key
from trainer.common.errors import UserError
from trainer.common.handoff import RUN_CONFIG_VARIABLE
from trainer.config.deepspeed import resolve_deepspeed_config
from trainer.config.resolve import RunConfig, resolve_mixed_precision, resolve_run
from trainer.launcher.plan import build_launch_plan
from trainer.settings.run_config import Hardware, Topology

A100 = Hardware(
    gpu_count=8, gpu_name="NVIDIA A100-SXM4-40GB", compute_capability=(8, 0), cpu_count=96
)
T4 = Hardware(gpu_count=4, gpu_name="Tesla T4", compute_capability=(7, 5), cpu_count=32)
CPU = Hardware(gpu_count=0, gpu_name=None, compute_capability=None, cpu_count=2)


def flag_value(argv, flag):
    return argv[argv.index(flag) + 1]


def config_for(topology, hardware, deepspeed="zero2", training=("--learning_rate", "1e-5")):
    """The resolved configuration of a run with these flags, on `topology`."""
    argv = ["--deepspeed", deepspeed, "--rdzv_timeout", "900", "--task", "speech-recognition",
            "--model_name_or_path", "org/model", "--dataset_name", "org/data",
            *training]  # fmt: skip
    return replace(resolve_run(argv, {}, hardware), topology=topology)


def plan_for(topology, hardware, deepspeed="zero2", env=None, training=("--learning_rate", "1e-5")):
    config = config_for(topology, hardware, deepspeed, training)
    return build_launch_plan(config, env or {}, Path("/cache"), python="python")


def test_multinode_gpu_plan_uses_standard_deepspeed_launcher():
    topology = Topology(
        num_nodes=4,
        node_rank=2,
        master_addr="chief",
        master_port=2222,
        nproc_per_node=8,
        role="worker",
    )
    plan = plan_for(topology, A100, env={"RANK": "2", "WORLD_SIZE": "4", "MASTER_ADDR": "x"})
    argv = plan.argv
    assert argv[:3] == ["python", "-m", "trainer.launcher.accelerate_launch"]
    assert flag_value(argv, "--num_machines") == "4"
    assert flag_value(argv, "--machine_rank") == "2"
    assert flag_value(argv, "--num_processes") == "32"
    assert flag_value(argv, "--main_process_ip") == "chief"
    assert flag_value(argv, "--main_process_port") == "2222"
    assert flag_value(argv, "--mixed_precision") == "bf16"
    assert flag_value(argv, "--deepspeed_multinode_launcher") == "standard"
    assert flag_value(argv, "--rdzv_conf") == "timeout=900"
    assert "--use_deepspeed" in argv
    zero2 = flag_value(argv, "--deepspeed_config_file")
    assert zero2.endswith("presets/zero2.json")
    # the training processes get the resolved configuration, with the same DeepSpeed config
    assert argv[-2:] == ["--module", "trainer.training.rank"]
    handed = RunConfig.from_json(plan.env[RUN_CONFIG_VARIABLE])
    assert handed == plan.config
    assert handed.training.values["learning_rate"] == 1e-5
    assert handed.training.deepspeed == zero2 == str(resolve_deepspeed_config("zero2"))
    # Vertex's node-level variables never reach torch.distributed
    assert set(plan.unset_env) == {"RANK", "WORLD_SIZE", "MASTER_ADDR"}
    assert "DS_ACCELERATOR" not in plan.env
    assert plan.env["OMP_NUM_THREADS"] == "12"


def test_cpu_plan_sets_cpu_specifics():
    topology = Topology(1, 0, "127.0.0.1", 29500, 2, "chief")
    plan = plan_for(topology, CPU)
    assert flag_value(plan.argv, "--mixed_precision") == "no"
    assert "--cpu" not in plan.argv  # --cpu would silently switch DeepSpeed off
    assert plan.env["DS_ACCELERATOR"] == "cpu"
    assert plan.env["TORCH_EXTENSIONS_DIR"] == str(Path("/cache/torch_extensions") / build_key())
    assert plan.env["OMP_NUM_THREADS"] == "1"


def test_user_environment_wins_for_threads_and_extension_cache():
    topology = Topology(1, 0, "127.0.0.1", 29500, 2, "chief")
    plan = plan_for(topology, CPU, env={"OMP_NUM_THREADS": "3", "TORCH_EXTENSIONS_DIR": "/x"})
    assert plan.env["OMP_NUM_THREADS"] == "3"
    assert plan.env["TORCH_EXTENSIONS_DIR"] == "/x"


def test_none_preset_is_plain_ddp():
    topology = Topology(2, 0, "chief", 2222, 4, "chief")
    plan = plan_for(topology, T4, deepspeed="none")
    assert "--use_deepspeed" not in plan.argv
    assert "--deepspeed" not in plan.argv
    assert "--multi_gpu" in plan.argv
    assert flag_value(plan.argv, "--mixed_precision") == "fp16"


@pytest.mark.parametrize(
    ("preset", "stage", "offloaded"),
    [("zero2", 2, False), ("zero3", 3, False), ("zero3-offload", 3, True)],
)
def test_presets_leave_the_numbers_to_the_trainer(preset, stage, offloaded):
    config = json.loads(resolve_deepspeed_config(preset).read_text())
    zero = config["zero_optimization"]
    assert zero["stage"] == stage
    assert ("offload_optimizer" in zero) == offloaded
    for key in ("train_batch_size", "train_micro_batch_size_per_gpu",
                "gradient_accumulation_steps", "gradient_clipping"):  # fmt: skip
        assert config[key] == "auto", key
    assert config["bf16"]["enabled"] == config["fp16"]["enabled"] == "auto"
    if stage == 3:  # the final model must be gathered into one file when saved
        assert zero["stage3_gather_16bit_weights_on_model_save"] is True


def test_user_deepspeed_json(tmp_path):
    config = tmp_path / "mine.json"
    config.write_text('{"zero_optimization": {"stage": 1}}')
    assert resolve_deepspeed_config(str(config)) == config.resolve()


@pytest.mark.parametrize(
    ("choice", "message"),
    [("zero9", "Unknown DeepSpeed preset"), ("/nope/ds.json", "not found")],
)
def test_bad_deepspeed_choice(choice, message):
    with pytest.raises(UserError, match=message):
        resolve_deepspeed_config(choice)


def test_invalid_deepspeed_json(tmp_path):
    config = tmp_path / "broken.json"
    config.write_text("{")
    with pytest.raises(UserError, match="not valid JSON"):
        resolve_deepspeed_config(str(config))


@pytest.mark.parametrize(
    ("hardware", "bf16", "fp16", "expected"),
    [
        (A100, False, False, "bf16"),
        (T4, False, False, "fp16"),
        (CPU, False, False, "no"),
        (A100, False, True, "fp16"),
        (T4, False, True, "fp16"),
    ],
)
def test_mixed_precision_from_hardware_and_flags(hardware, bf16, fp16, expected):
    assert resolve_mixed_precision(bf16, fp16, hardware) == expected


def test_explicit_false_precision_flags_mean_fp32_even_on_ampere():
    assert resolve_mixed_precision(False, False, A100, user_chose=True) == "no"


@pytest.mark.parametrize(
    ("hardware", "bf16", "fp16", "message"),
    [
        (A100, True, True, "mutually exclusive"),
        (T4, True, False, "Ampere or newer"),
        (CPU, True, False, "Ampere or newer"),
        (CPU, False, True, "needs a GPU"),
    ],
)
def test_impossible_precision_is_refused(hardware, bf16, fp16, message):
    with pytest.raises(UserError, match=message):
        resolve_mixed_precision(bf16, fp16, hardware)


def test_secrets_are_masked_in_the_printed_plan():
    topology = Topology(1, 0, "127.0.0.1", 29500, 1, "chief")
    plan = plan_for(topology, CPU, training=("--hub_token=hf_secret", "--learning_rate", "1"))
    printed = json.dumps(plan.describe())
    assert "hf_secret" not in printed
    assert plan.describe()["config"]["flags"]["training"]["hub_token"] == "***"
    assert plan.describe()["config"]["flags"]["training"]["learning_rate"] == 1


def test_torchrun_waits_for_the_stop_grace_before_killing_on_sigterm():
    """torchrun kills the training processes TORCH_ELASTIC_SHUTDOWN_TIMEOUT seconds after
    passing SIGTERM on: long enough for --stop_grace_seconds of uploads, then a report."""
    topology = Topology(1, 0, "127.0.0.1", 29500, 2, "chief")
    for grace, timeout in ((25, "30"), (0, "5"), (90.5, "96")):
        config = config_for(topology, CPU, "none", ("--stop_grace_seconds", str(grace)))
        plan = build_launch_plan(config, {}, Path("/cache"))
        assert plan.env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == timeout


def test_the_default_stop_fits_in_the_15_s_a_gke_pod_gets_of_a_spot_notice():
    """GKE gives non-system pods 15 s of a Spot VM's 30 s notice, and Vertex AI documents
    nothing: by default torchrun kills the training processes with 2 s of those 15 left."""
    topology = Topology(1, 0, "127.0.0.1", 29500, 2, "chief")
    plan = build_launch_plan(config_for(topology, CPU, "none"), {}, Path("/cache"))
    assert int(plan.env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]) == 13
