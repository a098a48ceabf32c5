"""Image classification (ViT or any `AutoModelForImageClassification`), scored by accuracy.

Images are decoded when an example is read, and the model's image processor (resize, rescale,
normalise) runs batched in the collator: no pass over the corpus writes pixel arrays before
training. With `--augment`, training images first get a random resized crop and a horizontal
flip, as in the Hugging Face image-classification example.

Data sources (`--dataset_name`): a hub dataset with an image and a label column, or a local
`imagefolder` directory, with one folder per class (`DIR/CLASS/*.jpg`, all the `train` split)
or one folder per split holding them (`DIR/train/CLASS/*.jpg`, `DIR/test/CLASS/...`; the split
names are the folder names). The label names are the class folder names.

Images that cannot be decoded (not an image, truncated, unknown format) are skipped and
counted, with one line naming the first: one bad file in a scraped set of thousands should not
stop a job, and a split where nothing decodes is an error. The check is a pass over the split
before training, cached by `datasets` on each machine; a streamed training split is checked as
it is read, each image decoded whole in the loader, once (trainer/data/bad_examples.py).
"""

from __future__ import annotations

import io
import math
import random
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from trainer.common.errors import UserError
from trainer.data.bad_examples import mark_undecodable, screen
from trainer.data.streams import is_stream
from trainer.tasks.base import LENGTH_SAMPLING_STRATEGIES
from trainer.tasks.classification import ClassificationTask, LabelSet
from trainer.tasks.image_classification.serving import IMAGE, TOP_K, ranked_labels
from trainer.tasks.image_classification.spec import SPEC, ImageArguments

if TYPE_CHECKING:
    from datasets import Dataset
    from PIL.Image import Image as PILImage


class ImageClassificationTask(ClassificationTask):
    spec = SPEC
    input_column = IMAGE
    input_flag = "image_column_name"
    predicted_top_k = TOP_K
    prediction_value = staticmethod(ranked_labels)
    options: ImageArguments

    @classmethod
    def check_training_values(cls, training: Mapping[str, Any]) -> None:
        """Every image is resized to the model's one input size, so examples have no length
        to group by; the Trainer would look for a `pixel_values` column raw rows lack."""
        strategy = training["train_sampling_strategy"]
        if strategy in LENGTH_SAMPLING_STRATEGIES:
            spelling = " (--group_by_length)" if strategy == "group_by_length" else ""
            raise UserError(
                f"--train_sampling_strategy {strategy}{spelling} groups examples by length, "
                "and every image is resized to the model's one input size: leave it out."
            )

    def model_class(self):
        from transformers import AutoModelForImageClassification

        return AutoModelForImageClassification

    def sequence_length(self, config) -> int:
        return (config.image_size // config.patch_size) ** 2 + 1  # patches and [CLS]

    def load_model_and_processor(self, labels: LabelSet, quantized: bool = True):
        from transformers import AutoImageProcessor

        path = self.model_args.model_name_or_path
        model = self.model_class().from_pretrained(
            path, **self.pretrained_kwargs(labels, quantized)
        )
        processor = AutoImageProcessor.from_pretrained(path, cache_dir=self.model_args.cache_dir)
        return model, processor

    def prepare_split(self, dataset: Dataset, spec: str) -> Dataset:
        dataset = super().prepare_split(dataset, spec)
        where = f"split {spec} of {self.data_args.dataset_name}"
        training = spec == self.data_args.train_split_name
        return drop_undecodable(dataset, where, self.data_args, training)

    def for_training(self, dataset: Dataset) -> Dataset:
        if is_stream(dataset):
            dataset = mark_undecodable(dataset, IMAGE, _loaded)
            if self.options.augment:
                return dataset.map(augment_images, batched=True)  # as it is read, like decoding
            return dataset
        if not self.options.augment:
            return dataset
        return dataset.with_transform(augment_images)

    def input_encoder(self, processor) -> Callable[[list], Any]:
        return partial(_pixel_values, processor)


def _pixel_values(processor, images: list[PILImage]) -> dict:
    rgb = [image if image.mode == "RGB" else image.convert("RGB") for image in images]
    return {"pixel_values": processor(images=rgb, return_tensors="pt")["pixel_values"]}


def drop_undecodable(dataset: Dataset, where: str, data_args, training: bool) -> Dataset:
    """The examples whose image decodes; the others are skipped and counted, up to
    `--max_bad_examples` (trainer/data/bad_examples.py)."""
    from datasets import Image

    encoded = dataset.cast_column(IMAGE, Image(decode=False))
    decodable, _ = screen(
        encoded, IMAGE, _decodes, where, data_args.max_bad_examples,
        data_args.preprocessing_num_workers, "images", training,
    )  # fmt: skip
    return decodable.cast_column(IMAGE, Image())


def _decodes(image: dict) -> bool:
    """Reads the whole image (raising if PIL cannot). JPEGs are decoded at 1/8 scale
    (`draft`), which still reads the whole stream, so truncated files are caught at a
    fraction of the cost."""
    from PIL import Image

    source = io.BytesIO(image["bytes"]) if image.get("bytes") else image["path"]
    with Image.open(source) as opened:
        opened.draft("RGB", (1, 1))
        opened.load()
    return True


def _loaded(image: PILImage) -> PILImage:
    """`image` read whole now (Pillow opens lazily), so that a truncated file fails here."""
    image.load()
    return image


def augment_images(batch: dict) -> dict:
    """Applied on the fly to training examples only (`with_transform`, or a stream's `map`);
    the processor then resizes the crop to the model's input size. A stream's undecodable
    image (None) stays None, to be counted."""
    batch[IMAGE] = [
        None if image is None else _random_flip(_random_resized_crop(image))
        for image in batch[IMAGE]
    ]
    return batch


CROP_AREA = (0.08, 1.0)
CROP_ASPECT = (3 / 4, 4 / 3)
"""torchvision's RandomResizedCrop defaults: share of the area kept, width/height range."""


def _random_resized_crop(image: PILImage) -> PILImage:
    """RandomResizedCrop's sampling, without the resize; after ten misses the whole image
    is kept."""
    width, height = image.size
    for _ in range(10):
        area = width * height * random.uniform(*CROP_AREA)
        aspect = math.exp(random.uniform(*(math.log(bound) for bound in CROP_ASPECT)))
        crop_width = round(math.sqrt(area * aspect))
        crop_height = round(math.sqrt(area / aspect))
        if 0 < crop_width <= width and 0 < crop_height <= height:
            left = random.randint(0, width - crop_width)
            top = random.randint(0, height - crop_height)
            return image.crop((left, top, left + crop_width, top + crop_height))
    return image


def _random_flip(image: PILImage) -> PILImage:
    from PIL import Image

    return image.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if random.random() < 0.5 else image
