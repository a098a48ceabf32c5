"""The loss a run logs, and the gradients it steps with, do not grow with the process
count (trainer/tasks/trainers.py WhisperTrainer: Whisper's `forward` takes a mean over its
own tokens, and the Trainer took it for one that divides by every process's tokens)."""

from __future__ import annotations

import re

import pytest

from tests.support.helpers import DEMO_SPEECH_FLAGS, run_trainer, trainer_env

pytestmark = pytest.mark.slow

FIRST_STEP_LOSS = re.compile(r"^step 1/1 .*\| loss ([0-9.]+) ", re.MULTILINE)


def first_step_loss(tmp_path, demo_assets, demo_cache, processes: int) -> float:
    """The logged loss of one step of 4 clips, on `processes` processes."""
    code, output = run_trainer(
        [
            "--model_name_or_path", str(demo_assets.model_dir),
            "--dataset_name", str(demo_assets.dataset_dir), *DEMO_SPEECH_FLAGS,
            "--nproc_per_node", str(processes),
            "--per_device_train_batch_size", str(4 // processes),
            "--max_steps", "1", "--logging_steps", "1",
            "--eval_strategy", "no", "--save_strategy", "no",
            "--output_dir", "out",
        ],
        cwd=tmp_path / f"{processes}-processes",
        env=trainer_env(demo_cache),
    )  # fmt: skip
    assert code == 0, output[-3000:]
    (loss,) = FIRST_STEP_LOSS.findall(output)
    return float(loss)


def test_whispers_loss_is_the_same_on_one_and_two_processes(tmp_path, demo_assets, demo_cache):
    """An untrained tiny Whisper's loss is about ln(vocabulary) on any clips: the same
    batch size over 2 processes must log what 1 process logs, not twice it."""
    for processes in (1, 2):
        (tmp_path / f"{processes}-processes").mkdir()
    one, two = (first_step_loss(tmp_path, demo_assets, demo_cache, n) for n in (1, 2))
    assert 0.8 < two / one < 1.25, (one, two)
