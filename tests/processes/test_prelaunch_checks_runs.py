"""What would fail only inside the training processes, through the real command line:
`python -m trainer` refuses --push_to_hub without any token before launch (exit code 2),
and what genuinely shows only in training exits with its own code, 78. The launcher's
checks in-process: tests/unit/test_prelaunch_checks.py.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.helpers import TEXT_COLUMNS, assert_planned, free_port, run_trainer, trainer_env
from trainer.common.exit_codes import CONFIG_ERROR_EXIT_CODE, CONFIG_ERROR_IN_TRAINING_EXIT_CODE

# --push_to_hub ------------------------------------------------------------------------------


def test_push_to_hub_without_any_token_is_refused(tmp_path, text_assets):
    """The real command line, with a Hugging Face home of its own: no HF_TOKEN, no
    `hf auth login` token file, no --hub_token."""
    model_dir, dataset_dir = text_assets
    env = trainer_env(tmp_path / "cache", HF_HOME=str(tmp_path / "hf-home"), HF_HUB_OFFLINE="0",
                      HF_ENDPOINT=f"http://127.0.0.1:{free_port()}")  # fmt: skip
    env.pop("HF_TOKEN", None)
    done = subprocess.run(
        [sys.executable, "-m", "trainer", "--task", "text-classification", "--model_name_or_path",
         str(model_dir), "--dataset_name", str(dataset_dir), *TEXT_COLUMNS, "--push_to_hub",
         "true", "--dry-run"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == CONFIG_ERROR_EXIT_CODE, done.stderr
    assert done.stdout == ""
    assert done.stderr.splitlines()[-1:] == [
        "error: --push_to_hub needs a Hub token with write access: set HF_TOKEN for the run "
        "(never in a job spec), pass --hub_token, or log in with hf auth login."
    ]
    assert [line for line in done.stderr.splitlines() if line.startswith("error:")] == (
        done.stderr.splitlines()[-1:]
    )


# What only training can find ------------------------------------------------------------------


@pytest.mark.slow
def test_a_configuration_error_found_only_in_training_exits_78(dry_run, text_assets, tmp_path):
    """`--max_seq_length` beyond the model's positions shows only once the training
    process has loaded the model: the launcher's checks pass it, the training process
    refuses it in one line, and `python -m trainer` exits with 78, not 2 and not 1."""
    args = ["--max_seq_length", "200", "--max_steps", "2"]
    assert_planned(dry_run(*args))  # not found before launch

    model_dir, dataset_dir = text_assets
    code, output = run_trainer(
        ["--task", "text-classification", "--model_name_or_path", str(model_dir),
         "--dataset_name", str(dataset_dir), *TEXT_COLUMNS, "--deepspeed", "none",
         "--output_dir", "out", *args],
        cwd=tmp_path, env=trainer_env(tmp_path / "cache"), timeout=300,
    )  # fmt: skip
    assert code == CONFIG_ERROR_IN_TRAINING_EXIT_CODE, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: --max_seq_length 200 exceeds the 128 tokens that {model_dir} takes."
    ], output[-3000:]
    assert "world size 1" in output, "the launcher started the training process"
    assert not list((tmp_path / "out").rglob("*.safetensors")), "nothing was trained or saved"
