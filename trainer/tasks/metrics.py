"""The classification tasks' label metrics, shared by training's evaluation and `python -m
trainer.predict`'s scoring of a test set, so that both score alike. Light to import: the
server's predictors score with them too."""

from __future__ import annotations

import numpy as np


def label_metrics(predicted: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Accuracy and macro F1 of predicted label ids against the true ones: the evaluation's
    metrics, and python -m trainer.predict's over a test set (from label names)."""
    size = int(max(labels.max(), predicted.max())) + 1
    hits = np.bincount(labels[predicted == labels], minlength=size)
    # F1 = 2 TP / (2 TP + FP + FN), and 2 TP + FP + FN = (times predicted) + (times true)
    occurrences = np.bincount(predicted, minlength=size) + np.bincount(labels, minlength=size)
    present = occurrences > 0
    f1 = 2 * hits[present] / occurrences[present]
    return {"accuracy": float(np.mean(predicted == labels)), "macro_f1": float(np.mean(f1))}


def named_label_metrics(references: list[str], predicted: list[str]) -> dict[str, float]:
    """`label_metrics` of label names: each name numbered as it first occurs."""
    numbers: dict[str, int] = {}
    ids = [[numbers.setdefault(name, len(numbers)) for name in names]
           for names in (references, predicted)]  # fmt: skip
    return label_metrics(np.array(ids[1]), np.array(ids[0]))
