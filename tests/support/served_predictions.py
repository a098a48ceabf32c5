"""What the server's predictor answers, as the offline predictions are compared with it (the
tests of `python -m trainer.predict`, in this process and as its own)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.tasks.served_model import load_predictor


def served(model: Path, instances: list, parameters: dict | None = None) -> list[dict]:
    """What the server's predictor answers for `instances`, one forward pass each."""
    predictor = load_predictor(model)
    return [predictor.predict([predictor.prepare(i)], parameters or {})[0] for i in instances]


def assert_same_predictions(actual: list[dict], expected: list[dict]) -> None:
    """The same labels or text; scores equal but for a batch's padding (a forward pass over
    several texts pads them to one length, which moves a score in its 6th digit)."""
    assert [set(a) for a in actual] == [set(e) for e in expected]
    for got, wanted in zip(actual, expected, strict=True):
        for key, value in wanted.items():
            if key in ("score", "scores"):
                assert got[key] == pytest.approx(value, abs=1e-4)
            else:
                assert got[key] == value
