"""How a delivered image classifier serves (`ImagePredictor`: an image decoded by Pillow, through
the image-classification pipeline, the `top_k` likeliest labels) and is scored (accuracy and
macro F1, the classification predictor's)."""

from __future__ import annotations

import io
from typing import Any

from trainer.tasks.classification_spec import ClassificationPredictor
from trainer.tasks.instance_media import InstanceError
from trainer.tasks.predictor import Prepared

IMAGE = "image"
TOP_K = 5
"""How many labels an answer ranks unless the request's `top_k` says otherwise."""


def image_extensions() -> frozenset[str]:
    from datasets.packaged_modules.imagefolder.imagefolder import ImageFolder

    return frozenset(ImageFolder.EXTENSIONS)


def ranked_labels(labels: list[str], scores: list[float]) -> dict:
    """The task's answer (the server's, `--do_predict`'s, `python -m trainer.predict`'s):
    the likeliest labels and their scores, best first."""
    return {"labels": labels, "scores": scores}


class ImagePredictor(ClassificationPredictor):
    pipeline_task = "image-classification"
    media_key = IMAGE
    raw_media_types = ("image/",)
    parameter_types = {"top_k": int}
    labelled_by_folder = True

    @classmethod
    def media_extensions(cls) -> frozenset[str]:
        return image_extensions()

    def decoded(self, instance: object):
        from PIL import Image, UnidentifiedImageError

        try:
            image = Image.open(io.BytesIO(self.media(instance)))
            return image.convert("RGB")
        except (UnidentifiedImageError, OSError):
            raise InstanceError("not an image that Pillow can decode") from None

    def predict(self, batch: list[Prepared], parameters: dict[str, Any]) -> list[dict]:
        outputs = self.pipeline_outputs(batch, top_k=parameters.get("top_k", TOP_K))
        return [
            ranked_labels([o["label"] for o in output], [o["score"] for o in output])
            for output in outputs
        ]

    def warm_up_input(self):
        from PIL import Image

        return Image.new("RGB", (32, 32))

    def best_label(self, answer: dict) -> str:
        return answer["labels"][0]
