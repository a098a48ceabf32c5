"""How a delivered text classifier serves (`TextPredictor`: a text or a sentence pair, through the
text-classification pipeline, truncated to the model's length and marked so) and is scored
(accuracy and macro F1, the classification predictor's)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from trainer.tasks.classification_spec import ClassificationPredictor
from trainer.tasks.instance_media import InstanceError
from trainer.tasks.predictor import Prepared


def top_label(labels: list[str], scores: list[float], truncated: bool = False) -> dict:
    """The task's answer (the server's, `--do_predict`'s, `python -m trainer.predict`'s): the
    likeliest label and its score; `truncated` when the text was longer than the model takes
    (its start was scored)."""
    answer: dict[str, Any] = {"label": labels[0], "score": scores[0]}
    if truncated:
        answer["truncated"] = True
    return answer


class TextPredictor(ClassificationPredictor):
    pipeline_task = "text-classification"
    media_key = "text"
    call_kwargs = {"truncation": True}
    raw_media_types = ("text/plain",)

    def __init__(self, pipe, task: str) -> None:
        super().__init__(pipe, task)
        self.tokenizer_lock = threading.Lock()
        """One tokenizer call at a time: a fast tokenizer switches its truncation setting
        in place (on for the model's input, off to measure the whole text), and a switch
        during another thread's call fails it ("Already borrowed")."""

    @classmethod
    def media_extensions(cls) -> frozenset[str]:
        return frozenset({".txt"})

    @classmethod
    def row_instance(cls, row: dict) -> Callable[[], object]:
        """A saved dataset's `text` (and `text_pair` for a pair model)."""
        text = {"text": row["text"], "text_pair": row.get("text_pair")}
        return lambda: {key: value for key, value in text.items() if value is not None}

    def decoded(self, instance: object) -> str | dict:
        instance = self.fields(instance)
        if not isinstance(instance, dict) or not isinstance(instance.get("text"), str):
            raise InstanceError('an instance needs "text" (a string)')
        # Other fields are left alone (a batch job's key beside the instance), but not one
        # that looks like a misspelt text_pair: a pair model would score half the pair.
        misspelt = sorted(key for key in set(instance) - {"text", "text_pair"}
                          if key.startswith("text"))  # fmt: skip
        if misspelt or not isinstance(instance.get("text_pair", ""), str):
            raise InstanceError('an instance holds "text" and, for a pair, "text_pair" strings'
                                + (f" (not {misspelt[0]!r})" if misspelt else ""))  # fmt: skip
        if instance.get("text_pair") is None:
            return instance["text"]
        return {"text": instance["text"], "text_pair": instance["text_pair"]}

    def fields(self, instance: object) -> object:
        """A bare string, a `{"b64": ...}` text or a raw body's bytes as `{"text": ...}`;
        anything else as it is."""
        if isinstance(instance, str):
            return {"text": instance}
        if isinstance(instance, bytes) or (isinstance(instance, dict) and set(instance) == {
                "b64"}):  # fmt: skip
            try:
                return {"text": self.media(instance).decode()}
            except UnicodeDecodeError:
                raise InstanceError("the body is not UTF-8 text" if isinstance(instance, bytes)
                                    else "the b64 text is not UTF-8") from None  # fmt: skip
        return instance

    def prepared(self, pipeline_input: str | dict) -> Prepared:
        text, pair = (pipeline_input["text"], pipeline_input["text_pair"]) if isinstance(
            pipeline_input, dict) else (pipeline_input, None)  # fmt: skip
        with self.tokenizer_lock:
            tokens = self.pipe.tokenizer(text, pair, verbose=False)["input_ids"]
            features = self.features(pipeline_input)
        return Prepared(features, truncated=len(tokens) > self.pipe.tokenizer.model_max_length)

    def predict(self, batch: list[Prepared], parameters: dict[str, Any]) -> list[dict]:
        outputs = self.pipeline_outputs(batch, top_k=1)
        answers = []
        for item, output in zip(batch, outputs, strict=True):
            best = output[0] if isinstance(output, list) else output
            answers.append(top_label([best["label"]], [best["score"]], item.truncated))
        return answers

    def warm_up_input(self) -> str:
        return "warm up"

    def best_label(self, answer: dict) -> str:
        return answer["label"]
