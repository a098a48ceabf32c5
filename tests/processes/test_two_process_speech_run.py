"""One two-process run of the demo's tiny Whisper on tone clips, through `python -m
trainer`, shared by the tests of this module: 4 steps of 2 x 4 clips, no --logging_steps
(progress lines come by time) and no recipe, on a copy of the tone set whose training split
also lists a garbage, an empty and a missing clip.

- The loss a run logs (and the gradients it steps with) does not grow with the process
  count (trainer/tasks/speech_recognition/trainer.py WhisperTrainer:
  Whisper's `forward` takes a mean over
  its own tokens, and the Trainer took it for one that divides by every process's tokens).
- The ranks agree on when a timed progress line comes.
- Undecodable clips of a map-style set are skipped and counted on every progress line.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.helpers import DEMO_SPEECH_FLAGS, run_trainer, trainer_env
from tests.support.tiny_assets import BAD_CLIPS, TONE_CLIPS, tone_speech_with_bad_clips

pytestmark = pytest.mark.slow

FIRST_STEP_LOSS = re.compile(r"^step 1/4 .*\| loss ([0-9.]+) ", re.MULTILINE)


@dataclass
class SpeechRun:
    code: int
    output: str
    workdir: Path
    dataset: str


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory, demo_assets, demo_cache) -> SpeechRun:
    workdir = tmp_path_factory.mktemp("two-process-speech")
    dataset = tone_speech_with_bad_clips(demo_assets, workdir / "speech")
    code, output = run_trainer(
        ["--nproc_per_node", "2", "--model_name_or_path", str(demo_assets.model_dir),
         "--dataset_name", dataset, *DEMO_SPEECH_FLAGS, "--max_bad_examples", "3",
         "--max_steps", "4", "--per_device_train_batch_size", "4",
         "--eval_strategy", "no", "--save_strategy", "no", "--output_dir", "out"],
        cwd=workdir,
        env=trainer_env(demo_cache),
    )  # fmt: skip
    return SpeechRun(code, output, workdir, dataset)


def test_whispers_loss_on_two_processes_is_an_untrained_models_not_twice_it(
    two_processes, demo_assets
):
    """An untrained tiny Whisper's loss is about ln(vocabulary) on any clips (its logits are
    close to uniform): the first step's logged loss over 2 processes must be that, not twice
    it (the bug logged 21.8 where 1 process logged 10.8)."""
    from transformers import WhisperConfig

    assert two_processes.code == 0, two_processes.output[-3000:]
    (loss,) = FIRST_STEP_LOSS.findall(two_processes.output)
    uniform = math.log(WhisperConfig.from_pretrained(demo_assets.model_dir).vocab_size)
    assert 0.8 < float(loss) / uniform < 1.25, (loss, uniform)


def test_two_ranks_agree_on_timed_progress_lines(two_processes):
    """No --logging_steps (and no recipe): the ranks agree, over the real process group, on
    when to log (the Trainer gathers the loss then, so a disagreement would hang)."""
    output = two_processes.output
    assert two_processes.code == 0, output[-3000:]
    # 4 steps: 5% of the run is less than a step, so every step prints a line, once
    assert re.findall(r"^step (\d)/4 ", output, re.MULTILINE) == ["1", "2", "3", "4"]


def test_a_speech_run_skips_a_garbage_an_empty_and_a_missing_clip(two_processes):
    output, dataset = two_processes.output, two_processes.dataset
    assert two_processes.code == 0, output[-3000:]
    total = TONE_CLIPS["train"] + len(BAD_CLIPS)
    warning = f"warning: skipped 3 of {total} clips in split train of {dataset}"
    assert output.count(warning) == 1, "one line, from the node's first process"
    steps = [line for line in output.splitlines() if line.startswith("step ")]
    assert steps and all(line.endswith("| skipped 3 bad examples per epoch") for line in steps)
    assert "| skipped 3 bad examples per epoch" in next(
        line for line in output.splitlines() if line.startswith("training done")
    )
    assert (two_processes.workdir / "out" / "model" / "model.safetensors").exists()
