"""Where the built-in demo's assets live: a run with neither --model_name_or_path nor
--dataset_name trains the tiny Whisper on the synthesized speech set found here, which the
launcher builds (trainer/launcher/demo_assets.py) before it starts training."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainer.config.recipes import RECIPES_DIR

DEMO_RECIPE = RECIPES_DIR / "demo.yaml"

MODEL_DIRNAME = "tiny-whisper-v2"
DATASET_DIRNAME = "speech-demo-v2"
"""Cache folder names, versioned: a cache built by an older release (other sentences,
voices or model shape) is not reused; bump the version whenever the assets change."""


@dataclass(frozen=True)
class DemoAssets:
    """Where `prepare_demo_assets` put the demo's model and data."""

    model_dir: Path  # save_pretrained'd tiny WhisperForConditionalGeneration + WhisperProcessor
    dataset_dir: Path  # an `audiofolder` dataset directory


def demo_assets_in(cache_dir: Path) -> DemoAssets:
    """Where the demo's model and data are (or will be built) under `cache_dir`."""
    return DemoAssets(model_dir=cache_dir / MODEL_DIRNAME, dataset_dir=cache_dir / DATASET_DIRNAME)
