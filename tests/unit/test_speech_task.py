"""The speech task on real audio: data layouts, resampling, batching and WER."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import EvalPrediction

from tests.support.helpers import checked_task, speech_task
from tests.support.tiny_assets import (
    BAD_CLIPS,
    TONE_CLIPS,
    tone_speech_with_bad_clips,
    write_tone_speech,
)
from trainer.command_line.parser import parse_flags
from trainer.common.errors import UserError
from trainer.data.bad_examples import skipped_per_epoch
from trainer.settings.data_flags import max_bad


def test_common_voice_directory_loads_mp3_at_16khz(demo_assets, common_voice_dir):
    task, _, processor = speech_task(
        demo_assets.model_dir, common_voice_dir, "--text_column_name", "sentence",
        "--train_split_name", "train+validation",
    )  # fmt: skip
    train, evaluation = task.load_datasets(processor)
    assert len(train) == 12 and len(evaluation) == 6
    assert train.column_names == ["audio", "text"]
    example = train[0]
    assert example["text"].startswith('"') and "it's fine" in example["text"]
    samples = example["audio"].get_all_samples()
    assert samples.sample_rate == 16_000
    assert 0.3 < samples.duration_seconds < 4


def test_audiofolder_duration_filter_reads_headers(demo_assets):
    task, _, processor = speech_task(
        demo_assets.model_dir, demo_assets.dataset_dir, "--text_column_name", "transcription",
        "--max_duration_in_seconds", "1.4",
    )  # fmt: skip
    train, _ = task.load_datasets(processor)
    durations = [ex["audio"].get_all_samples().duration_seconds for ex in train]
    assert 0 < len(train) < TONE_CLIPS["train"], "the filter should keep some clips and drop others"
    assert max(durations) <= 1.4 + 0.01


def test_max_duration_beyond_the_model_window_is_refused(demo_assets):
    """Before any launch: the launcher reads the window from preprocessor_config.json."""
    with pytest.raises(UserError, match="exceeds .*tiny-whisper-v2's 3 s input window"):
        checked_task(
            "speech-recognition", demo_assets.model_dir, demo_assets.dataset_dir,
            "--text_column_name", "transcription", "--max_duration_in_seconds", "20",
        )  # fmt: skip


def test_collator_makes_whisper_batches_from_raw_audio(demo_assets):
    task, model, processor = speech_task(
        demo_assets.model_dir, demo_assets.dataset_dir, "--text_column_name", "transcription",
        "--do_lower_case", "true", "--do_remove_punctuation", "true",
    )  # fmt: skip
    train, _ = task.load_datasets(processor)
    examples = [train[i] for i in range(3)]
    examples[0]["text"] = "Hello, World! Hello again."  # longer than the demo's sentences
    batch = task.data_collator(processor)(examples)

    frames = 2 * model.config.max_source_positions
    assert tuple(batch["input_features"].shape) == (3, 80, frames)
    labels = batch["labels"]
    tokenizer = processor.tokenizer
    # the start-of-transcript token is stripped (the model prepends it when shifting)
    assert (labels[:, 0] == tokenizer.convert_tokens_to_ids("<|en|>")).all()
    assert (labels == -100).any(), "shorter label rows are padded with -100"
    first = labels[0][labels[0] != -100]
    assert tokenizer.decode(first, skip_special_tokens=True) == "hello world hello again"
    loss = model(**batch).loss
    assert np.isfinite(loss.item())


def test_word_error_rate(demo_assets):
    task, _, processor = speech_task(
        demo_assets.model_dir, demo_assets.dataset_dir, "--text_column_name", "transcription"
    )
    tokenizer = processor.tokenizer
    references = ["the cat sat on the mat", "red green blue"]
    hypotheses = ["the cat sat on a mat", "red green blue"]
    labels = tokenizer(references, padding=True, return_tensors="np")
    label_ids = np.where(labels.attention_mask == 1, labels.input_ids, -100)
    predictions = tokenizer(hypotheses, padding=True, return_tensors="np").input_ids
    metrics = task.compute_metrics(processor)(EvalPrediction(predictions, label_ids))
    assert metrics["wer"] == pytest.approx(100 * 1 / 9)
    perfect = task.compute_metrics(processor)(EvalPrediction(label_ids, label_ids))
    assert perfect["wer"] == 0


def test_log_mel_on_device_gives_the_loaders_features(demo_assets, tmp_path):
    """`--log_mel_on device`: the loader sends padded audio; the Trainer computes the same
    features on the training device (the CPU here) before the batch reaches the model."""
    from transformers import Seq2SeqTrainingArguments

    flags = ("--text_column_name", "transcription")
    task, model, processor = speech_task(
        demo_assets.model_dir, demo_assets.dataset_dir, *flags, "--log_mel_on", "device"
    )
    train, _ = task.load_datasets(processor)
    # fresh decoders for each collator: decoding one decoder twice may resample differently
    audio_batch = task.data_collator(processor)([train[i] for i in range(3)])
    assert set(audio_batch) == {"input_audio", "labels"}
    assert tuple(audio_batch["input_audio"].shape) == (3, processor.feature_extractor.n_samples)

    loader_task, _, _ = speech_task(
        demo_assets.model_dir, demo_assets.dataset_dir, *flags, "--log_mel_on", "loader"
    )
    loader_batch = loader_task.data_collator(processor)([train[i] for i in range(3)])
    assert set(loader_batch) == {"input_features", "labels"}

    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    trainer = task.trainer_class(model=model, args=args, processing_class=processor)
    prepared = trainer._prepare_inputs(audio_batch)
    assert "input_audio" not in prepared
    torch.testing.assert_close(prepared["input_features"], loader_batch["input_features"])
    assert torch.equal(prepared["labels"], loader_batch["labels"])
    assert np.isfinite(model(**prepared).loss.item())


def test_attention_is_sdpa_unless_a_flag_says_otherwise(demo_assets):
    flags = (demo_assets.model_dir, demo_assets.dataset_dir, "--text_column_name", "transcription")
    _, model, _ = speech_task(*flags)
    assert model.config._attn_implementation == "sdpa"
    _, eager, _ = speech_task(*flags, "--attn_implementation", "eager")
    assert eager.config._attn_implementation == "eager"


def test_group_by_length_gets_label_lengths_from_the_transcripts(demo_assets, tmp_path):
    # The demo's sentences all have three one-token words: transcripts of differing lengths.
    data = tmp_path / "speech"
    write_tone_speech(
        data,
        {"train": ["one", "red green blue", "the dog runs fast today", "open the door please"],
         "test": ["good morning"]},
    )  # fmt: skip
    flags = (demo_assets.model_dir, data, "--text_column_name", "transcription")
    task, model, processor = speech_task(*flags, "--train_sampling_strategy", "group_by_length")
    train, evaluation = task.load_datasets(processor)
    for split in (train, evaluation):
        expected = [len(processor.tokenizer(text).input_ids) for text in split["text"]]
        assert split["length"] == expected
    assert len(set(train["length"])) > 1, "lengths should differ, or grouping means nothing"

    from transformers import Seq2SeqTrainingArguments
    from transformers.trainer_pt_utils import LengthGroupedSampler

    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path), train_sampling_strategy="group_by_length", use_cpu=True,
        per_device_train_batch_size=4, report_to=[], remove_unused_columns=False,
    )  # fmt: skip
    trainer = task.trainer_class(
        model=model, args=args, train_dataset=train, processing_class=processor
    )
    sampler = trainer._get_train_sampler()
    assert isinstance(sampler, LengthGroupedSampler)
    assert sampler.lengths == train["length"]


def test_undecodable_clips_are_skipped_and_counted_up_to_the_limit(demo_assets, tmp_path, capsys):
    dataset = tone_speech_with_bad_clips(demo_assets, tmp_path / "speech")
    flags = ["--text_column_name", "transcription", "--max_bad_examples", "3"]
    task, _, processor = speech_task(demo_assets.model_dir, dataset, *flags)
    skipped_before = skipped_per_epoch()  # of splits other tests in this process loaded
    train, evaluation = task.load_datasets(processor)
    out = capsys.readouterr().out
    total = TONE_CLIPS["train"] + 3
    assert f"warning: skipped 3 of {total} clips in split train of {dataset}" in out
    named = re.search(r"first: (\S+), (\S+), (\S+?)(?: in \S+)?\)", out)  # a long folder once
    assert named and sorted(Path(name.rstrip(",")).name for name in named.groups()) == sorted(
        BAD_CLIPS
    )
    assert skipped_per_epoch() - skipped_before == 3
    assert len(train) == TONE_CLIPS["train"] and len(evaluation) == TONE_CLIPS["test"]
    assert all(example["audio"].get_all_samples().duration_seconds > 0 for example in train)

    task, _, processor = speech_task(
        demo_assets.model_dir, dataset, "--text_column_name", "transcription",
        "--max_bad_examples", "2",
    )  # fmt: skip
    with pytest.raises(UserError, match=rf"3 of {total} clips in split train of .* cannot be "
                       r"decoded, more than --max_bad_examples 2 allows \(2\); first: "
                       r"\S+\.wav, \S+\.wav, \S+\.wav( in \S+/)?$"):  # fmt: skip
        task.load_datasets(processor)


@pytest.mark.parametrize(("spec", "total", "limit"), [("3", 10, 3), ("1%", 1000, 10),
                                                      ("1%", 50, 0), ("0", 5, 0)])  # fmt: skip
def test_max_bad_examples_is_a_count_or_a_share_of_the_split(spec, total, limit):
    assert max_bad(spec, total) == limit


@pytest.mark.parametrize("spec", ["-1", "x", "120%"])
def test_a_bad_max_bad_examples_is_refused(demo_assets, spec):
    with pytest.raises(UserError, match="--max_bad_examples"):
        parse_flags(["--task", "speech-recognition", "--max_bad_examples", spec])
