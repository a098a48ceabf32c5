"""Word error rate, as training's evaluation and `python -m trainer.predict`'s scoring of a test
set both compute it, so that both score alike. Light to import: the server's predictor scores
with it too."""

from __future__ import annotations

from collections.abc import Callable


def eval_normalizer(tokenizer, english: bool, normalize: bool) -> Callable[[str], str]:
    """How transcripts are normalised before WER (`--do_normalize_eval`): Whisper's English
    normaliser for English transcripts, its basic one otherwise."""
    if not normalize:
        return _identity
    return tokenizer.normalize if english else tokenizer.basic_normalize


def word_error_rate(
    references: list[str], predictions: list[str], normalize: Callable[[str], str]
) -> float:
    """WER in percent over the pairs whose normalised reference has words (NaN when none
    has): the evaluation's metric, and python -m trainer.predict's over a test set."""
    import jiwer

    pairs = [
        (normalize(ref), normalize(pred)) for ref, pred in zip(references, predictions, strict=True)
    ]
    pairs = [(ref, pred) for ref, pred in pairs if ref.strip()]
    if not pairs:
        return float("nan")
    refs, preds = zip(*pairs, strict=True)
    return 100.0 * jiwer.wer(list(refs), list(preds))


def _identity(text: str) -> str:
    return text
