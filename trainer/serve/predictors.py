"""One predictor per task, built from the model's own files: what an instance must hold
(`prepare`, run in the pre-processing threads: decoding, resampling, validation) and one
forward pass over a batch of prepared instances (`predict`, run on the model's thread).

The forward pass is the transformers pipeline of the task, called once per batch with the
whole batch (`batch_size=len(batch)`): its chunking of long audio (`chunk_length_s=30`),
timestamps and label names are the library's, not re-written here.
"""

from __future__ import annotations

import io
import json
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from trainer.serve.media import InstanceError, media_bytes

CHUNK_SECONDS = 30
"""Whisper's window: longer audio is cut into chunks of it, as `pipeline(chunk_length_s=30)`."""


class Predictor(ABC):
    task: str
    media_key: str
    """The instance field that holds the task's media (`audio`, `image`, `text`)."""
    parameter_types: dict[str, type] = {}

    def __init__(self, pipe) -> None:
        self.pipe = pipe

    def checked_parameters(self, parameters: object) -> dict[str, Any]:
        """The request's `parameters`, or InstanceError naming what this task does not take."""
        if parameters is None:
            return {}
        if not isinstance(parameters, dict):
            raise InstanceError("parameters must be an object")
        for name, value in parameters.items():
            wanted = self.parameter_types.get(name)
            if wanted is None:
                known = ", ".join(self.parameter_types) or "none"
                raise InstanceError(f"unknown parameter {name!r} for {self.task} (known: {known})")
            if not isinstance(value, wanted) or (wanted is int and isinstance(value, bool)):
                raise InstanceError(f"parameter {name!r} must be {wanted.__name__}")
        return parameters

    def media(self, instance: object) -> bytes:
        """The instance's media bytes: `{media_key: ...}`, or the media itself (batch
        prediction's file-list sends each file as `{"b64": ...}`)."""
        if isinstance(instance, dict) and self.media_key in instance:
            return media_bytes(instance[self.media_key])
        if isinstance(instance, dict) and set(instance) != {"b64"}:
            raise InstanceError(f"an instance needs {self.media_key!r} (or is {{'b64': ...}})")
        return media_bytes(instance)

    @abstractmethod
    def prepare(self, instance: object) -> Any: ...

    @abstractmethod
    def predict(self, batch: list[Any], parameters: dict[str, Any]) -> list[dict]: ...


class SpeechPredictor(Predictor):
    task = "speech-recognition"
    media_key = "audio"
    parameter_types = {"language": str, "task": str, "return_timestamps": bool}

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

    def prepare(self, instance: object) -> dict:
        from transformers.pipelines.audio_utils import ffmpeg_read

        rate = self.pipe.feature_extractor.sampling_rate
        try:
            waveform = ffmpeg_read(self.media(instance), rate)
        except ValueError:
            raise InstanceError("not audio that ffmpeg can decode") from None
        if waveform.size == 0:
            raise InstanceError("the audio holds no samples")
        return {"raw": waveform, "sampling_rate": rate}

    def predict(self, batch: list[dict], parameters: dict[str, Any]) -> list[dict]:
        generate = {k: parameters[k] for k in ("language", "task") if k in parameters}
        timestamps = parameters.get("return_timestamps", False)
        outputs = self.pipe(
            batch, batch_size=len(batch), chunk_length_s=CHUNK_SECONDS,
            return_timestamps=timestamps or None, generate_kwargs=generate, ignore_warning=True,
        )  # fmt: skip
        predictions = []
        for output in outputs:
            prediction = {"text": output["text"].strip()}
            if timestamps:
                prediction["segments"] = [
                    {
                        "start": chunk["timestamp"][0],
                        "end": chunk["timestamp"][1],
                        "text": chunk["text"].strip(),
                    }  # fmt: skip
                    for chunk in output.get("chunks", [])
                ]
            predictions.append(prediction)
        return predictions


class ImagePredictor(Predictor):
    task = "image-classification"
    media_key = "image"
    parameter_types = {"top_k": int}

    def prepare(self, instance: object):
        from PIL import Image, UnidentifiedImageError

        try:
            image = Image.open(io.BytesIO(self.media(instance)))
            return image.convert("RGB")
        except (UnidentifiedImageError, OSError):
            raise InstanceError("not an image that Pillow can decode") from None

    def predict(self, batch: list, parameters: dict[str, Any]) -> list[dict]:
        top_k = parameters.get("top_k", 5)
        outputs = self.pipe(batch, batch_size=len(batch), top_k=top_k)
        return [
            {"labels": [o["label"] for o in output], "scores": [o["score"] for o in output]}
            for output in outputs
        ]


class TextPredictor(Predictor):
    task = "text-classification"
    media_key = "text"

    def prepare(self, instance: object) -> dict:
        if isinstance(instance, str):
            instance = {"text": instance}
        elif isinstance(instance, dict) and set(instance) == {"b64"}:
            try:
                instance = {"text": self.media(instance).decode()}
            except UnicodeDecodeError:
                raise InstanceError("the b64 text is not UTF-8") from None
        if not isinstance(instance, dict) or not isinstance(instance.get("text"), str):
            raise InstanceError('an instance needs "text" (a string)')
        extra = set(instance) - {"text", "text_pair"}
        if extra or not isinstance(instance.get("text_pair", ""), str):
            raise InstanceError('an instance holds "text" and, for a pair, "text_pair" strings')
        pair = instance.get("text_pair")
        tokens = self.pipe.tokenizer(instance["text"], pair, verbose=False)["input_ids"]
        limit = self.pipe.tokenizer.model_max_length
        return {"text": instance["text"], "text_pair": pair, "truncated": len(tokens) > limit}

    def predict(self, batch: list[dict], parameters: dict[str, Any]) -> list[dict]:
        inputs = [
            {"text": item["text"], "text_pair": item["text_pair"]}
            if item["text_pair"] is not None
            else item["text"]
            for item in batch
        ]
        outputs = self.pipe(inputs, batch_size=len(batch), truncation=True, top_k=1)
        predictions = []
        for item, output in zip(batch, outputs, strict=True):
            best = output[0] if isinstance(output, list) else output
            prediction = {"label": best["label"], "score": best["score"]}
            if item["truncated"]:
                prediction["truncated"] = True  # longer than the model takes: its start scored
            predictions.append(prediction)
        return predictions


PREDICTORS = {p.task: p for p in (SpeechPredictor, ImagePredictor, TextPredictor)}
PIPELINE_TASKS = {
    "speech-recognition": "automatic-speech-recognition",
    "image-classification": "image-classification",
    "text-classification": "text-classification",
}


def task_of_model_dir(model_dir: Path) -> str:
    """The task a delivered model is for, from its config.json (as training infers it)."""
    from trainer.config.task_inference import task_of_model

    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        raise FileNotFoundError(f"{model_dir} holds no readable config.json") from None
    task = task_of_model(config) if isinstance(config, dict) else None
    if task is None:
        raise ValueError(f"{model_dir}'s config.json names no task this server serves")
    return task


def load_predictor(model_dir: Path) -> Predictor:
    """The model's predictor, on the GPU in bf16 (fp16 where bf16 is missing) if there is one."""
    import torch
    from transformers import pipeline

    task = task_of_model_dir(model_dir)
    device, dtype = "cpu", torch.float32
    if torch.cuda.is_available():
        device = "cuda"
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    pipe = pipeline(PIPELINE_TASKS[task], model=str(model_dir), device=device, dtype=dtype)
    return PREDICTORS[task](pipe)


def warm_up(predictor: Predictor) -> None:
    """One prediction before health says ready, so the first request pays no first-call
    costs (weights paged in, kernels chosen): a second of silence, a black image, a word."""
    import numpy as np
    from PIL import Image

    if isinstance(predictor, SpeechPredictor):
        rate = predictor.pipe.feature_extractor.sampling_rate
        item = {"raw": np.zeros(rate, dtype=np.float32), "sampling_rate": rate}
    elif isinstance(predictor, ImagePredictor):
        item = Image.new("RGB", (32, 32))
    else:
        item = {"text": "warm up", "text_pair": None, "truncated": False}
    predictor.predict([item], {})
