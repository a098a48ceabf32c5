"""Which task a command line without `--task` means, from what the model and data say.

An example script chooses its task by its file name, so copied command lines carry no
`--task`; planning them as the default task (Whisper) would fail late or train the wrong
thing. The model's `config.json` (local, or in the Hugging Face cache: nothing is
downloaded here) names its type and architectures; a local dataset's files show audio,
image folders or tables. The answer comes with the reason, for the notices of the run.
"""

from __future__ import annotations

import json
from pathlib import Path

from trainer.common.errors import UserError
from trainer.data.sources import looks_like_path
from trainer.tasks import DEFAULT_TASK, load_task

LAYOUT_ORDER = ("speech-recognition", "image-classification", "text-classification")
"""Tasks tried on a local dataset directory, most specific layout first (a Common Voice
directory holds .tsv tables too)."""


def infer_task(model: str | None, dataset: str | None, cache_dir: str | None) -> tuple[str, str]:
    """(task, why): from the model's config.json, else the dataset's files, else the
    default task."""
    config = model_config(model, cache_dir) if model else None
    if config is not None:
        task = task_of_model(config)
        if task is not None:
            kind = config.get("model_type") or ", ".join(config.get("architectures") or [])
            return task, f"{model}'s config.json says {kind}"
    if dataset and looks_like_path(dataset) and Path(dataset).is_dir():
        for name in LAYOUT_ORDER:
            try:
                layout = load_task(name).detect_local_layout(Path(dataset))
            except UserError:
                continue
            return name, f"{dataset} is a local {layout.builder} dataset"
    return DEFAULT_TASK, "the default: neither the model's config.json nor the data say"


def model_config(model: str, cache_dir: str | None) -> dict | None:
    """The model's config.json from a local folder or the Hub cache; None if not here."""
    from huggingface_hub import try_to_load_from_cache

    path = Path(model).expanduser() / "config.json"
    if not path.is_file():
        if looks_like_path(model) or model.count("/") > 1:
            return None
        try:
            cached = try_to_load_from_cache(model, "config.json", cache_dir=cache_dir)
        except ValueError:  # not a valid Hub id: the Hub check says so in one line
            return None
        if not isinstance(cached, str):
            return None
        path = Path(cached)
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def task_of_model(config: dict) -> str | None:
    """Whisper is speech recognition; a type transformers can classify images (sequences) with is
    image (text) classification; the architectures decide a type that can do both."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES as IMAGE,
    )
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES as TEXT,
    )

    model_type = config.get("model_type")
    architectures = " ".join(config.get("architectures") or [])
    if model_type == "whisper" or "Whisper" in architectures:
        return "speech-recognition"
    if "ImageClassification" in architectures or (model_type in IMAGE and model_type not in TEXT):
        return "image-classification"
    if "SequenceClassification" in architectures or model_type in TEXT:
        return "text-classification"
    if model_type in IMAGE:
        return "image-classification"
    return None
