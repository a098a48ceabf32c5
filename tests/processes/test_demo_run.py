"""The built-in demo, run as a newcomer runs it (`python -m trainer --nproc_per_node 2`,
nothing else: the demo recipe as shipped, 280 steps), once for the module: it learns to
transcribe speech it never heard, through the real entrypoint with two processes and
DeepSpeed ZeRO-2, and prints no warning or progress bar that is not on
trainer/common/quiet.py's allow-list."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.helpers import RESULT_LINE, run_trainer, speech_demo_in, trainer_env
from tests.support.log_noise import noise_lines
from tests.support.speech_run_checks import (
    assert_trained_model_reloads_and_generates,
    evaluations,
    rank_reports,
)
from trainer.tasks.speech_recognition.demo import TEST_CLIPS

pytestmark = pytest.mark.slow

STEPS = 280
"""The demo recipe's max_steps (trainer/recipes/demo.yaml); it evaluates every 140."""


@dataclass
class DemoRun:
    code: int
    output: str
    workdir: Path
    """Where it ran: `out/` holds its checkpoints, metrics and model."""


@pytest.fixture(scope="module")
def shipped_demo(tmp_path_factory, demo_cache) -> DemoRun:
    """The one run the module's tests read. 2 minutes of training on 2 idle cores, 10 or more
    on a loaded machine: it may take longer than a short run's default 10 minutes."""
    workdir = tmp_path_factory.mktemp("shipped-demo")
    code, output = run_trainer(
        ["--nproc_per_node", "2", "--output_dir", "out"],
        cwd=workdir,
        env=trainer_env(demo_cache),
        timeout=1800,
    )
    return DemoRun(code, output, workdir)


def test_demo_recipe_beats_the_untrained_wer_on_held_out_voices(shipped_demo):
    """The test clips are spoken by voices absent from training, half of them in word
    combinations absent from training too (test_demo_assets.py checks that)."""
    output = shipped_demo.output
    assert shipped_demo.code == 0, output[-3000:]

    result = RESULT_LINE.search(output)
    assert result, f"no closing result line:\n{output[-2000:]}"
    before, after = float(result.group(1)), float(result.group(2))
    assert int(result.group(4)) == TEST_CLIPS
    assert result.group(5) == "out/model"
    assert "eval at step 0 |" in output, "the 'before' WER must come from a real evaluation"

    final_wer = json.loads((shipped_demo.workdir / "out" / "eval_results.json").read_text())
    final_wer = final_wer["eval_wer"]
    assert after == pytest.approx(final_wer, abs=0.05)
    assert final_wer < 50, output[-3000:]
    assert before - final_wer > 40, "training should cut the untrained WER by a clear margin"


def test_demo_trains_two_processes_with_zero2(shipped_demo, demo_cache):
    """The built-in default (no model, no dataset) through the real entrypoint: two ranks
    on distinct batches, the recipe's evaluations, ZeRO-2 checkpoints, TensorBoard logs,
    the time-to-first-step line, and a model that reloads and transcribes."""
    output, workdir = shipped_demo.output, shipped_demo.workdir
    assert shipped_demo.code == 0, output[-3000:]

    reports = rank_reports(output)
    assert set(reports) == {0, 1}
    assert all(world == 2 for world, _, _ in reports.values())
    assert reports[0][2] != reports[1][2], "both ranks trained on the same batch"
    # a training batch (the recipe's 16 per device), not the evaluation at step 0
    # (--eval_on_start, 12 per device)
    assert output.count("first batch of 16 examples") == 2
    last_eval = f"eval at step {STEPS} |"
    assert output.count(last_eval) == 1, "the last step's evaluation is not redone"
    assert re.search(rf"step {STEPS}/{STEPS} \(100%\) \| epoch [\d.]+ \| loss [\d.]+", output)
    assert re.search(r"samples/s \| data wait \d+% \|", output)
    startup = re.search(r"time to first step: ([\d.]+) s \((.*)\)", output)
    assert startup, "no time-to-first-step line"
    phases = dict(re.findall(r"([a-z ,]+?) ([\d.]+) s(?:, |$)", startup.group(2)))
    assert [p.strip(", ") for p in phases] == [
        "launcher, torchrun and imports", "flags", "rendezvous", "model",
        "data and resume point", "engine start and first step"]  # fmt: skip
    assert sum(map(float, phases.values())) == pytest.approx(float(startup.group(1)), abs=0.5)

    out = workdir / "out"
    # --eval_on_start (the demo recipe) scores the untrained model at step 0, then every
    # 140 steps; the results saved are the last step's, and training lowered the loss.
    scores = evaluations(output)
    assert sorted(scores) == [0, STEPS // 2, STEPS], output[-3000:]
    eval_results = json.loads((out / "eval_results.json").read_text())
    loss, wer = scores[STEPS]
    assert eval_results["eval_loss"] == pytest.approx(loss, abs=1e-4)
    assert eval_results["eval_wer"] == pytest.approx(wer, abs=1e-4)
    assert loss < scores[0][0], f"evaluation loss {scores[0][0]} before training, {loss} after"
    assert (
        f"result: WER {scores[0][1]:.1f} before training -> {wer:.1f} after {STEPS} steps" in output
    )
    checkpoint = out / f"checkpoint-{STEPS}"
    shards = list((checkpoint / f"global_step{STEPS}").glob("*optim_states.pt"))
    assert len(shards) == 2, "ZeRO-2 writes one optimizer shard per rank"
    assert json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == STEPS
    assert list((out / "runs").rglob("events.out.tfevents.*")), "no TensorBoard logs"
    assert not (workdir / ".deepspeed_env").exists(), ".deepspeed_env would hold the env"
    demo = demo_cache / "demo"
    assert_trained_model_reloads_and_generates(
        out / "model", speech_demo_in(demo).model_dir, speech_demo_in(demo).dataset_dir
    )


def test_the_demo_prints_no_unlisted_warning_or_bar(shipped_demo):
    """Only meaningful lines: every warning or progress bar a real 2-process run prints is
    on trainer/common/quiet.py's allow-list (the whole run: evaluations, saves, delivery)."""
    output = shipped_demo.output
    assert shipped_demo.code == 0, output[-3000:]
    assert f"eval at step {STEPS}" in output and "final model and processor saved" in output
    assert noise_lines(output) == [], "not on trainer/common/quiet.py's allow-list"


def test_trainer_predict_scores_the_held_out_clips_as_the_last_evaluation_did(
    shipped_demo, demo_cache, tmp_path
):
    """`python -m trainer.predict` in a fresh process, the delivered model over the demo's
    test folder (the clips the run's last evaluation scored), through the server's own
    pre- and post-processing: one line per clip, and the WER the run's evaluation reported."""
    out = shipped_demo.workdir / "out"
    assert shipped_demo.code == 0, shipped_demo.output[-3000:]
    test_clips = speech_demo_in(demo_cache / "demo").dataset_dir / "test"
    done = subprocess.run(
        [sys.executable, "-m", "trainer.predict", str(out / "model"), str(test_clips),
         str(tmp_path / "predicted"), "--parameters", '{"language": "en"}'],
        cwd=tmp_path, env=trainer_env(demo_cache), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = (tmp_path / "predicted" / "predictions.jsonl").read_text().splitlines()
    predictions = [json.loads(line) for line in lines]
    assert len(predictions) == TEST_CLIPS
    assert all(set(p) == {"id", "reference", "prediction"} for p in predictions)
    results = json.loads((tmp_path / "predicted" / "test_results.json").read_text())
    evaluated = json.loads((out / "eval_results.json").read_text())
    assert results["test_samples"] == TEST_CLIPS
    assert results["test_wer"] == pytest.approx(evaluated["eval_wer"], abs=1e-6), predictions
