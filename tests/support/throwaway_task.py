"""A fourth task, defined outside the product to show that a task is one module and one
registration (tests/unit/test_task_registry.py): token classification, tagging each word of
a text. It is served and scored for real (a tiny BERT with a token-classification head); its
training side is only what the launcher's flags, checks and LoRA plan read, so it refuses to
train, in one line.

`register(TAGGING)` (trainer/tasks/registry.py) is its one registration: no product file
names it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.common.errors import UserError
from trainer.common.flag_fields import flag
from trainer.data.sources import LocalLayout
from trainer.tasks.base import Task
from trainer.tasks.classification_spec import has_head
from trainer.tasks.instance_media import InstanceError
from trainer.tasks.predictor import Predictor, Prepared
from trainer.tasks.task_spec import TaskSpec

NAME = "token-classification"


@dataclass(frozen=True)
class TaggingArguments:
    tags_column_name: str = flag("tags", "Column with each word's tag, separated by spaces.")


def is_tagger(config: dict) -> bool:
    return has_head(config, "ForTokenClassification")


def detect_tagged_texts(directory: Path) -> LocalLayout:
    """A folder of `SPLIT.conll` files."""
    files = sorted(directory.glob("*.conll"))
    if not files:
        raise UserError(f"{directory} holds no .conll files")
    return LocalLayout(builder="text", splits={path.stem: [path] for path in files},
                       columns=frozenset({"tokens", "tags"}))  # fmt: skip


def tagged(tags: list[str]) -> dict:
    """The task's answer: one tag per word."""
    return {"tags": tags}


class TaggingPredictor(Predictor):
    pipeline_task = "token-classification"
    media_key = "text"
    call_kwargs = {"ignore_labels": []}  # every word gets its tag, "O" too
    reference_columns = ("tags",)

    @classmethod
    def media_extensions(cls) -> frozenset[str]:
        return frozenset({".txt"})

    def decoded(self, instance: object) -> str:
        if isinstance(instance, dict) and set(instance) == {"b64"}:
            return self.media(instance).decode()
        if not isinstance(instance, dict) or not isinstance(instance.get("text"), str):
            raise InstanceError('an instance needs "text" (a string)')
        return instance["text"]

    def predict(self, batch: list[Prepared], parameters: dict[str, Any]) -> list[dict]:
        return [tagged([token["entity"] for token in output])
                for output in self.pipeline_outputs(batch)]  # fmt: skip

    def warm_up_input(self) -> str:
        return "warm up"

    def score(self, scored: list[tuple[Any, dict]], parameters: dict) -> dict[str, float]:
        right = [str(reference).split() == answer["tags"] for reference, answer in scored]
        return {"exact_tags": sum(right) / len(right)}


class TaggingTask(Task):
    """What the launcher reads of a task before training: its flags, metric and model."""

    default_metric = "exact_tags"
    metric_names = ("exact_tags",)

    def model_class(self):
        from transformers import AutoModelForTokenClassification

        return AutoModelForTokenClassification

    def column_flags(self) -> dict[str, str]:
        return {"tags_column_name": self.options.tags_column_name}

    def _not_trained(self, *args, **kwargs):
        raise UserError(f"{NAME} is a test's task: it is served, not trained")

    load_datasets = load_test_split = references = predicted_values = _not_trained
    load_source = build_model_and_processor = data_collator = compute_metrics = _not_trained


TAGGING = TaskSpec(
    name=NAME,
    flags=TaggingArguments,
    training=f"{__name__}:TaggingTask",
    claims_model=is_tagger,
    detect_layout=detect_tagged_texts,
    predictor=TaggingPredictor,
    lora_targets={"bert": ("key",)},
)
TaggingTask.spec = TAGGING
