"""The built-in demo, run as a newcomer runs it, learns to transcribe speech it never heard."""

from __future__ import annotations

import json

import pytest

from tests.support.helpers import RESULT_LINE, run_trainer, trainer_env
from trainer.node.demo_assets import TEST_CLIPS

pytestmark = pytest.mark.slow


def test_demo_recipe_beats_the_untrained_wer_on_held_out_voices(tmp_path, demo_cache):
    """`python -m trainer --nproc_per_node 2` with nothing else: the demo recipe as shipped.

    The test clips are spoken by voices absent from training, half of them in word
    combinations absent from training too (tests/test_demo_assets.py checks that).
    """
    code, output = run_trainer(
        ["--nproc_per_node", "2", "--output_dir", "out"], cwd=tmp_path, env=trainer_env(demo_cache)
    )
    assert code == 0, output[-3000:]

    result = RESULT_LINE.search(output)
    assert result, f"no closing result line:\n{output[-2000:]}"
    before, after = float(result.group(1)), float(result.group(2))
    assert int(result.group(4)) == TEST_CLIPS
    assert result.group(5) == "out/model"
    assert "eval at step 0 |" in output, "the 'before' WER must come from a real evaluation"

    final_wer = json.loads((tmp_path / "out" / "eval_results.json").read_text())["eval_wer"]
    assert after == pytest.approx(final_wer, abs=0.05)
    assert final_wer < 50, output[-3000:]
    assert before - final_wer > 40, "training should cut the untrained WER by a clear margin"
