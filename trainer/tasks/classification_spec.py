"""What the image and text classification specs share: the label flags, which models are
classifiers, and the predictor's scoring by accuracy and macro F1 (the training code they share:
trainer/tasks/classification.py)."""

from __future__ import annotations

import math
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any

from trainer.common.flag_fields import flag
from trainer.tasks.model_config import (
    IMAGE_CLASSIFIERS,
    MASKED_LMS,
    TEXT_CLASSIFIERS,
    architectures,
    has_head,
    model_types,
)
from trainer.tasks.predictor import Predictor

LABEL = "label"
"""The label column's name once loaded, whatever `--label_column_name` called it (and an
imagefolder's)."""

GENERATIVE_HEADS = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")
"""Architecture names of models that generate text: no classification task claims them, though
transformers can put a classification head on most of their types (Llama, Qwen2, GPT-2...)."""
PRETRAINED_HEADS = ("Model", "ForPreTraining", "ForMaskedLM", "ForMaskedImageModeling")
"""Architecture names of a pretrained encoder without a task's head (`BertForMaskedLM`,
`ViTModel`): a classification task puts its head on one. A checkpoint with another task's
head (`BertForTokenClassification`) is that task's, not a classifier's."""


@dataclass(frozen=True)
class ClassificationArguments:
    label_column_name: str = flag(
        "label", "Column with the class: a ClassLabel, or values such as positive."
    )
    class_weights: str | None = flag(
        None,
        "Weight the loss per class: balanced (inverse frequency in the training "
        "split), or one weight per label in label-id order, e.g. 1,2.5,1.",
    )

    def __post_init__(self) -> None:
        if self.class_weights is not None:
            parse_class_weights(self.class_weights)


def parse_class_weights(text: str) -> str | tuple[float, ...]:
    if text.strip() == "balanced":
        return "balanced"
    try:
        weights = tuple(float(part) for part in text.split(","))
    except ValueError:
        weights = ()
    if not weights or not all(weight > 0 and math.isfinite(weight) for weight in weights):
        raise ValueError(
            f'--class_weights "{text}": use balanced, or one positive number per label '
            "separated by commas (e.g. 1,2.5,1)."
        )
    return weights


def is_image_classifier(config: dict) -> bool:
    """An image-classification architecture, or a pretrained encoder of a type transformers
    classifies images with and not texts (ViT saved without a head: `ViTModel`)."""
    if has_head(config, "ForImageClassification"):
        return True
    model_type = config.get("model_type")
    return (
        model_type in model_types(IMAGE_CLASSIFIERS)
        and model_type not in model_types(TEXT_CLASSIFIERS)
        and is_pretrained_encoder(config)
    )


def is_text_classifier(config: dict) -> bool:
    """A sequence-classification architecture, or a pretrained encoder transformers classifies
    texts with (BERT saved as `BertForMaskedLM`); never a model that generates text."""
    if has_head(config, "ForSequenceClassification"):
        return True
    model_type = config.get("model_type")
    if model_type not in model_types(TEXT_CLASSIFIERS) or not is_pretrained_encoder(config):
        return False
    return bool(architectures(config)) or model_type in model_types(MASKED_LMS)


def is_pretrained_encoder(config: dict) -> bool:
    """No head of another task: no architecture named, or only pretrained ones."""
    if has_head(config, *GENERATIVE_HEADS):
        return False
    return all(name.endswith(PRETRAINED_HEADS) for name in architectures(config))


class ClassificationPredictor(Predictor):
    reference_columns = ("label",)
    """Training's `--label_column_name` default."""

    def label_names(self) -> list[str]:
        id2label = self.pipe.model.config.id2label
        return [id2label[index] for index in sorted(id2label)]

    @abstractmethod
    def best_label(self, answer: dict) -> str:
        """The likeliest label's name in one of this task's answers."""

    def score(self, scored: list[tuple[Any, dict]], parameters: dict) -> dict[str, float]:
        """Accuracy and macro F1 of the best label against the reference's label name (a
        reference given as a label id is named by the model's id2label)."""
        from trainer.tasks.metrics import named_label_metrics

        id2label = self.pipe.model.config.id2label
        references = [
            id2label.get(reference, str(reference))
            if isinstance(reference, int) and not isinstance(reference, bool)
            else str(reference)
            for reference, _ in scored
        ]
        return named_label_metrics(references, [self.best_label(answer) for _, answer in scored])
