"""The command line as a user meets it, run as `python -m trainer` in a subprocess:
--help, --dry-run, and the simplest local run there is (the recipes parsed in-process:
tests/unit/test_cli.py)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.helpers import run_trainer, trainer_env


def run_cli(args, cwd, env):
    return subprocess.run(
        [sys.executable, "-m", "trainer", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_help_shows_launcher_and_training_flags(tmp_path, demo_cache):
    result = run_cli(["--help"], tmp_path, trainer_env(demo_cache))
    assert result.returncode == 0, result.stderr
    for flag in (
        "--nproc_per_node",
        "--deepspeed",
        "--rdzv_timeout",
        "--chief_resolve_timeout",
        "--skip_hub_check",
        "--dry-run",  # launcher
        "--task",
        "--model_name_or_path",
        "--dataset_name",
        "--save_interval_minutes",
        "--stop_grace_seconds",
        "--train_split_name",
        "--audio_column_name",
        "--language",
        "--whisper_task",  # model, data, task
        "--max_duration_in_seconds",
        "--learning_rate",
        "--ddp_timeout",
        "--load_best_model_at_end",
        "--predict_with_generate",
    ):  # Trainer
        assert flag in result.stdout, flag


def test_dry_run_prints_the_plan_for_a_vertex_worker(tmp_path, demo_assets, demo_cache):
    spec = {
        "cluster": {"workerpool0": ["chief-0:2222"], "workerpool1": ["w-0:2222", "w-1:2222"]},
        "environment": "cloud",
        "task": {"type": "workerpool1", "index": 1, "trial": "3"},
    }
    env = trainer_env(
        demo_cache,
        CLUSTER_SPEC=json.dumps(spec),
        RANK="2",
        WORLD_SIZE="3",
        MASTER_ADDR="chief-0",
        HUB_TOKEN_SHOULD_NOT_SHOW="x",
    )
    args = ["--dry-run", "--nproc_per_node", "2", "--deepspeed", "zero3",
            "--model_name_or_path", str(demo_assets.model_dir),
            "--dataset_name", str(demo_assets.dataset_dir), "--text_column_name", "transcription",
            "--hub_token", "hf_secret_value"]  # fmt: skip
    result = run_cli(args, tmp_path, env)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["topology"] == {
        "num_nodes": 3, "node_rank": 2, "master_addr": "chief-0", "master_port": 2222,
        "nproc_per_node": 2, "role": "worker", "world_size": 6,
    }  # fmt: skip
    command = plan["command"]
    assert command[command.index("--num_processes") + 1] == "6"
    assert command[command.index("--machine_rank") + 1] == "2"
    assert command[command.index("--deepspeed_config_file") + 1].endswith("zero3.json")
    assert "hf_secret_value" not in result.stdout
    assert sorted(plan["unset_env"]) == ["MASTER_ADDR", "RANK", "WORLD_SIZE"]
    assert not list(tmp_path.iterdir()), "a dry run must not write anything"


def test_one_process_without_deepspeed_trains_speech_grouped_by_length(
    tmp_path, demo_assets, demo_cache
):
    """The simplest local run (one process, `--deepspeed none`: the CPU default, and what the
    launcher's notice for `--use_deepspeed` recommends) trains and delivers a model, with
    the example scripts' `--group_by_length`, whose lengths the training processes compute
    themselves. Both once died at start in the training processes (accelerate's
    `use_configured_state` without a configured state; a task built without the length
    column), which no dry run could show."""
    args = ["--deepspeed", "none", "--nproc_per_node", "1", "--group_by_length",
            "--model_name_or_path", str(demo_assets.model_dir),
            "--dataset_name", str(demo_assets.dataset_dir), "--text_column_name", "transcription",
            "--max_steps", "2", "--eval_strategy", "no", "--output_dir", "out"]  # fmt: skip
    code, output = run_trainer(args, cwd=tmp_path, env=trainer_env(demo_cache), timeout=300)
    assert code == 0, output[-3000:]
    assert "world size 1" in output and "step 2/2" in output, output[-3000:]
    assert (tmp_path / "out" / "model" / "model.safetensors").is_file()


def test_an_optimizer_this_node_cannot_run_is_refused_before_launch(
    tmp_path, demo_assets, demo_cache
):
    """`--optim adamw_bnb_8bit` on a CPU-only node, as a user runs it (not a dry run): one line
    and exit 2 before anything starts; it used to launch and die with an ImportError in
    every training process."""
    args = ["--optim", "adamw_bnb_8bit", "--model_name_or_path", str(demo_assets.model_dir),
            "--dataset_name", str(demo_assets.dataset_dir), "--text_column_name", "transcription",
            "--max_steps", "2", "--output_dir", "out"]  # fmt: skip
    result = run_cli(args, tmp_path, trainer_env(demo_cache))
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert result.stderr.splitlines()[-1] == (
        "error: --optim adamw_bnb_8bit is a bitsandbytes optimizer and needs a CUDA GPU; this "
        "is a CPU-only node: leave --optim out (torch's AdamW, the default), or use a machine "
        "with a GPU."
    )
    assert "Traceback" not in result.stderr
