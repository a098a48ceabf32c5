"""How a delivered tagger serves: the token-classification pipeline, one tag per word."""

from __future__ import annotations

from typing import Any

from trainer.tasks.instance_media import InstanceError
from trainer.tasks.predictor import Predictor, Prepared


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
