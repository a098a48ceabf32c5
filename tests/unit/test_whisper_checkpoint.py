"""Each Whisper family's own prompt, and what the launcher refuses before any launch.

Fast, in-process checks on tiny checkpoints of the real families
(tests/support/whisper_families.py); tests/processes/test_whisper_families.py trains each
of them through the real entrypoint.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from transformers import EvalPrediction

from tests.support.helpers import checked_task, launch_is_a_tripwire
from trainer.common.errors import UserError
from trainer.launcher import main as launch
from trainer.tasks.speech_recognition.whisper_checkpoint import WhisperCheckpoint, read_checkpoint


@pytest.fixture
def launcher(monkeypatch, capsys, tmp_path, demo_assets):
    """`python -m trainer MODEL_FLAGS` in-process, with the launch of accelerate a tripwire;
    returns (exit code, stderr)."""

    def never_launch(*args):
        raise AssertionError(f"bad input reached the launch: {args}")

    launch_is_a_tripwire(monkeypatch, never_launch)
    monkeypatch.chdir(tmp_path)
    for name in ("CLUSTER_SPEC", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)

    def run(model_dir, *flags: str) -> tuple[int, str]:
        capsys.readouterr()  # what building the checkpoint printed is not the launcher's
        code = 0
        try:
            launch.main(
                ["--model_name_or_path", str(model_dir), "--dataset_name",
                 str(demo_assets.dataset_dir), "--text_column_name", "transcription", *flags]
            )  # fmt: skip
        except SystemExit as exit_info:
            code = exit_info.code
        return code, capsys.readouterr().err

    return run


REFUSED = [
    pytest.param("tiny.en", ["--language", "serbian"],
                 "--language serbian: {model} is an English-only Whisper checkpoint "
                 "(is_multilingual false)", id="english-only-other-language"),
    pytest.param("tiny.en", ["--whisper_task", "translate"],
                 "--whisper_task translate: {model} is an English-only Whisper checkpoint",
                 id="english-only-translate"),
    pytest.param("small", ["--language", "yue"],
                 "--language cantonese: {model} has no <|yue|> token (it knows 99 languages",
                 id="language-the-checkpoint-lacks"),
    pytest.param("large-v3", ["--max_duration_in_seconds", "10"],
                 "--max_duration_in_seconds 10 exceeds {model}'s 6 s input window",
                 id="longer-than-the-window"),
]  # fmt: skip


@pytest.mark.parametrize(("family", "flags", "message"), REFUSED)
def test_launcher_refuses_what_the_checkpoint_cannot_do(
    launcher, family_checkpoints, family, flags, message
):
    model = family_checkpoints(family)
    code, err = launcher(model, "--dry-run", *flags)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {message.format(model=model)}"), err


def test_launcher_refuses_a_processor_with_other_mel_bins(launcher, family_checkpoints, tmp_path):
    """A released checkpoint's layout: the feature extractor in preprocessor_config.json."""
    model = shutil.copytree(family_checkpoints("large-v3"), tmp_path / "mismatched")
    processor = json.loads((model / "processor_config.json").read_text())
    (model / "processor_config.json").unlink()
    feature_extractor = {**processor["feature_extractor"], "feature_size": 80}
    (model / "preprocessor_config.json").write_text(json.dumps(feature_extractor))
    code, err = launcher(model, "--dry-run")
    assert code == 2
    assert err.startswith(f"error: {model}: the model takes 128 mel bins (num_mel_bins in ")
    assert "but its processor makes 80" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("family", "flags"),
    [("tiny.en", ["--language", "en"]), ("small", []), ("large-v3", ["--language", "yue"])],
)
def test_what_the_checkpoint_can_do_passes(launcher, family_checkpoints, family, flags):
    code, err = launcher(family_checkpoints(family), "--dry-run", *flags)
    assert code == 0 and "error" not in err, err


def test_a_checkpoint_in_the_hub_cache_is_checked_without_network(family_checkpoints, tmp_path):
    """`openai/whisper-tiny.en`, already downloaded: its files are read from the cache."""
    cache = tmp_path / "hub"
    repo = cache / "models--openai--whisper-tiny.en"
    snapshot = repo / "snapshots" / "0123456789abcdef"
    shutil.copytree(family_checkpoints("tiny.en"), snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123456789abcdef")

    checkpoint = read_checkpoint("openai/whisper-tiny.en", str(cache))
    assert checkpoint is not None and not checkpoint.multilingual
    with pytest.raises(UserError, match="openai/whisper-tiny.en is an English-only"):
        checkpoint.prompt("serbian", "transcribe")
    assert read_checkpoint("openai/whisper-small", str(cache)) is None, "not cached: no check"


PROMPTS = [
    # family, flags, label prefix after <|startoftranscript|>, generation (language, task)
    pytest.param("tiny.en", [], ["<|notimestamps|>"], (None, None), id="english-only"),
    pytest.param("tiny.en", ["--language", "en"], ["<|notimestamps|>"], (None, None),
                 id="english-only-with-english"),
    pytest.param("small", ["--language", "sr"],
                 ["<|sr|>", "<|transcribe|>", "<|notimestamps|>"], ("serbian", "transcribe"),
                 id="multilingual"),
    pytest.param("small", ["--whisper_task", "translate"],
                 ["<|translate|>", "<|notimestamps|>"], (None, "translate"),
                 id="multilingual-no-language"),
    pytest.param("large-v3", ["--language", "yue"],
                 ["<|yue|>", "<|transcribe|>", "<|notimestamps|>"], ("cantonese", "transcribe"),
                 id="large-v3"),
]  # fmt: skip


@pytest.mark.parametrize(("family", "flags", "prefix", "generation"), PROMPTS)
def test_labels_and_generation_start_with_the_familys_prompt(
    family_checkpoints, demo_assets, family, flags, prefix, generation
):
    columns = ("--text_column_name", "transcription")
    model_dir = family_checkpoints(family)
    task = checked_task("speech-recognition", model_dir, demo_assets.dataset_dir, *columns, *flags)
    model, processor = task.build_model_and_processor()
    train, _ = task.load_datasets(processor)
    batch = task.data_collator(processor)([train[i] for i in range(2)])
    tokens = processor.tokenizer.convert_ids_to_tokens(batch["labels"][0][: len(prefix)])
    assert tokens == prefix
    config = model.generation_config
    assert (config.language, config.task) == generation
    assert config.forced_decoder_ids is None and model.config.forced_decoder_ids is None
    with torch.no_grad():
        generated = model.generate(batch["input_features"], max_new_tokens=2)
    assert generated.shape == (2, 2)


def test_english_only_checkpoints_score_with_the_english_normaliser(
    family_checkpoints, demo_assets
):
    """No --language on a `*.en` model still means English: "colour" and "color" match."""
    columns = ("--text_column_name", "transcription")
    model_dir = family_checkpoints("tiny.en")
    task = checked_task("speech-recognition", model_dir, demo_assets.dataset_dir, *columns)
    _, processor = task.build_model_and_processor()
    tokenizer = processor.tokenizer
    labels = tokenizer(["the colour red"], return_tensors="np").input_ids
    predictions = tokenizer(["the color red"], return_tensors="np").input_ids
    metrics = task.compute_metrics(processor)(EvalPrediction(predictions, labels))
    assert metrics["wer"] == 0
    assert np.isfinite(metrics["wer"])


def test_log_mel_on_the_device_uses_the_processors_128_mel_bins(family_checkpoints):
    """large-v3's processor makes 128 bins; the device path must compute the same."""
    from transformers import WhisperFeatureExtractor

    from trainer.tasks.speech_recognition.batches import LogMelOnDevice, _padded

    extractor = WhisperFeatureExtractor.from_pretrained(family_checkpoints("large-v3"))
    waveforms = [np.sin(np.linspace(0, 400 * np.pi, n)).astype(np.float32) for n in (8000, 24000)]
    expected = extractor(waveforms, sampling_rate=16_000, return_tensors="pt").input_features
    on_device = LogMelOnDevice(extractor, "cpu")(_padded(waveforms, extractor.n_samples))
    assert on_device.shape == expected.shape == (2, 128, extractor.nb_max_frames)
    torch.testing.assert_close(on_device, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("config", "generation", "multilingual"),
    [
        ({"vocab_size": 51864}, {}, False),  # an .en checkpoint with a pre-2023 generation config
        ({"vocab_size": 51865}, {}, True),
        ({}, {"lang_to_id": {"<|en|>": 50259}}, True),
        ({"vocab_size": 51864}, {"is_multilingual": True}, True),  # the file's word wins
        ({}, {}, True),  # nothing says English-only: nothing is refused for it
    ],
)
def test_english_only_is_read_from_what_the_files_say(config, generation, multilingual):
    checkpoint = WhisperCheckpoint.from_dicts("m", config, generation, None)
    assert checkpoint.multilingual is multilingual


def test_a_model_that_is_not_whisper_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "wav2vec2"}))
    with pytest.raises(UserError, match="is a wav2vec2 model, not Whisper"):
        read_checkpoint(str(tmp_path), None)
