"""Which task a model is for, from its config.json: what training infers a command line's task
from (trainer/config/task_inference.py), what the server serves a delivered model as
(trainer/serve/predictors.py) and what the registry labels it with (trainer/registry/). Here,
below all three, so that the training ranks may register a model without importing the
resolution layer."""

from __future__ import annotations


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
