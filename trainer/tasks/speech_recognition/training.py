"""Speech recognition with Whisper, scored by word error rate (WER).

Unlike the classic recipe, no `datasets.map` pass computes log-mel features over the whole
corpus on every node before training: audio is decoded (and resampled to 16 kHz) when an
example is read, and log-mel features are computed a batch at a time, in one vectorised call,
so training starts with the first batch. `--log_mel_on` says where: on a GPU node the training
process computes them on its GPU, the loader only decoding audio; on CPU the loader.

Data sources (`--dataset_name`): a hub dataset, a local `audiofolder` directory (`metadata.csv`
or `metadata.jsonl` with a `file_name` column, at the top or in one folder per split), or a
local Common Voice-style directory (`clips/` plus `train.tsv`, `dev.tsv`, `test.tsv`, ...;
`dev` is the `validation` split).
"""

from __future__ import annotations

import math
import os
import string
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
from transformers import Seq2SeqTrainingArguments

from trainer.common.errors import UserError
from trainer.common.step_time import ForwardFlops, whisper_forward_flops
from trainer.data.bad_examples import mark_undecodable, screen
from trainer.data.example_ids import with_example_ids
from trainer.data.sources import (
    first_examples,
    load_split,
    select_source_columns,
    split_off_evaluation,
)
from trainer.data.streams import is_stream
from trainer.tasks.base import Task
from trainer.tasks.lora_adapters import eight_bit_loading
from trainer.tasks.speech_recognition.batches import SAMPLING_RATE, SpeechCollator
from trainer.tasks.speech_recognition.english_spelling import restore_english_spelling
from trainer.tasks.speech_recognition.serving import transcription
from trainer.tasks.speech_recognition.spec import SPEC, SpeechArguments, detect_local_layout
from trainer.tasks.speech_recognition.wer import eval_normalizer, word_error_rate
from trainer.tasks.speech_recognition.whisper_checkpoint import (
    Prompt,
    WhisperCheckpoint,
    language_name,
    read_checkpoint,
)

if TYPE_CHECKING:
    from datasets import Dataset


class SpeechRecognitionTask(Task):
    spec = SPEC
    training_arguments_class = Seq2SeqTrainingArguments
    default_metric = "wer"
    metric_names = ("wer",)  # word_error_rate
    lower_is_better = frozenset({"wer"})
    options: SpeechArguments
    _prompt: Prompt | None = None
    """The language and task tokens, once the model is loaded."""

    def check_model(self) -> None:
        """Refuse, before any launch, what the checkpoint's own files say it cannot do."""
        name = self.model_args.model_name_or_path
        checkpoint = read_checkpoint(name, self.model_args.cache_dir) if name else None
        if checkpoint is not None:
            checkpoint.prompt(self.options.language, self.options.whisper_task)
            checkpoint.check_processor(self.options.max_duration_in_seconds)

    @classmethod
    def settled_options(cls, options: SpeechArguments) -> SpeechArguments:
        if options.language is None:
            return options
        try:
            return replace(options, language=language_name(options.language))
        except ValueError as error:
            raise UserError(str(error)) from None

    @classmethod
    def required_training_arguments(cls, training: Mapping[str, Any]) -> dict[str, Any]:
        # WER needs generated text, and the collator needs the raw audio and text columns.
        required = {"predict_with_generate": True, "remove_unused_columns": False}
        if training.get("generation_max_length") is None:
            required["generation_max_length"] = 225
        return required

    def build_model_and_processor(self):
        from transformers import WhisperProcessor

        path, cache_dir = self.model_args.model_name_or_path, self.model_args.cache_dir
        processor = WhisperProcessor.from_pretrained(path, cache_dir=cache_dir)
        self._tokenizer = processor.tokenizer
        model = self._pretrained(**eight_bit_loading(self.model_args))
        checkpoint = WhisperCheckpoint.from_loaded(path, model, processor)
        checkpoint.check_processor(self.options.max_duration_in_seconds)
        self._prompt = checkpoint.prompt(self.options.language, self.options.whisper_task)
        use_prompt(self._prompt, model, processor.tokenizer)
        notice = restore_english_spelling(processor.tokenizer)
        if notice and os.environ.get("RANK", "0") == "0":
            print(notice, flush=True)
        if self.options.freeze_encoder:
            model.freeze_encoder()
        self._max_label_length = model.config.max_target_positions
        return model, processor

    def model_class(self):
        from transformers import WhisperForConditionalGeneration

        return WhisperForConditionalGeneration

    def _pretrained(self, **loading):
        return self.model_class().from_pretrained(
            self.model_args.model_name_or_path,
            cache_dir=self.model_args.cache_dir,
            attn_implementation=self.model_args.attn_implementation,
            **loading,
        )

    def model_to_merge_into(self):
        model = self._pretrained()
        use_prompt(self._prompt, model, self._tokenizer)
        return model

    def load_datasets(self, processor) -> tuple[Dataset, Dataset | None]:
        max_duration = (
            self.options.max_duration_in_seconds or processor.feature_extractor.chunk_length
        )
        data = self.data_args
        fraction = data.train_val_split
        train = self.interleaved(
            lambda source: source._load_split(
                data.train_split_name,
                data.max_train_samples if fraction is None else None,
                streaming=data.streaming,
            )
        )
        evaluation = None
        if fraction is not None:
            where = f"split {data.train_split_name} of {data.dataset_name}"
            train, evaluation = split_off_evaluation(train, fraction, self.seed, where)
            train = first_examples(train, data.max_train_samples)
            evaluation = first_examples(evaluation, data.max_eval_samples)
        train = filter_by_duration(
            train, self.options.min_duration_in_seconds, max_duration, self.data_args,
            f"split {data.train_split_name} of {data.dataset_name}",
        )  # fmt: skip
        if self.data_args.eval_split_name and fraction is None:
            evaluation = self.sources()[0]._load_split(  # interleaved: the first dataset's
                self.data_args.eval_split_name, self.data_args.max_eval_samples
            )
            where = f"split {data.eval_split_name} of {data.dataset_name}"
        if evaluation is not None:  # its undecodable clips counted, none dropped for length
            evaluation = filter_by_duration(evaluation, 0.0, math.inf, data, where, False)
        if self.length_column:
            train = self._with_label_lengths(train, processor.tokenizer)
            if evaluation is not None:
                evaluation = self._with_label_lengths(evaluation, processor.tokenizer)
        return train, evaluation

    def load_test_split(self, processor) -> Dataset:
        """The test split, its undecodable clips counted and dropped as the evaluation
        split's are (none dropped for length)."""
        data = self.data_args
        first = self.sources()[0]  # interleaved: the first dataset's, as evaluation
        source = first.load_source(data.test_split_name)
        test = first._selected(source, data.test_split_name)
        test = with_example_ids(test, source, self.options.audio_column_name)
        where = f"split {data.test_split_name} of {data.dataset_name}"
        return filter_by_duration(test, 0.0, math.inf, data, where, False)

    def references(self, dataset: Dataset) -> list:
        return list(dataset["text"])

    def predicted_values(self, predictions, processor) -> list[dict]:
        """The generated token ids as text, as the server answers: {"text": ...}."""
        tokenizer = processor.tokenizer
        ids = predictions[0] if isinstance(predictions, tuple) else predictions
        ids = np.where(ids < 0, tokenizer.pad_token_id, ids)  # the gather's padding
        texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
        return [transcription(text) for text in texts]

    def _with_label_lengths(self, dataset: Dataset, tokenizer) -> Dataset:
        """Each example's label token count, in the column the Trainer's length-grouped samplers
        read (else they look for `input_features`, which raw rows lack). Clips are padded to
        the 30 s window, so only decoder lengths vary: this reads transcripts, never audio."""
        normalize = self._target_normalizer()

        def label_lengths(texts: list[str]) -> dict[str, list[int]]:
            encoded = tokenizer([normalize(text) for text in texts]).input_ids
            return {self.length_column: [len(ids) for ids in encoded]}

        return dataset.map(
            label_lengths, batched=True, input_columns=["text"], desc="Counting label tokens"
        )

    @property
    def trainer_class(self):
        # imported when training only, as in Task.trainer_class
        from trainer.tasks.speech_recognition.trainer import WhisperTrainer

        return WhisperTrainer

    def data_collator(self, processor) -> SpeechCollator:
        return SpeechCollator(
            processor=processor,
            normalize_target=self._target_normalizer(),
            max_label_length=self._max_label_length,
            extract_features=not self._log_mel_on_device(),
        )

    def _log_mel_on_device(self) -> bool:
        if self.options.log_mel_on == "auto":
            import torch

            return torch.cuda.is_available()
        return self.options.log_mel_on == "device"

    def activation_values_per_sample(self, model) -> tuple[int, int]:
        """Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
        Models", sec. 4.1): a layer keeps 34 s h bytes in 16-bit, i.e. 17 s h values, for s
        positions of width h once fused attention (SDPA) keeps no score matrices. Encoder
        layers see the 1500 audio positions; decoder layers see the labels (at most
        `generation_max_length` tokens) and keep cross-attention K/V over the audio; the
        logits are kept in two copies. Checkpointing keeps each layer's input plus one
        layer being recomputed."""
        config = model.config
        frames, width = config.max_source_positions, config.d_model
        tokens = self.label_tokens(config)
        encoder_layer = 17 * frames * width
        decoder_layer = 21 * tokens * width + 2 * frames * width
        logits = 2 * tokens * config.vocab_size
        full = (
            config.encoder_layers * encoder_layer + config.decoder_layers * decoder_layer + logits
        )
        layer_inputs = (config.encoder_layers * frames + config.decoder_layers * tokens) * width
        checkpointed = layer_inputs + max(encoder_layer, decoder_layer) + logits
        return full, checkpointed

    def label_tokens(self, config) -> int:
        """The label positions a training batch has at most: labels longer than
        `generation_max_length` (225 unless given, as `required_training_arguments` sets it)
        could not be generated, and the model has `max_target_positions`. Batches are padded
        to their longest label only, so the estimates that use this are upper bounds."""
        return min(config.max_target_positions, self.training.get("generation_max_length") or 225)

    def forward_flops_per_sample(self, model) -> ForwardFlops:
        return whisper_forward_flops(model, self.label_tokens(model.config))

    def compute_metrics(self, processor) -> Callable:
        tokenizer = processor.tokenizer
        english = self._prompt is not None and self._prompt.english
        normalize = eval_normalizer(tokenizer, english, self.options.do_normalize_eval)

        def generated_wer(prediction) -> dict[str, float]:
            predicted_ids = prediction.predictions
            if isinstance(predicted_ids, tuple):
                predicted_ids = predicted_ids[0]
            predicted_ids = np.where(predicted_ids < 0, tokenizer.pad_token_id, predicted_ids)
            label_ids = np.where(
                prediction.label_ids < 0, tokenizer.pad_token_id, prediction.label_ids
            )
            predictions = tokenizer.batch_decode(predicted_ids, skip_special_tokens=True)
            references = tokenizer.batch_decode(label_ids, skip_special_tokens=True)
            return {"wer": word_error_rate(references, predictions, normalize)}

        return generated_wer

    def column_flags(self) -> dict[str, str]:
        return {
            "audio_column_name": self.options.audio_column_name,
            "text_column_name": self.options.text_column_name,
        }

    def _target_normalizer(self) -> Callable[[str], str]:
        steps = []
        if self.options.do_lower_case:
            steps.append(str.lower)
        if self.options.do_remove_punctuation:
            table = str.maketrans("", "", string.punctuation)
            steps.append(lambda text: text.translate(table))

        def normalize(text: str) -> str:
            for step in steps:
                text = step(text)
            return text.strip()

        return normalize

    def _load_split(self, spec: str, max_samples: int | None, streaming: bool = False):
        return self._selected(self.load_source(spec, streaming), spec, max_samples)

    def _selected(self, dataset, spec: str, max_samples: int | None = None):
        """`_load_split`'s audio and text columns of `dataset`, the split `spec`."""
        from datasets import Audio

        audio, text = self.options.audio_column_name, self.options.text_column_name
        dataset = select_source_columns(
            dataset,
            self.column_flags(),
            {audio: "audio", text: "text"},
            f"dataset {self.data_args.dataset_name} split {spec}",
        )
        dataset = first_examples(dataset, max_samples)
        return dataset.cast_column("audio", Audio(sampling_rate=SAMPLING_RATE))

    def load_source(self, spec: str, streaming: bool = False):
        from datasets import Audio

        dataset, directory = load_split(
            self.data_args, self.model_args.cache_dir, spec, detect_local_layout, streaming
        )
        if directory is None or detect_local_layout(directory).builder != "csv":
            return dataset  # the hub, or an audiofolder: the audio column is already there
        clips = directory / "clips"  # Common Voice: each TSV row names its clip in "path"
        dataset = dataset.map(
            lambda batch: {"audio": [str(clips / p) for p in batch["path"]]},
            batched=True,
            remove_columns=["path"],
        )
        return dataset.cast_column("audio", Audio())


def use_prompt(prompt: Prompt, model, tokenizer) -> None:
    """Make labels and generation start with the same tokens, and save them with the model.

    The tokenizer's attributes are set directly because `set_prefix_tokens` keeps its old value
    for a None argument, and a checkpoint may have been saved with a language. The generation
    config gets `language`/`task` (None on English-only checkpoints, where `generate()` refuses
    them), and released checkpoints' deprecated `forced_decoder_ids` are dropped: they would
    override the prompt in older transformers and warn in newer ones. The saved model then
    transcribes with a plain `generate()` or `pipeline()`."""
    tokenizer.language, tokenizer.task = prompt.language, prompt.task
    tokenizer.set_prefix_tokens(predict_timestamps=False)
    model.generation_config.language = prompt.language
    model.generation_config.task = prompt.task
    model.generation_config.forced_decoder_ids = None
    model.config.forced_decoder_ids = None


def filter_by_duration(
    dataset, low: float, high: float, data_args, where: str, training: bool = True
):
    """Drop clips outside [low, high] seconds, reading only each file's header, and clips whose
    header cannot be read (trainer/data/bad_examples.py: skipped and counted, up to
    `--max_bad_examples`). A stream is filtered as read, in the loader's workers, on the
    decoder that decoding makes anyway (it reads the header; the collator reads samples); a
    clip whose decoder cannot be made or read is kept, marked, for the stream to skip and count
    (`mark_undecodable`). The map-style path measures undecoded files in a pass with its own
    processes."""
    from datasets import Audio

    if is_stream(dataset):
        decoded = mark_undecodable(
            dataset.cast_column("audio", Audio(sampling_rate=SAMPLING_RATE)),
            "audio",
            _decoder_seconds,
        )
        # a module-level function, not a lambda: loader workers may be spawned (pickled)
        return decoded.filter(partial(_decoder_in_range, low, high), input_columns=["audio"])
    encoded = dataset.cast_column("audio", Audio(decode=False))
    readable, durations = screen(
        encoded, "audio", _duration_seconds, where, data_args.max_bad_examples,
        data_args.preprocessing_num_workers, "clips", training,
    )  # fmt: skip
    kept = readable.select([i for i, seconds in enumerate(durations) if low <= seconds <= high])
    return kept.cast_column("audio", Audio(sampling_rate=SAMPLING_RATE))


def _duration_seconds(audio: dict) -> float:
    from torchcodec.decoders import AudioDecoder

    return _decoder_seconds(AudioDecoder(audio["bytes"] if audio.get("bytes") else audio["path"]))


def _decoder_in_range(low: float, high: float, decoder) -> bool:
    """In range, or undecodable (None): that one goes on to be counted."""
    return decoder is None or low <= _decoder_seconds(decoder) <= high


def _decoder_seconds(decoder) -> float:
    duration = decoder.metadata.duration_seconds_from_header
    if duration is None:
        duration = decoder.get_all_samples().duration_seconds
    return duration


TASK = SpeechRecognitionTask
