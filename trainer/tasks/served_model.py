"""A delivered model, as `python -m trainer.serve` and `python -m trainer.predict` load it: its
location checked, a gs:// copy downloaded, its task read from its config.json, and its task's
predictor built on the task's transformers pipeline. One module for both, so that a test set
scored offline goes through what the endpoint would run."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from trainer.tasks.predictor import Predictor
from trainer.tasks.registry import task_names, task_of_model, task_spec

DEFAULT_MAX_BATCH_SIZE = 8
"""Instances in one forward pass: the server's default, and offline predictions'."""
GENERATION_ENGINES = ("continuous", "generate")
"""How a text generation model generates (docs/serving.md, "Continuous batching"):
transformers' continuous batching, a request joining the running batch at its next step, for
the requests it honours; or every request in `generate()` batches of equal parameters."""


def checked_location(location: str) -> str:
    """The model's location, or ValueError saying what is wrong with it: a gs:// URI naming a
    bucket, or a local folder holding the config.json of a model some task serves (checked
    before the server opens its port)."""
    if location.startswith("gs://"):
        if not location.removeprefix("gs://").split("/", 1)[0]:
            raise ValueError(f"{location} names no bucket")
        return location
    folder = Path(location).expanduser()
    if not (folder / "config.json").is_file():
        raise ValueError(f"{location} is not a model folder (no config.json in it)")
    task_of_model_dir(folder)
    return str(folder)


def model_folder(location: str) -> Path:
    """The model's local folder: a gs:// model is downloaded into a new temporary one first
    (in parallel, every file's CRC32C verified)."""
    if not location.startswith("gs://"):
        return Path(location)
    from trainer.storage.store import open_store

    folder = Path(tempfile.mkdtemp(prefix="model-"))
    open_store(location).download(folder)
    return folder


def task_of_model_dir(model_dir: Path) -> str:
    """The task a delivered model is for, from its config.json (as training infers it)."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        raise FileNotFoundError(f"{model_dir} holds no readable config.json") from None
    task = task_of_model(config) if isinstance(config, dict) else None
    if task is None:
        raise ValueError(
            f"{model_dir}'s config.json is for none of the tasks served here "
            f"({', '.join(task_names())})"
        )
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

    spec = task_spec(task_of_model_dir(model_dir))
    device, dtype = device_and_dtype()
    # As the pipeline's batched calls set it: instances are tokenized on the pre-processing
    # threads already, so the tokenizer's own thread pool would only compete with them.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    pipe = pipeline(spec.predictor.pipeline_task, model=str(model_dir), device=device, dtype=dtype)
    return spec.predictor(pipe, spec.name)


def started_engine(predictor, engine: str, workers: int = 1) -> None:
    """The predictor's own engine started when `engine` asks for it (`--generation_engine`),
    after its warm-up, its share of the device's memory split between `workers`; a line when
    it cannot be."""
    if engine == "continuous":
        said = predictor.start_engine(workers)
        if said:
            print(said, flush=True)
