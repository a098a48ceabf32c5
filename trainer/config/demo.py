"""Where the built-in demo's assets live: a run with neither --model_name_or_path nor
--dataset_name trains the tiny Whisper on the synthesized speech set found here, which the
launcher builds (trainer/node/demo_assets.py) before it starts training."""

from __future__ import annotations

from pathlib import Path

from trainer.command_line.recipes import RECIPES_DIR
from trainer.settings.run_config import DemoAssets

DEMO_RECIPE = RECIPES_DIR / "demo.yaml"

MODEL_DIRNAME = "tiny-whisper-v2"
DATASET_DIRNAME = "speech-demo-v2"
"""Cache folder names, versioned: a cache built by an older release (other sentences,
voices or model shape) is not reused; bump the version whenever the assets change."""


def demo_assets_in(cache_dir: Path) -> DemoAssets:
    """Where the demo's model and data are (or will be built) under `cache_dir`."""
    return DemoAssets(model_dir=cache_dir / MODEL_DIRNAME, dataset_dir=cache_dir / DATASET_DIRNAME)
