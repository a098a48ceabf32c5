"""`Predictor`: the face every task shows to the server (trainer/serve/) and to offline
predictions (trainer/predict/), as `Task` (base.py) is its face to the training program. Each
task's spec names its subclass (trainer/tasks/task_spec.py); nothing outside the task knows
what its instances, parameters or answers look like.

A predictor is built from the model's own files: everything an instance needs before the model
(`prepare`, run in the pre-processing threads: decoding, resampling, validation, then the task
pipeline's own `preprocess`, the feature extraction, tokenization and cutting of long audio
into 30 s chunks) and one forward pass over a batch of prepared instances (`predict`, run on
the model's thread: collating, the forward pass, the pipeline's own post-processing).

The pieces are the transformers pipeline's, put together as `pipe(inputs, batch_size=n)` puts
them (`Pipeline.get_iterator`), only with pre-processing moved off the model's thread: its
`preprocess`, its collation (`pad_collate_fn`), its `forward`, its packing of a long clip's
chunks back into one output (`PipelinePackIterator`) and its `postprocess`. Chunking,
timestamps, language and task, label names, top_k and text pairs are the library's, not
re-written here, and the predictions are those of a plain `pipeline()`.
"""

from __future__ import annotations

import base64
import json
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from trainer.tasks.instance_media import (
    InstanceError,
    failing_instance,
    file_instance,
    media_bytes,
)


@dataclass
class Prepared:
    """An instance ready for the model's thread."""

    model_inputs: list[dict]
    """What the pipeline's `preprocess` made of it: one item of tensors, or for audio one per
    30 s chunk (the last one marked `is_last`)."""
    truncated: bool = False
    """A text longer than the model takes (its start is scored)."""
    parameters: dict | None = None
    """The instance's own parameters, over the request's (a generation instance's
    `max_tokens`, as Model Garden's instances carry them); None: the request's alone."""
    reply: Callable[[Any], dict] | None = None
    """What writes its answer in the format it came in (a chat completion for an OpenAI
    request); None: the task's own answer."""
    streamer: Any = None
    """Where the model hands the text of the instance's answers as they are generated (the
    predictor's `streamer`; one instance alone in its batch); None: the whole answer at the
    end."""


class Predictor(ABC):
    pipeline_task: ClassVar[str]
    """The transformers `pipeline()` task the model is served with."""
    media_key: ClassVar[str]
    """The instance field that holds the task's media (`audio`, `image`, `text`), and the
    column of a saved dataset that `python -m trainer.predict` reads it from."""
    parameter_types: ClassVar[dict[str, type]] = {}
    call_kwargs: ClassVar[dict[str, Any]] = {}
    """The keyword arguments of every pipeline call; the request's parameters add to them."""
    reference_columns: ClassVar[tuple[str, ...]] = ()
    """Where a test set's folder metadata or saved dataset holds the reference an answer is
    scored against, first found first."""
    labelled_by_folder: ClassVar[bool] = False
    """Whether a test folder's media in one folder per class (`DIR/CLASS/x.png`) are
    referenced by that folder's name, as `datasets`' imagefolder labels them."""
    raw_media_types: ClassVar[tuple[str, ...]] = ()
    """The Content-Types (`audio/`: any audio type) of a request body that is the media
    itself, one instance (Vertex AI's rawPredict); the body is then `media(bytes)`."""
    source: str | None = None
    """Where the model was served from (a gs:// URI or a folder), for its description; None:
    the folder it was loaded from."""
    gcs_read_prefixes: tuple[str, ...] | None = None
    """The gs:// prefixes an instance may name (the server sets them: its callers read with
    its credentials); None: any (`python -m trainer.predict`, run by the data's owner)."""
    openai_formats: ClassVar[dict[str, str]] = {}
    """The OpenAI routes the task answers (`chat/completions`, `completions`), each with the
    `@requestFormat` an instance of its body carries; none: those routes answer 404."""

    def streamer(self, on_text: Callable[[int, str], None], choices: int = 1) -> Any:
        """A streamer handing each of an instance's `choices` answers' text to
        `on_text(choice, text)` as it comes (a task that streams); None: the task answers
        whole."""
        return None

    def engine(self) -> Any:
        """What answers some instances itself as they come, off the model's thread (text
        generation's continuous batching, once started: trainer/serve/batching.py's
        `Engine`); None: the batcher's forward passes answer every instance."""
        return None

    def refusal(self, prepared: Prepared, parameters: dict[str, Any]) -> dict | None:
        """`{"error": ...}` when the instance cannot be answered with the request's
        `parameters`, known before any forward pass (text generation: a prompt that cannot
        fit with the new tokens asked for), so that a streamed answer is refused before its
        response starts; None: it can be."""
        return None

    def start_engine(self, workers: int = 1) -> str | None:
        """Starts that engine (the server does, after the warm-up; `workers` sharing the
        device); a line saying why not when the task has one it cannot start for this
        model."""
        return None

    def __init__(self, pipe, task: str) -> None:
        self.pipe = pipe
        self.task = task
        """The `--task` value of the model's task."""
        self.preprocess_params = self.pipeline_parameters()[0]

    @classmethod
    @abstractmethod
    def media_extensions(cls) -> frozenset[str]:
        """The suffixes of the media files `python -m trainer.predict` reads from a folder."""

    @classmethod
    def row_instance(cls, row: dict) -> Callable[[], object]:
        """A saved dataset's row as the serving instance, read when called: its media
        (`media_key`, an undecoded audio or image feature) as `{"b64": ...}`."""
        value = row[cls.media_key] or {}
        if value.get("bytes"):
            encoded = base64.b64encode(value["bytes"]).decode()
            return lambda: {"b64": encoded}
        if value.get("path"):
            return file_instance(Path(value["path"]))
        return failing_instance(f"no {cls.media_key} in this row")

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

    def description(self) -> dict[str, Any]:
        """What the page shows of the served model: where it came from, its architecture,
        its base checkpoint (a merged LoRA model's adapter names it; a full fine-tune's
        folder records none), its labels (a classifier's), and how an instance is sent."""
        folder = Path(self.pipe.model.name_or_path)
        adapter = folder / "adapter" / "adapter_config.json"  # lora_adapters.ADAPTER_DIRNAME
        try:
            base = json.loads(adapter.read_text()).get("base_model_name_or_path")
        except (OSError, ValueError, AttributeError):
            base = None
        architectures = self.pipe.model.config.architectures or [type(self.pipe.model).__name__]
        return {
            "name": self.source or str(folder),
            "architecture": ", ".join(architectures),
            "base_model": base,
            "labels": self.label_names(),
            "media_key": self.media_key,
            "raw_media_types": list(self.raw_media_types),
        }

    def label_names(self) -> list[str] | None:
        """The names of the model's labels, best known; None for a task without labels."""
        return None

    def takes_raw(self, media_type: str) -> bool:
        """Whether a body of this Content-Type (no parameters) is this task's media."""
        return any(media_type == kind or (kind.endswith("/") and media_type.startswith(kind))
                   for kind in self.raw_media_types)  # fmt: skip

    def media(self, instance: object) -> bytes:
        """The instance's media bytes: `{media_key: ...}`, or the media itself (batch
        prediction's file-list sends each file as `{"b64": ...}`; a raw body is its bytes).
        Other fields beside `media_key` (a batch job's key) are left alone."""
        if isinstance(instance, bytes):
            return instance
        if isinstance(instance, dict) and self.media_key in instance:
            return media_bytes(instance[self.media_key], self.gcs_read_prefixes)
        if isinstance(instance, dict) and set(instance) != {"b64"}:
            raise InstanceError(f"an instance needs {self.media_key!r} (or is {{'b64': ...}})")
        return media_bytes(instance, self.gcs_read_prefixes)

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
        merges them. Pre-processing takes none of a request's parameters (for these
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
    def predict(self, batch: list[Prepared], parameters: dict[str, Any]) -> list[dict]:
        """One answer per prepared instance, in the task's answer format."""

    @abstractmethod
    def warm_up_input(self) -> Any:
        """A pipeline input for the warm-up prediction (a second of silence, a black image,
        a word)."""

    def warm_up(self) -> None:
        """One prediction before health says ready, so the first request pays no first-call
        costs (weights paged in, kernels chosen)."""
        self.predict([self.prepared(self.warm_up_input())], {})

    @abstractmethod
    def score(self, scored: list[tuple[Any, dict]], parameters: dict) -> dict[str, float]:
        """The task's metrics of (reference, answer) pairs, computed by the code that scores
        training's evaluation (`python -m trainer.predict`'s test_results.json)."""
