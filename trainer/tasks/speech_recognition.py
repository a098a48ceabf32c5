"""The speech recognition task's spec: Whisper models, their flags, the local layouts of
speech datasets, and how a delivered Whisper serves and is scored (the training code:
trainer/tasks/speech.py)."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from trainer.common.errors import UserError
from trainer.common.flag_fields import flag
from trainer.data.sources import FOLDER_METADATA, LocalLayout, check_utf8, table_header
from trainer.tasks.instance_media import InstanceError
from trainer.tasks.predictor import Predictor, Prepared
from trainer.tasks.task_spec import TaskSpec

CHUNK_SECONDS = 30
"""Whisper's window: longer audio is cut into chunks of it, as `pipeline(chunk_length_s=30)`."""


@dataclass(frozen=True)
class SpeechArguments:
    audio_column_name: str = flag("audio", "Column with the audio.")
    text_column_name: str = flag("text", "Column with the transcription (Common Voice: sentence).")
    language: str | None = flag(
        None,
        "Spoken language (english, en, ...); unset: generate() detects each clip's.",
    )
    whisper_task: Literal["transcribe", "translate"] = flag(
        "transcribe",
        "Whisper's task (*.en checkpoints only transcribe).",
    )
    max_duration_in_seconds: float | None = flag(
        None, "Drop longer clips (default: the model's input window, 30 s for Whisper)."
    )
    min_duration_in_seconds: float = flag(0.0, "Drop shorter clips.")
    do_lower_case: bool = flag(False, "Lower-case training targets.")
    do_remove_punctuation: bool = flag(False, "Remove punctuation from training targets.")
    do_normalize_eval: bool = flag(
        True, "Normalise predictions and references (Whisper's normaliser) for WER."
    )
    freeze_encoder: bool = flag(False, "Train the decoder only (keeps the audio encoder fixed).")
    log_mel_on: Literal["auto", "loader", "device"] = flag(
        "auto",
        "Where log-mel features are computed (auto: the device if it is a GPU).",
    )

    def __post_init__(self) -> None:
        if self.max_duration_in_seconds is not None and self.max_duration_in_seconds <= 0:
            raise ValueError("--max_duration_in_seconds must be positive.")
        if (
            self.max_duration_in_seconds is not None
            and self.min_duration_in_seconds >= self.max_duration_in_seconds
        ):
            raise ValueError(
                "--min_duration_in_seconds must be smaller than --max_duration_in_seconds."
            )


def is_whisper(config: dict) -> bool:
    architectures = " ".join(config.get("architectures") or [])
    return config.get("model_type") == "whisper" or "Whisper" in architectures


COMMON_VOICE_SPLIT_FILES = {"dev": "validation"}
"""Common Voice calls its validation split `dev.tsv`; the rest keep their file stem."""


def detect_local_layout(directory: Path) -> LocalLayout:
    """Recognise an audiofolder or Common Voice-style directory from its files."""
    tsv_files = sorted(directory.glob("*.tsv"))
    if (directory / "clips").is_dir() and tsv_files:
        header = table_header(tsv_files[0])
        for path in tsv_files[1:]:  # every split's table is read when one split is loaded
            check_utf8(path)
        return LocalLayout(
            builder="csv",
            splits={
                COMMON_VOICE_SPLIT_FILES.get(path.stem, path.stem): [path] for path in tsv_files
            },
            columns=frozenset(header) - {"path"} | {"audio"},
            load_kwargs={"delimiter": "\t", "quoting": csv.QUOTE_NONE},
        )
    metadata = _audiofolder_metadata(directory)
    if metadata:
        header = table_header(next(iter(metadata.values())))
        return LocalLayout(
            builder="audiofolder",
            splits={name: [path.parent] for name, path in metadata.items()},
            columns=frozenset(header) - {"file_name"} | {"audio"},
        )
    raise UserError(
        f"{directory} is neither an audiofolder ({' or '.join(FOLDER_METADATA)} with a "
        "file_name column) nor a Common Voice directory (clips/ and .tsv files)."
    )


def _audiofolder_metadata(directory: Path) -> dict[str, Path]:
    for name in FOLDER_METADATA:
        if (directory / name).is_file():
            return {"train": directory / name}
    return {
        sub.name: sub / name
        for sub in sorted(p for p in directory.iterdir() if p.is_dir())
        for name in FOLDER_METADATA
        if (sub / name).is_file()
    }


def transcription(text: str, segments: list[dict] | None = None) -> dict:
    """The task's answer, as the server, `--do_predict` and `python -m trainer.predict` give
    it: the text, and with timestamps asked for, its segments."""
    answer: dict[str, Any] = {"text": text.strip()}
    if segments is not None:
        answer["segments"] = segments
    return answer


class SpeechPredictor(Predictor):
    pipeline_task = "automatic-speech-recognition"
    media_key = "audio"
    raw_media_types = ("audio/",)
    parameter_types = {"language": str, "task": str, "return_timestamps": bool}
    call_kwargs = {"chunk_length_s": CHUNK_SECONDS, "ignore_warning": True}
    reference_columns = ("text", "sentence", "transcription")
    """Training's `--text_column_name` default, Common Voice's and the demo set's columns."""

    @classmethod
    def media_extensions(cls) -> frozenset[str]:
        from datasets.packaged_modules.audiofolder.audiofolder import AudioFolder

        return frozenset(AudioFolder.EXTENSIONS)

    def checked_parameters(self, parameters: object) -> dict[str, Any]:
        """Refused here, with 400, what generate() would refuse inside a batch (a 500 for
        every request sharing it): a task other than transcribe/translate, a language
        Whisper does not know, either one asked of an English-only checkpoint."""
        from transformers.models.whisper.tokenization_whisper import LANGUAGES, TO_LANGUAGE_CODE

        checked = super().checked_parameters(parameters)
        if checked.get("task", "transcribe") not in ("transcribe", "translate"):
            raise InstanceError("parameter 'task' must be 'transcribe' or 'translate'")
        language = checked.get("language", "en").lower().strip("<|>")
        if language not in LANGUAGES and language not in TO_LANGUAGE_CODE:
            raise InstanceError(f"unknown language {checked['language']!r} for Whisper")
        multilingual = getattr(self.pipe.model.generation_config, "is_multilingual", True)
        if not multilingual and {"language", "task"} & set(checked):
            raise InstanceError("this English-only model takes no 'language' or 'task'")
        return checked

    def decoded(self, instance: object) -> dict:
        from transformers.pipelines.audio_utils import ffmpeg_read

        rate = self.pipe.feature_extractor.sampling_rate
        try:
            waveform = ffmpeg_read(self.media(instance), rate)
        except ValueError:
            raise InstanceError("not audio that ffmpeg can decode") from None
        if waveform.size == 0:
            raise InstanceError("the audio holds no samples")
        return {"raw": waveform, "sampling_rate": rate}

    def predict(self, batch: list[Prepared], parameters: dict[str, Any]) -> list[dict]:
        generate = {k: parameters[k] for k in ("language", "task") if k in parameters}
        timestamps = parameters.get("return_timestamps", False)
        outputs = self.pipeline_outputs(
            batch, return_timestamps=timestamps or None, generate_kwargs=generate
        )
        return [
            transcription(output["text"], _segments(output) if timestamps else None)
            for output in outputs
        ]

    def warm_up_input(self) -> dict:
        import numpy as np

        rate = self.pipe.feature_extractor.sampling_rate
        return {"raw": np.zeros(rate, dtype=np.float32), "sampling_rate": rate}

    def score(self, scored: list[tuple[Any, dict]], parameters: dict) -> dict[str, float]:
        """WER as training's evaluation computes it for this checkpoint: Whisper's English
        normaliser where the transcripts are English (the language asked for, else the one
        the model was saved with; an English-only model's always), its basic one otherwise."""
        from trainer.tasks.metrics import eval_normalizer, word_error_rate
        from trainer.tasks.whisper_checkpoint import WhisperCheckpoint, language_name

        pipe = self.pipe
        checkpoint = WhisperCheckpoint.from_dicts(
            "the model", pipe.model.config.to_dict(), pipe.model.generation_config.to_dict(),
            pipe.feature_extractor.to_dict(),
        )  # fmt: skip
        language = parameters.get("language")
        prompt = checkpoint.prompt(language_name(language) if language else None,
                                   parameters.get("task", "transcribe"))  # fmt: skip
        normalize = eval_normalizer(pipe.tokenizer, prompt.english, True)
        references = [str(reference) for reference, _ in scored]
        predictions = [prediction["text"] for _, prediction in scored]
        return {"wer": word_error_rate(references, predictions, normalize)}


def _segments(output: dict) -> list[dict]:
    return [
        {"start": start, "end": end, "text": chunk["text"].strip()}
        for chunk in output.get("chunks", [])
        for start, end in [chunk["timestamp"]]
    ]


SPEECH_RECOGNITION = TaskSpec(
    name="speech-recognition",
    flags=SpeechArguments,
    training="trainer.tasks.speech:SpeechRecognitionTask",
    claims_model=is_whisper,
    detect_layout=detect_local_layout,
    predictor=SpeechPredictor,
    # Whisper's attention projections (encoder, decoder, cross-attention), as in the LoRA
    # paper (Hu et al. 2021, sec. 7.1); transformers 5's names.
    lora_targets={"whisper": ("q_proj", "k_proj", "v_proj", "out_proj")},
    recipes=("demo.yaml", "whisper-small.yaml", "whisper-large-v3-lora.yaml"),
)
