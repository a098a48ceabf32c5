"""Assets of the built-in demo: a tiny Whisper model and a synthesized English speech set.

The demo fine-tunes a ~3.6 M parameter Whisper on about a thousand three-word sentences spoken
by `espeak-ng` in 36 voices, so the whole pipeline (audio decoding, resampling from 22,050 Hz
to 16 kHz, tokenization, accelerate + DeepSpeed, generation-based evaluation) runs end to end
in minutes on any machine. Everything is built locally, as training images must work without
network access or a model hub: the tokenizer is rebuilt from the `multilingual.tiktoken` ranks
shipped in `openai-whisper`, the model randomly initialised with a fixed seed, the audio
synthesized.

The set makes the demo's WER mean something: sentences combine words freely (the text alone
cannot predict them), and the test clips are spoken by voices never heard in training, half of
them in unheard word combinations. An earlier set (12 sentences, test voices also in training)
let the model learn the sentences as a language model and ignore the audio: WER 93.
"""

import base64
import csv
import itertools
import random
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    GenerationConfig,
    WhisperConfig,
    WhisperFeatureExtractor,
    WhisperForConditionalGeneration,
    WhisperProcessor,
    WhisperTokenizer,
)
from transformers.convert_slow_tokenizer import TikTokenConverter
from transformers.models.whisper.configuration_whisper import (
    NON_SPEECH_TOKENS,
    NON_SPEECH_TOKENS_MULTI,
)
from transformers.models.whisper.tokenization_whisper import LANGUAGES

from trainer.common.errors import UserError
from trainer.tasks.speech_recognition.english_spelling import (
    SPELLING_FILE,
    openai_spelling_file,
    whisper_package_dir,
)

ENDOFTEXT = "<|endoftext|>"
TASK_TOKENS = {"translate": "<|translate|>", "transcribe": "<|transcribe|>"}
MULTILINGUAL_LANGUAGES = 99
"""Multilingual Whisper models before large-v3 know 99 languages (LANGUAGES minus "yue");
large-v3 and its derivatives know all 100."""
TIMESTAMP_TOKENS = tuple(f"<|{i * 0.02:.2f}|>" for i in range(1501))

DEMO_WORDS = (
    ("two", "three", "four", "five", "six", "eight"),
    ("red", "green", "blue", "black", "white", "yellow"),
    ("cats", "dogs", "boxes", "cars", "birds", "shoes"),
)
"""A sentence is one word of each slot ("three red cats"): 216 combinations of 18 words.
Every word follows every other word of the slot before, so the text alone cannot tell
which word comes next: the model has to listen."""
DEMO_SENTENCES = tuple(" ".join(words) for words in itertools.product(*DEMO_WORDS))
HELD_OUT_SENTENCES = 12
"""Word combinations spoken only in the test split: a model that merely learned the
training sentences by heart gets them wrong."""

SPEAKERS = tuple(
    f"{accent}+{variant}"
    for accent in ("en", "en-us", "en-gb-scotland", "en-gb-x-rp", "en-029", "en-us-nyc")
    for variant in ("m1", "m3", "m7", "f1", "f2", "f4")
)
"""espeak-ng voices: an accent with a variant (pitch range, formants) on top."""
TEST_SPEAKERS = tuple(SPEAKERS[6 * accent + (accent + 3) % 6] for accent in range(6))
"""Voices that speak only in the test split: one per accent, each variant once."""
TRAIN_SPEAKERS = tuple(speaker for speaker in SPEAKERS if speaker not in TEST_SPEAKERS)
TRAIN_CLIPS = 960
TEST_CLIPS = 24


@dataclass(frozen=True)
class Voice:
    """How espeak-ng speaks one clip: voice, words per minute and base pitch (0-99)."""

    name: str
    speed: int
    pitch: int


def _random_voices(speakers: tuple[str, ...], count: int, rng: random.Random) -> list[Voice]:
    """`count` voices from `speakers`, each at a random speed and pitch."""
    return [
        Voice(speakers[i % len(speakers)], rng.randrange(130, 200), rng.randrange(25, 75))
        for i in range(count)
    ]


def default_clips() -> dict[str, list[tuple[str, Voice]]]:
    """The demo's speech set, seeded (the same on every machine): training clips in the training
    voices; test clips, half of them unheard sentences, in voices never heard in training."""
    rng = random.Random(0)
    sentences = list(DEMO_SENTENCES)
    rng.shuffle(sentences)
    held_out, seen = sentences[:HELD_OUT_SENTENCES], sentences[HELD_OUT_SENTENCES:]
    train_texts = [seen[i % len(seen)] for i in range(TRAIN_CLIPS)]
    rng.shuffle(train_texts)
    test_texts = held_out + rng.sample(seen, TEST_CLIPS - HELD_OUT_SENTENCES)
    train = list(zip(train_texts, _random_voices(TRAIN_SPEAKERS, TRAIN_CLIPS, rng), strict=True))
    test = list(zip(test_texts, _random_voices(TEST_SPEAKERS, TEST_CLIPS, rng), strict=True))
    return {"train": train, "test": test}


class _LocalTikTokenConverter(TikTokenConverter):
    """TikTokenConverter reading a local ranks file, without tiktoken's /tmp cache copy."""

    @staticmethod
    def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:
        lines = Path(tiktoken_url).read_bytes().splitlines()
        return {
            base64.b64decode(token): int(rank)
            for token, rank in (line.split() for line in lines if line)
        }


def language_tokens(num_languages: int = len(LANGUAGES)) -> tuple[str, ...]:
    """`<|en|>`, `<|zh|>`, ...: the first `num_languages` in Whisper's own order."""
    return tuple(f"<|{code}|>" for code in list(LANGUAGES)[:num_languages])


def build_whisper_tokenizer(
    multilingual: bool = True, num_languages: int = MULTILINGUAL_LANGUAGES
) -> WhisperTokenizer:
    """The exact Whisper tokenizer, rebuilt from openai-whisper's tiktoken ranks: multilingual
    models use `multilingual.tiktoken` (51,865 ids with 99 languages, 51,866 with large-v3's
    100), English-only `*.en` models `gpt2.tiktoken` (51,864 ids: GPT-2's vocabulary, then the
    same special tokens, language tokens included, as openai-whisper registers them). The
    converter derives a merge for every split of a token into two known tokens, which makes the
    BPE pick the same pieces as tiktoken."""
    encoding = "multilingual" if multilingual else "gpt2"
    ranks_file = str(whisper_package_dir() / "assets" / f"{encoding}.tiktoken")
    vocab, merges = _LocalTikTokenConverter(ranks_file).extract_vocab_merges_from_model(ranks_file)
    special_tokens = (
        "<|startoftranscript|>",
        *language_tokens(num_languages),
        *TASK_TOKENS.values(),
        "<|startoflm|>",
        "<|startofprev|>",
        "<|nospeech|>",
        "<|notimestamps|>",
    )
    tokenizer = WhisperTokenizer(
        vocab=vocab,
        merges=merges,
        normalizer_file=str(openai_spelling_file()),
        unk_token=ENDOFTEXT,
        bos_token=ENDOFTEXT,
        eos_token=ENDOFTEXT,
        pad_token=ENDOFTEXT,
        extra_special_tokens=list(special_tokens),
    )
    tokenizer.add_tokens(list(TIMESTAMP_TOKENS))
    return tokenizer


def begin_suppress_tokens(tokenizer: WhisperTokenizer) -> list[int]:
    """As in the released models: a transcript starts with neither a bare space nor its end."""
    return [
        *tokenizer.encode(" ", add_special_tokens=False),
        tokenizer.convert_tokens_to_ids(ENDOFTEXT),
    ]


def suppress_tokens(tokenizer: WhisperTokenizer, multilingual: bool) -> list[int]:
    """Released checkpoints' `suppress_tokens`: non-speech symbols (openai-whisper's lists, kept
    by transformers), then the start and task tokens no transcript holds."""
    ids = tokenizer.convert_tokens_to_ids
    symbols = NON_SPEECH_TOKENS_MULTI if multilingual else NON_SPEECH_TOKENS
    specials = ("<|startoftranscript|>", *TASK_TOKENS.values(), "<|startoflm|>", "<|startofprev|>",
                "<|nospeech|>")  # fmt: skip
    return [*(token for token in symbols if token < ids(ENDOFTEXT)), *map(ids, specials)]


def whisper_generation_config(
    tokenizer: WhisperTokenizer, multilingual: bool = True, **overrides
) -> GenerationConfig:
    """The generation config a released checkpoint ships, for this tokenizer's ids. English-only
    checkpoints carry no `lang_to_id`/`task_to_id` (so `generate()` refuses a language or task
    for them) and force `<|notimestamps|>` right after the start token; multilingual ones leave
    position 1 (the language) to detection and force transcribe. `max_length` counts generated
    tokens only (Whisper adds the prompt length itself)."""
    ids = tokenizer.convert_tokens_to_ids
    eot, start = ids(ENDOFTEXT), ids("<|startoftranscript|>")
    values = {
        "decoder_start_token_id": start,
        "bos_token_id": eot if multilingual else start,  # as published (50257 in both)
        "eos_token_id": eot,
        "pad_token_id": eot,
        "max_length": 448,
        "is_multilingual": multilingual,
        "no_timestamps_token_id": ids("<|notimestamps|>"),
        "prev_sot_token_id": ids("<|startofprev|>"),
        "max_initial_timestamp_index": 50,
        "return_timestamps": False,
        "suppress_tokens": suppress_tokens(tokenizer, multilingual),
        "begin_suppress_tokens": begin_suppress_tokens(tokenizer),
    }
    if multilingual:
        vocabulary = tokenizer.get_vocab()
        languages = [token for token in language_tokens() if token in vocabulary]
        values |= {
            "lang_to_id": {token: ids(token) for token in languages},
            "task_to_id": {task: ids(token) for task, token in TASK_TOKENS.items()},
            "forced_decoder_ids": [[1, None], [2, ids("<|transcribe|>")]],
        }
    else:
        values["forced_decoder_ids"] = [[1, ids("<|notimestamps|>")]]
    return GenerationConfig(**(values | overrides))


TINY_DIMENSIONS = {
    "d_model": 64,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
    "encoder_ffn_dim": 128,
    "decoder_ffn_dim": 128,
}
"""A ~3.6 M parameter Whisper: small enough to train in seconds on a CPU."""


def build_tiny_whisper(model_dir: Path, chunk_length: int = 3) -> None:
    """Save a randomly initialised (seed 0) tiny Whisper plus its processor to `model_dir`.
    `chunk_length` seconds of audio give `chunk_length * 100` mel frames, which the encoder's
    two convolutions halve to `max_source_positions`: a short window keeps the demo fast. It
    generates at most 64 tokens and suppresses none: a random model's first evaluations would
    otherwise run to 448 tokens per clip."""
    tokenizer = build_whisper_tokenizer()
    eot = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    config = WhisperConfig(
        vocab_size=len(tokenizer),
        num_mel_bins=80,
        **TINY_DIMENSIONS,
        max_source_positions=chunk_length * 50,
        max_target_positions=448,
        decoder_start_token_id=tokenizer.convert_tokens_to_ids("<|startoftranscript|>"),
        pad_token_id=eot,
        bos_token_id=eot,
        eos_token_id=eot,
        suppress_tokens=[],
        begin_suppress_tokens=begin_suppress_tokens(tokenizer),
    )
    generation = whisper_generation_config(
        tokenizer, max_length=64, suppress_tokens=[], forced_decoder_ids=None
    )
    save_random_whisper(model_dir, config, generation, tokenizer, chunk_length)


def save_random_whisper(
    model_dir: Path,
    config: WhisperConfig,
    generation: GenerationConfig,
    tokenizer: WhisperTokenizer,
    chunk_length: int,
) -> None:
    """Save a Whisper with random weights (seed 0) and its processor, as a hub folder is."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = WhisperForConditionalGeneration(config)
    model.generation_config = generation
    feature_extractor = WhisperFeatureExtractor(
        feature_size=config.num_mel_bins, chunk_length=chunk_length
    )
    processor = WhisperProcessor(feature_extractor=feature_extractor, tokenizer=tokenizer)
    model.save_pretrained(model_dir)
    processor.save_pretrained(model_dir)
    # save_pretrained skips the English spelling map that `tokenizer.normalize` needs.
    shutil.copyfile(openai_spelling_file(), model_dir / SPELLING_FILE)


def _speak(text: str, voice: Voice, wav_path: Path) -> None:
    """Synthesize one clip; the text goes through stdin so it is never parsed as an option."""
    subprocess.run(
        ["espeak-ng", "-v", voice.name, "-s", str(voice.speed), "-p", str(voice.pitch),
         "-w", str(wav_path), "--stdin"],
        input=text.encode(),
        check=True,
        capture_output=True,
    )  # fmt: skip


def _clips_for(sentences_per_split: dict[str, list[str]]) -> dict[str, list[tuple[str, Voice]]]:
    """Given sentences: the "test" split speaks in the test voices, other splits in the
    training voices, so no test clip duplicates a training clip."""
    rng = random.Random(0)
    return {
        split: list(
            zip(texts, _random_voices(TEST_SPEAKERS if split == "test" else TRAIN_SPEAKERS,
                                      len(texts), rng), strict=True)
        )
        for split, texts in sentences_per_split.items()
    }  # fmt: skip


def synthesize_speech_dataset(
    dataset_dir: Path, sentences_per_split: dict[str, list[str]] | None = None
) -> None:
    """Write an `audiofolder` dataset: `<split>/NNNN.wav` (22,050 Hz) + `<split>/metadata.csv`;
    without `sentences_per_split`, the demo's own set (`default_clips`). The WAVs keep espeak's
    native rate on purpose: the training pipeline must resample."""
    if shutil.which("espeak-ng") is None:
        raise UserError(
            "the demo synthesizes its speech with espeak-ng; install it (apt-get install espeak-ng)"
        )
    clips_per_split = _clips_for(sentences_per_split) if sentences_per_split else default_clips()
    jobs: list[tuple[str, Voice, Path]] = []
    for split, clips in clips_per_split.items():
        split_dir = dataset_dir / split
        split_dir.mkdir(parents=True)
        wavs = [split_dir / f"{index:04d}.wav" for index in range(len(clips))]
        rows = [(wav.name, text) for wav, (text, _) in zip(wavs, clips, strict=True)]
        _write_metadata(split_dir / "metadata.csv", rows)
        jobs += [(*clip, wav) for wav, clip in zip(wavs, clips, strict=True)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(lambda job: _speak(*job), jobs))


def _write_metadata(path: Path, rows: list[tuple[str, str]]) -> None:
    """The `metadata.csv` that `audiofolder` joins to the WAVs by `file_name`."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["file_name", "transcription"])
        writer.writerows(rows)


def build_model(model_dir: Path) -> None:
    """The demo's model (a demo module's two builders: trainer/tasks/task_spec.py)."""
    build_tiny_whisper(model_dir)


def build_dataset(dataset_dir: Path) -> None:
    """The demo's data: the synthesized speech set."""
    synthesize_speech_dataset(dataset_dir)
