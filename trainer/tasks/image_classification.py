"""The image classification task's spec: ViT and other image classifiers, their flags, the
imagefolder layout, and how a delivered classifier serves and is scored (the training code:
trainer/tasks/image.py)."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.common.errors import UserError
from trainer.common.flag_fields import flag
from trainer.data.sources import LocalLayout
from trainer.tasks.classification_spec import (
    LABEL,
    ClassificationArguments,
    ClassificationPredictor,
    is_image_classifier,
)
from trainer.tasks.instance_media import InstanceError
from trainer.tasks.predictor import Prepared
from trainer.tasks.task_spec import TaskSpec

IMAGE = "image"
TOP_K = 5
"""How many labels an answer ranks unless the request's `top_k` says otherwise."""


@dataclass(frozen=True)
class ImageArguments(ClassificationArguments):
    image_column_name: str = flag("image", "Column with the image.")
    augment: bool = flag(False, "Random resized crop and horizontal flip of training images.")


def image_extensions() -> frozenset[str]:
    from datasets.packaged_modules.imagefolder.imagefolder import ImageFolder

    return frozenset(ImageFolder.EXTENSIONS)


def _subfolders(directory: Path) -> list[Path]:
    return sorted(path for path in directory.iterdir() if path.is_dir())


def _class_folders(directory: Path, extensions: frozenset[str]) -> list[Path]:
    """Sub-folders of `directory` that directly hold at least one image file."""
    return [
        folder
        for folder in _subfolders(directory)
        if any(path.suffix.lower() in extensions for path in folder.iterdir() if path.is_file())
    ]


def detect_local_layout(directory: Path) -> LocalLayout:
    """An imagefolder: one folder per class, or one folder per split holding those."""
    extensions = image_extensions()
    if _class_folders(directory, extensions):
        splits = {"train": [directory]}
    else:
        splits = {
            folder.name: [folder]
            for folder in _subfolders(directory)
            if _class_folders(folder, extensions)
        }
    if not splits:
        raise UserError(
            f"{directory} is not an imagefolder: put one folder per class in it "
            "(DIR/CLASS/*.jpg), or one folder per split holding those (DIR/train/CLASS/*.jpg)."
        )
    return LocalLayout(builder="imagefolder", splits=splits, columns=frozenset({IMAGE, LABEL}))


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


IMAGE_CLASSIFICATION = TaskSpec(
    name="image-classification",
    flags=ImageArguments,
    training="trainer.tasks.image:ImageClassificationTask",
    claims_model=is_image_classifier,
    detect_layout=detect_local_layout,
    predictor=ImagePredictor,
    # query and value projections, as in the LoRA paper (Hu et al. 2021, sec. 7.1); ViT's are
    # q_proj/v_proj in transformers 5
    lora_targets={"vit": ("q_proj", "v_proj")},
    default_model="google/vit-base-patch16-224-in21k",  # run_image_classification.py's
    recipes=("vit-beans.yaml",),
)
