"""What the image task's tests know of `image_assets`' colour set (tests/conftest.py): its
classes, how many of its training images decode, and the flag that lets a run skip its two
undecodable files. Shared by tests/unit/test_image_task.py and
tests/processes/test_image_task_runs.py."""

from tests.support.tiny_assets import COLOURS, IMAGE_SPLITS

CLASSES = sorted(COLOURS)
TRAIN_IMAGES = IMAGE_SPLITS["train"] * len(COLOURS)
ALLOW_FIXTURE_BAD = ("--max_bad_examples", "2")
"""The fixture's two undecodable training files, more than the default (1%) allows."""
