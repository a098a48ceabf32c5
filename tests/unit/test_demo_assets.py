"""The demo's offline assets: exact Whisper tokenizer, tiny model, synthesized speech set.

The tokenizer and model tests use the session's `demo_assets` (the demo's model); the tests
of the synthesized set itself read `spoken_assets` (espeak-ng, ~20 s: slow tier). The build
mechanics (cache reuse, interrupted and concurrent builds, each running espeak-ng on a few
clips) and the DeepSpeed CPU op's build: tests/processes/test_demo_assets_runs.py.
"""

import base64
import importlib.util
import sys
from pathlib import Path

import datasets
import pytest
import tiktoken
import torch
from transformers import WhisperForConditionalGeneration, WhisperProcessor, WhisperTokenizer

from trainer.common.errors import UserError
from trainer.tasks.speech_recognition.demo import (
    DEMO_SENTENCES,
    HELD_OUT_SENTENCES,
    TEST_CLIPS,
    TRAIN_CLIPS,
    build_whisper_tokenizer,
    default_clips,
    synthesize_speech_dataset,
)

WHISPER_PAT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

ENGLISH_TRANSCRIBE_PREFIX = [50258, 50259, 50359, 50363]

SAMPLE_TEXTS = [
    " Hello world",
    "hello world",
    "The quick brown fox jumps over the lazy dog, 1234567 times!",
    "Добар дан, како сте? Ово је тест ћирилице: љ, њ, џ, ђ, ћ.",
    "Dobar dan, kako ste? Ćevapi, šljive, žaba, đak.",
    "  multiple   spaces\tand\nnewlines  ",
    "Straße, naïve café, 日本語のテキスト, 한국어, emoji 🎉😀",
    "it's we're they've I'm you'll he'd",
]


@pytest.fixture(scope="session")
def tokenizer():
    return build_whisper_tokenizer()


@pytest.fixture(scope="session")
def tiktoken_encoding():
    """The reference: tiktoken with Whisper's own ranks and pre-tokenizer pattern."""
    whisper_dir = Path(importlib.util.find_spec("whisper").submodule_search_locations[0])
    lines = (whisper_dir / "assets" / "multilingual.tiktoken").read_bytes().splitlines()
    ranks = {
        base64.b64decode(token): int(rank)
        for token, rank in (line.split() for line in lines if line)
    }
    return tiktoken.Encoding(
        "whisper", pat_str=WHISPER_PAT, mergeable_ranks=ranks, special_tokens={}
    )


@pytest.fixture(scope="session")
def speech_dataset(spoken_assets, tmp_path_factory):
    """The demo's synthesized speech set, as `datasets` loads it."""
    cache = tmp_path_factory.mktemp("hf-datasets-cache")
    return datasets.load_dataset(
        "audiofolder", data_dir=str(spoken_assets.dataset_dir), cache_dir=str(cache)
    )


def test_tokenizer_has_the_multilingual_whisper_ids(tokenizer):
    expected = {
        "<|endoftext|>": 50257,
        "<|startoftranscript|>": 50258,
        "<|en|>": 50259,
        "<|zh|>": 50260,
        "<|sr|>": 50303,
        "<|su|>": 50357,
        "<|translate|>": 50358,
        "<|transcribe|>": 50359,
        "<|startoflm|>": 50360,
        "<|startofprev|>": 50361,
        "<|nospeech|>": 50362,
        "<|notimestamps|>": 50363,
        "<|0.00|>": 50364,
        "<|0.02|>": 50365,
        "<|30.00|>": 51864,
    }
    assert {token: tokenizer.convert_tokens_to_ids(token) for token in expected} == expected
    assert len(tokenizer) == 51865
    assert tokenizer.pad_token_id == tokenizer.eos_token_id == 50257
    # Whisper's timestamp decoding takes the id after the last special token as <|0.00|>.
    assert tokenizer.all_special_ids[-1] == 50363
    assert "<|sr|>" in tokenizer.all_special_tokens
    assert "<|0.00|>" not in tokenizer.all_special_tokens


@pytest.mark.parametrize("text", SAMPLE_TEXTS)
def test_tokenizer_matches_tiktoken(tokenizer, tiktoken_encoding, text):
    assert tokenizer.encode(text, add_special_tokens=False) == tiktoken_encoding.encode(text)


@pytest.mark.parametrize("text", SAMPLE_TEXTS)
def test_tokenizer_round_trips(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text


def test_saved_tokenizer_adds_the_language_and_task_prefix(demo_assets, tiktoken_encoding):
    tokenizer = WhisperTokenizer.from_pretrained(
        demo_assets.model_dir, language="english", task="transcribe"
    )
    ids = tokenizer("hello world").input_ids
    assert ids == [*ENGLISH_TRANSCRIBE_PREFIX, *tiktoken_encoding.encode("hello world"), 50257]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "hello world"
    serbian = WhisperTokenizer.from_pretrained(
        demo_assets.model_dir, language="serbian", task="transcribe"
    )
    assert serbian("здраво").input_ids[:4] == [50258, 50303, 50359, 50363]


def test_saved_tokenizer_keeps_the_english_spelling_normalizer(demo_assets):
    tokenizer = WhisperTokenizer.from_pretrained(demo_assets.model_dir)
    assert tokenizer.normalize("The Colour, Mr. Smith!") == "the color mister smith"


def test_tiny_model_reloads_and_generates_with_the_prefix(demo_assets, tmp_path):
    model = WhisperForConditionalGeneration.from_pretrained(demo_assets.model_dir)
    processor = WhisperProcessor.from_pretrained(demo_assets.model_dir)
    assert 3_000_000 < model.num_parameters() < 4_000_000
    frames = processor.feature_extractor.nb_max_frames
    assert frames == 2 * model.config.max_source_positions

    test_split = datasets.load_dataset(
        "audiofolder", data_dir=str(demo_assets.dataset_dir), cache_dir=str(tmp_path), split="test"
    ).cast_column("audio", datasets.Audio(sampling_rate=16000))
    waves = [test_split[i]["audio"].get_all_samples().data[0].numpy() for i in range(2)]
    features = processor.feature_extractor(
        waves, sampling_rate=16000, return_tensors="pt"
    ).input_features
    assert features.shape == (2, 80, frames)

    with torch.no_grad():
        output = model.generate(
            features,
            language="en",
            task="transcribe",
            max_new_tokens=8,
            return_dict_in_generate=True,
        )
    assert output.sequences[:, :4].tolist() == [ENGLISH_TRANSCRIBE_PREFIX] * 2
    generated = output.sequences[:, 4:]
    assert 1 <= generated.shape[1] <= 8, "at most max_new_tokens after the prompt"
    # The prompt is special tokens only: a transcript is what came after it, nothing more.
    texts = processor.batch_decode(output.sequences, skip_special_tokens=True)
    assert texts == processor.batch_decode(generated, skip_special_tokens=True)


@pytest.mark.slow
def test_speech_dataset_loads_as_audiofolder(speech_dataset):
    assert set(speech_dataset) == {"train", "test"}
    assert speech_dataset["train"].num_rows == TRAIN_CLIPS
    assert speech_dataset["test"].num_rows == TEST_CLIPS
    for split in speech_dataset.values():
        assert set(split.column_names) == {"audio", "transcription"}
    assert set(speech_dataset["test"]["transcription"]) <= set(DEMO_SENTENCES)
    native = speech_dataset["train"][0]["audio"].get_all_samples()
    assert native.sample_rate == 22050  # left for the training pipeline to resample


def test_test_clips_are_held_out_voices_and_partly_unseen_sentences():
    """The demo's WER is measured on voices, and some word combinations, never trained on."""
    clips = default_clips()
    train_texts = {text for text, _ in clips["train"]}
    train_voices = {voice.name for _, voice in clips["train"]}
    assert len(train_voices) >= 24
    assert not train_voices & {voice.name for _, voice in clips["test"]}
    unseen = [text for text, _ in clips["test"] if text not in train_texts]
    assert len(unseen) == HELD_OUT_SENTENCES < TEST_CLIPS
    assert default_clips() == clips, "the set is the same on every build"


@pytest.mark.slow
def test_speech_dataset_resamples_to_16k(speech_dataset):
    test_split = speech_dataset["test"].cast_column("audio", datasets.Audio(sampling_rate=16000))
    for example in test_split:
        samples = example["audio"].get_all_samples()
        assert samples.sample_rate == 16000
        assert samples.data.shape[0] == 1
        assert 0.3 < samples.data.shape[1] / 16000 < 4.0
        assert samples.data.abs().max() > 0.01  # speech, not silence


def test_missing_espeak_is_a_user_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UserError, match="espeak-ng"):
        synthesize_speech_dataset(tmp_path / "data")


def test_missing_whisper_assets_is_a_user_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "whisper", None)  # makes find_spec("whisper") None
    with pytest.raises(UserError, match="pip install --no-deps openai-whisper"):
        build_whisper_tokenizer()
