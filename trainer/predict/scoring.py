"""test_results.json: the task's metrics over the predicted examples that have a reference,
computed by the code that scores training's evaluation (trainer/tasks/): WER in percent,
normalised as `--do_normalize_eval` normalises it by default, for speech; accuracy and macro
F1 for classification. Keys carry the `test_` prefix the Trainer gives a test set's metrics.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trainer.serve.predictors import Predictor

PREDICTED_LABEL = {
    "image-classification": lambda prediction: prediction["labels"][0],
    "text-classification": lambda prediction: prediction["label"],
}
"""A classification prediction's best label name."""


def metrics_of(
    predictor: Predictor, scored: list[tuple[Any, dict]], parameters: dict
) -> dict[str, float]:
    """The metrics of `scored` (reference, prediction) pairs, and how many there were."""
    if predictor.task == "speech-recognition":
        metrics = speech_metrics(predictor, scored, parameters)
    else:
        metrics = label_metrics_of(predictor, scored)
    return {f"test_{name}": value for name, value in metrics.items()} | {
        "test_samples": len(scored)
    }


def speech_metrics(
    predictor: Predictor, scored: list[tuple[Any, dict]], parameters: dict
) -> dict[str, float]:
    """WER as training's evaluation computes it for this checkpoint: Whisper's English
    normaliser where the transcripts are English (the language asked for, else the one the
    model was saved with; an English-only model's always), its basic one otherwise."""
    from trainer.tasks.speech import eval_normalizer, word_error_rate
    from trainer.tasks.whisper_checkpoint import WhisperCheckpoint, language_name

    pipe = predictor.pipe
    checkpoint = WhisperCheckpoint.from_dicts(
        "the model", pipe.model.config.to_dict(), pipe.model.generation_config.to_dict(),
        pipe.feature_extractor.to_dict(),
    )  # fmt: skip
    language = parameters.get("language")
    prompt = checkpoint.prompt(language_name(language) if language else None,
                               parameters.get("task", "transcribe"))  # fmt: skip
    normalize = eval_normalizer(pipe.tokenizer, prompt.english, True)
    references = [str(reference) for reference, _ in scored]
    predictions = [prediction["text"] for _, prediction in scored]
    return {"wer": word_error_rate(references, predictions, normalize)}


def label_metrics_of(predictor: Predictor, scored: list[tuple[Any, dict]]) -> dict[str, float]:
    """Accuracy and macro F1 of the best label against the reference's label name (a
    reference given as a label id is named by the model's id2label)."""
    from trainer.tasks.classification import label_metrics

    id2label = predictor.pipe.model.config.id2label
    numbers: dict[str, int] = {}

    def number(name: str) -> int:
        return numbers.setdefault(name, len(numbers))

    references, predicted = [], []
    for reference, prediction in scored:
        is_id = isinstance(reference, int) and not isinstance(reference, bool)
        references.append(number(id2label.get(reference, str(reference)) if is_id
                                 else str(reference)))  # fmt: skip
        predicted.append(number(PREDICTED_LABEL[predictor.task](prediction)))
    return label_metrics(np.array(predicted), np.array(references))
