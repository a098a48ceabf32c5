"""The image classification task's spec: ViT and other image classifiers, their flags, the
imagefolder layout, its predictor (serving.py) and its training class (training.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainer.common.errors import UserError
from trainer.common.flag_fields import flag
from trainer.data.sources import LocalLayout
from trainer.tasks.classification_spec import LABEL, ClassificationArguments, is_image_classifier
from trainer.tasks.image_classification.serving import IMAGE, ImagePredictor, image_extensions
from trainer.tasks.task_spec import TaskSpec


@dataclass(frozen=True)
class ImageArguments(ClassificationArguments):
    image_column_name: str = flag("image", "Column with the image.")
    augment: bool = flag(False, "Random resized crop and horizontal flip of training images.")


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


SPEC = TaskSpec(
    name="image-classification",
    flags=ImageArguments,
    training="trainer.tasks.image_classification.training:ImageClassificationTask",
    claims_model=is_image_classifier,
    detect_layout=detect_local_layout,
    predictor=ImagePredictor,
    # query and value projections, as in the LoRA paper (Hu et al. 2021, sec. 7.1); ViT's are
    # q_proj/v_proj in transformers 5
    lora_targets={"vit": ("q_proj", "v_proj")},
    default_model="google/vit-base-patch16-224-in21k",  # run_image_classification.py's
    recipes=("vit-beans.yaml",),
)
