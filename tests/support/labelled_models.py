"""Classification models as the project delivers them, for the serving, prediction and
registration tests: a tiny encoder with a labelled head, saved with its preprocessor; and
the coloured squares the image model is asked about."""

from __future__ import annotations

import io
from pathlib import Path

from PIL import Image

COLOURS = {"red": (220, 20, 20), "green": (20, 200, 20), "blue": (20, 20, 220)}
"""The image model's labels, and the colour of each."""


def with_labelled_head(base: Path, folder: Path, model_class, preprocessor_class, labels):
    """`base` (a tiny encoder) with a classification head naming `labels`, saved with its
    preprocessor in `folder`: what the project delivers for a classification task."""
    id2label = dict(enumerate(labels))
    model = model_class.from_pretrained(
        base, id2label=id2label, label2id={v: k for k, v in id2label.items()}
    )
    model.save_pretrained(folder)
    preprocessor_class.from_pretrained(base).save_pretrained(folder)
    return folder


def png(colour: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (40, 40), colour).save(out, format="PNG")
    return out.getvalue()
