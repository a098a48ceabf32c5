"""How a delivered Whisper serves (`SpeechPredictor`: a clip decoded by ffmpeg at the model's rate,
through the automatic-speech-recognition pipeline in 30 s chunks), and how `python -m
trainer.predict` scores it (WER, as training's evaluation computes it)."""

from __future__ import annotations

from typing import Any

from trainer.tasks.instance_media import InstanceError
from trainer.tasks.predictor import Predictor, Prepared

CHUNK_SECONDS = 30
"""Whisper's window: longer audio is cut into chunks of it, as `pipeline(chunk_length_s=30)`."""


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
        from trainer.tasks.speech_recognition.wer import eval_normalizer, word_error_rate
        from trainer.tasks.speech_recognition.whisper_checkpoint import (
            WhisperCheckpoint,
            language_name,
        )

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
