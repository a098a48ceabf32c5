"""The speech recognition task's spec: Whisper models, their flags, the local layouts of
speech datasets, its predictor (serving.py), its training class (training.py) and its demo
(demo.py)."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from trainer.common.errors import UserError
from trainer.common.flag_fields import flag
from trainer.data.sources import FOLDER_METADATA, LocalLayout, check_utf8, table_header
from trainer.tasks.speech_recognition.serving import SpeechPredictor
from trainer.tasks.task_spec import TaskSpec


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


SPEC = TaskSpec(
    name="speech-recognition",
    flags=SpeechArguments,
    training="trainer.tasks.speech_recognition.training:SpeechRecognitionTask",
    claims_model=is_whisper,
    detect_layout=detect_local_layout,
    predictor=SpeechPredictor,
    # Whisper's attention projections (encoder, decoder, cross-attention), as in the LoRA
    # paper (Hu et al. 2021, sec. 7.1); transformers 5's names.
    lora_targets={"whisper": ("q_proj", "k_proj", "v_proj", "out_proj")},
    recipes=("demo.yaml", "whisper-small.yaml", "whisper-large-v3-lora.yaml"),
    demo="trainer.tasks.speech_recognition.demo",
    demo_recipe="demo.yaml",
    demo_folders=("tiny-whisper-v2", "speech-demo-v2"),
)
