"""One predictor per task, built from the model's own files: everything an instance needs
before the model (`prepare`, run in the pre-processing threads: decoding, resampling,
validation, then the task pipeline's own `preprocess`, the feature extraction, tokenization
and cutting of long audio into 30 s chunks) and one forward pass over a batch of prepared
instances (`predict`, run on the model's thread: collating, the forward pass, the
pipeline's own post-processing).

The pieces are the transformers pipeline's, put together as `pipe(inputs, batch_size=n)`
puts them (`Pipeline.get_iterator`), only with pre-processing moved off the model's thread:
its `preprocess`, its collation (`pad_collate_fn`), its `forward`, its packing of a long
clip's chunks back into one output (`PipelinePackIterator`) and its `postprocess`. Chunking
(`chunk_length_s=30`), timestamps, language and task, label names, top_k and text pairs are
the library's, not re-written here, and the predictions are those of a plain `pipeline()`.
"""

from __future__ import annotations

import io
import json
import os
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.serve.media import InstanceError, media_bytes

CHUNK_SECONDS = 30
"""Whisper's window: longer audio is cut into chunks of it, as `pipeline(chunk_length_s=30)`."""


@dataclass
class Prepared:
    """An instance ready for the model's thread."""

    model_inputs: list[dict]
    """What the pipeline's `preprocess` made of it: one item of tensors, or for audio one per
    30 s chunk (the last one marked `is_last`)."""
    truncated: bool = False
    """A text longer than the model takes (its start is scored)."""


class Predictor(ABC):
    task: str
    media_key: str
    """The instance field that holds the task's media (`audio`, `image`, `text`)."""
    parameter_types: dict[str, type] = {}
    call_kwargs: dict[str, Any] = {}
    """The keyword arguments of every pipeline call; the request's parameters add to them."""

    def __init__(self, pipe) -> None:
        self.pipe = pipe
        self.preprocess_params = self.pipeline_parameters()[0]

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

    def prepare(self, instance: object) -> Prepared:
        """The instance decoded and pre-processed, off the model's thread."""
        return self.prepared(self.decoded(instance))

    @abstractmethod
    def decoded(self, instance: object) -> Any:
        """What the task's pipeline takes as one input (a waveform, an image, a text), or
        InstanceError saying why the instance is not one."""

    def prepared(self, pipeline_input: Any) -> Prepared:
        return Prepared(self.features(pipeline_input))

    def features(self, pipeline_input: Any) -> list[dict]:
        """The pipeline's own `preprocess` of one input, with the arguments `pipe()` gives
        it: one item, or for a chunking pipeline (speech) every chunk it yields."""
        from transformers.pipelines.base import ChunkPipeline

        processed = self.pipe.preprocess(pipeline_input, **self.preprocess_params)
        return list(processed) if isinstance(self.pipe, ChunkPipeline) else [processed]

    def pipeline_parameters(self, **kwargs: Any) -> tuple[dict, dict, dict]:
        """What `pipe(inputs, **call_kwargs, **kwargs)` hands its pre-processing, forward
        pass and post-processing: the pipeline's own routing of its arguments
        (`_sanitize_parameters`) over the ones it was built with, as `Pipeline.__call__`
        merges them. Pre-processing takes none of a request's parameters (for these three
        pipelines it takes the chunk length, the truncation, a download timeout), so an
        instance is prepared before its batch is known."""
        pipe = self.pipe
        pre, forward, post = pipe._sanitize_parameters(**self.call_kwargs, **kwargs)
        return ({**pipe._preprocess_params, **pre}, {**pipe._forward_params, **forward},
                {**pipe._postprocess_params, **post})  # fmt: skip

    def pipeline_outputs(self, batch: list[Prepared], **kwargs: Any) -> list:
        """The pipeline's outputs for the batch, one per instance, as `pipe(inputs,
        batch_size=len(batch), **kwargs)` computes them after its pre-processing
        (`Pipeline.get_iterator`, `ChunkPipeline.get_iterator`): the items collated
        `len(batch)` at a time (a long clip's chunks count one each), one `forward` per
        group, a clip's chunks packed back together, `postprocess` per instance."""
        from transformers.pipelines.base import ChunkPipeline, no_collate_fn, pad_collate_fn
        from transformers.pipelines.pt_utils import PipelineIterator, PipelinePackIterator

        pipe, size = self.pipe, len(batch)
        _, forward_params, postprocess_params = self.pipeline_parameters(**kwargs)
        items = [item for prepared in batch for item in prepared.model_inputs]
        extractor = pipe.feature_extractor if pipe.feature_extractor is not None else (
            pipe.image_processor)  # fmt: skip
        collate = no_collate_fn if size == 1 else pad_collate_fn(pipe.tokenizer, extractor)
        groups = [collate(items[start : start + size]) for start in range(0, len(items), size)]
        packing = PipelinePackIterator if isinstance(pipe, ChunkPipeline) else PipelineIterator
        forwarded = packing(groups, pipe.forward, forward_params, loader_batch_size=size)
        return list(PipelineIterator(forwarded, pipe.postprocess, postprocess_params))

    @abstractmethod
    def predict(self, batch: list[Prepared], parameters: dict[str, Any]) -> list[dict]: ...


class SpeechPredictor(Predictor):
    task = "speech-recognition"
    media_key = "audio"
    parameter_types = {"language": str, "task": str, "return_timestamps": bool}
    call_kwargs = {"chunk_length_s": CHUNK_SECONDS, "ignore_warning": True}

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

    def decoded(self, instance: object):
        from PIL import Image, UnidentifiedImageError

        try:
            image = Image.open(io.BytesIO(self.media(instance)))
            return image.convert("RGB")
        except (UnidentifiedImageError, OSError):
            raise InstanceError("not an image that Pillow can decode") from None

    def predict(self, batch: list[Prepared], parameters: dict[str, Any]) -> list[dict]:
        outputs = self.pipeline_outputs(batch, top_k=parameters.get("top_k", 5))
        return [
            {"labels": [o["label"] for o in output], "scores": [o["score"] for o in output]}
            for output in outputs
        ]


class TextPredictor(Predictor):
    task = "text-classification"
    media_key = "text"
    call_kwargs = {"truncation": True}

    def __init__(self, pipe) -> None:
        super().__init__(pipe)
        self.tokenizer_lock = threading.Lock()
        """One tokenizer call at a time: a fast tokenizer switches its truncation setting
        in place (on for the model's input, off to measure the whole text), and a switch
        during another thread's call fails it ("Already borrowed")."""

    def decoded(self, instance: object) -> str | dict:
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
        if instance.get("text_pair") is None:
            return instance["text"]
        return {"text": instance["text"], "text_pair": instance["text_pair"]}

    def prepared(self, pipeline_input: str | dict) -> Prepared:
        text, pair = (pipeline_input["text"], pipeline_input["text_pair"]) if isinstance(
            pipeline_input, dict) else (pipeline_input, None)  # fmt: skip
        with self.tokenizer_lock:
            tokens = self.pipe.tokenizer(text, pair, verbose=False)["input_ids"]
            features = self.features(pipeline_input)
        return Prepared(features, truncated=len(tokens) > self.pipe.tokenizer.model_max_length)

    def predict(self, batch: list[Prepared], parameters: dict[str, Any]) -> list[dict]:
        outputs = self.pipeline_outputs(batch, top_k=1)
        predictions = []
        for item, output in zip(batch, outputs, strict=True):
            best = output[0] if isinstance(output, list) else output
            prediction = {"label": best["label"], "score": best["score"]}
            if item.truncated:
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
    from trainer.tasks.model_tasks import task_of_model

    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        raise FileNotFoundError(f"{model_dir} holds no readable config.json") from None
    task = task_of_model(config) if isinstance(config, dict) else None
    if task is None:
        raise ValueError(f"{model_dir}'s config.json names no task this server serves")
    return task


def device_and_dtype() -> tuple[str, Any]:
    """Where a model serves: the GPU in bf16 (fp16 where bf16 is missing) if there is one,
    else the CPU in fp32."""
    import torch

    if torch.cuda.is_available():
        return "cuda", torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return "cpu", torch.float32


def load_predictor(model_dir: Path) -> Predictor:
    """The model's predictor, where `device_and_dtype` says."""
    from transformers import pipeline

    task = task_of_model_dir(model_dir)
    device, dtype = device_and_dtype()
    # As the pipeline's batched calls set it: instances are tokenized on the pre-processing
    # threads already, so the tokenizer's own thread pool would only compete with them.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
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
        item = "warm up"
    predictor.predict([predictor.prepared(item)], {})
