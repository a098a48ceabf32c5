"""Every Whisper family users fine-tune trains, evaluates, saves and transcribes.

Each case builds a tiny checkpoint of a real family (tests/support/whisper_families.py), trains it
2 steps through `python -m trainer` with one process and no DeepSpeed (what differs between
families is their configuration, tokenizer and prompt, not how processes share the work or
hold the optimizer: Whisper under DeepSpeed on several processes is the demo's, the LoRA
tests' and the fault tests' run), evaluates with `generate()`, saves, and then uses the saved
folder in a fresh process with plain transformers: `generate()` with no arguments and
`pipeline("automatic-speech-recognition")`. The prompt that generation chose and the saved
tokenizer's label prefix must be the family's own: no language or task token for
English-only checkpoints.

The cases' trainings are independent one-process runs: they run two at a time, each on its
own rendezvous port, from one fixture (a run waits on imports, saving and its peer's
evaluation about as much as it computes, so two share the 2-core machine's CPUs well); the
delivered models are then used in one fresh process, one after the other.
"""

from __future__ import annotations

import json
import re
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.helpers import run_trainer, trainer_env, use_delivered_models

pytestmark = pytest.mark.slow

TWO_STEPS = [
    "--nproc_per_node", "1",
    "--deepspeed", "none",
    "--text_column_name", "transcription",
    "--max_steps", "2",
    "--per_device_train_batch_size", "2",
    "--per_device_eval_batch_size", "2",
    "--max_eval_samples", "4",
    "--generation_max_length", "8",
    "--eval_strategy", "no",
    "--do_eval", "true",  # evaluation after training only
    "--save_strategy", "no",
    "--logging_steps", "1",
    "--output_dir", "out",
]  # fmt: skip

DETECTED = "<|detected language|>"
"""Stands for whichever language token generate() detected (a random model's guess)."""

CASES = {
    # name: (family, flags, prompt generate() must start with, label prefix)
    "english-only": (
        "tiny.en", [],
        ["<|startoftranscript|>", "<|notimestamps|>"],
        ["<|startoftranscript|>", "<|notimestamps|>"],
    ),
    # transformers 5 saves no normalizer.json: a model it saved (this project's delivered
    # model, say) has no English spelling table
    "english-only-saved-by-transformers-5": (
        "tiny.en", [],
        ["<|startoftranscript|>", "<|notimestamps|>"],
        ["<|startoftranscript|>", "<|notimestamps|>"],
    ),
    "multilingual-transcribe": (
        "small", ["--language", "en"],
        ["<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"],
        ["<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"],
    ),
    "multilingual-translate": (
        "small", ["--language", "fr", "--whisper_task", "translate"],
        ["<|startoftranscript|>", "<|fr|>", "<|translate|>", "<|notimestamps|>"],
        ["<|startoftranscript|>", "<|fr|>", "<|translate|>", "<|notimestamps|>"],
    ),
    "multilingual-no-language": (
        "small", [],
        ["<|startoftranscript|>", DETECTED, "<|transcribe|>", "<|notimestamps|>"],
        ["<|startoftranscript|>", "<|transcribe|>", "<|notimestamps|>"],
    ),
    "large-v3-log-mel-on-device": (
        "large-v3", ["--language", "yue", "--log_mel_on", "device"],
        ["<|startoftranscript|>", "<|yue|>", "<|transcribe|>", "<|notimestamps|>"],
        ["<|startoftranscript|>", "<|yue|>", "<|transcribe|>", "<|notimestamps|>"],
    ),
    "large-v3-turbo": (
        "large-v3-turbo", ["--language", "en"],
        ["<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"],
        ["<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"],
    ),
    "distil-large-v3": (
        "distil-large-v3", ["--language", "english"],
        ["<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"],
        ["<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"],
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def family_runs(request, family_checkpoints, demo_assets, demo_cache, tmp_path_factory):
    """case -> (its run's folder, a future of its exit code and output), for the cases this
    session runs, started when the first of them runs, two at a time in CASES' order."""
    wanted = [item.callspec.params["case"] for item in request.session.items
              if item.module is request.module]  # fmt: skip
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs: dict[str, tuple[Path, Future]] = {}
        for case in (case for case in CASES if case in wanted):
            family, flags, _, _ = CASES[case]
            model_in = family_checkpoints(family)
            workdir = tmp_path_factory.mktemp(case)
            if case == "english-only-saved-by-transformers-5":
                model_in = shutil.copytree(model_in, workdir / "saved-by-transformers-5")
                (model_in / "normalizer.json").unlink()
            argv = ["--model_name_or_path", str(model_in),
                    "--dataset_name", str(demo_assets.dataset_dir), *TWO_STEPS, *flags]  # fmt: skip
            runs[case] = (workdir, pool.submit(run_trainer, argv, workdir, trainer_env(demo_cache)))
        yield runs


@pytest.fixture(scope="module")
def delivered_uses(family_runs, demo_assets) -> dict[str, dict]:
    """case -> what its delivered model gave in a fresh process with plain transformers, for
    every case whose run succeeded: the models are used one after the other in one process."""
    clip = next((demo_assets.dataset_dir / "test").glob("*.wav"))
    delivered = [case for case, (_, run) in family_runs.items() if run.result()[0] == 0]
    uses = [(family_runs[case][0] / "out" / "model", clip) for case in delivered]
    return dict(zip(delivered, use_delivered_models("speech-recognition", uses), strict=True))


@pytest.mark.parametrize("case", CASES)
def test_family_trains_evaluates_saves_and_transcribes(case, family_runs, delivered_uses):
    _, _, prompt, label_prefix = CASES[case]
    tmp_path, run = family_runs[case]
    code, output = run.result()
    assert code == 0, output[-4000:]
    assert re.search(r"step 2/2 \(100%\)", output), output[-3000:]
    evaluation = json.loads((tmp_path / "out" / "eval_results.json").read_text())
    # The final evaluation generated and scored text: a model trained 2 steps from random
    # weights gets words wrong (WER above 0), and its at most 8 generated tokens
    # (--generation_max_length) against 3-word references make at most 8 errors a clip
    # (a model repeating one word 8 times reaches that bound: 266.7).
    assert 0 < evaluation["eval_wer"] <= 100 * 8 / 3 + 1e-6, evaluation

    used = delivered_uses[case]

    assert used["label_prefix"] == label_prefix
    if DETECTED in prompt:
        detected = used["prompt"][prompt.index(DETECTED)]
        assert re.fullmatch(r"<\|[a-z]{2,3}\|>", detected), used["prompt"]
        prompt = [detected if token == DETECTED else token for token in prompt]
    assert used["prompt"] == prompt
    assert 0 < used["generated_tokens"] <= 448 and used["largest_id"] < used["vocab_size"]
    # generate() and the pipeline (a 5-beam search by default) both turn the clip into
    # words: neither stops at once nor yields special tokens only
    assert used["generated_text"].strip() and used["pipeline_text"].strip(), used
    # English WER's spelling table came with the model (released checkpoints carry it)
    assert used["normalized"] == "the color of the flavor", used
    if case == "english-only-saved-by-transformers-5":
        assert "English WER uses openai-whisper's spelling table" in output, output[-3000:]
