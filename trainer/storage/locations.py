"""Where checkpoints, the final model and TensorBoard logs go.

Vertex AI derives `AIP_CHECKPOINT_DIR`, `AIP_MODEL_DIR` and `AIP_TENSORBOARD_LOG_DIR` from
the job's `baseOutputDirectory` (hyperparameter trials get their own sub-directory); the
flags below override them, and without either everything stays under `--output_dir`.
Each may be a `gs://` URI, a `/gcs/BUCKET/...` path (stored through the Cloud Storage
client as `gs://BUCKET/...`, see `storage.open_store`) or a local directory.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from trainer.settings.output_flags import OutputArguments
from trainer.settings.run_config import OutputLocations
from trainer.storage.store import open_store


def resolve_output_locations(
    outputs: OutputArguments, env: Mapping[str, str], output_dir: str
) -> OutputLocations:
    checkpoints = outputs.checkpoint_dir or env.get("AIP_CHECKPOINT_DIR")
    return OutputLocations(
        checkpoints=checkpoints or output_dir,
        model=outputs.model_dir or env.get("AIP_MODEL_DIR") or str(Path(output_dir) / "model"),
        tensorboard=outputs.tensorboard_dir or env.get("AIP_TENSORBOARD_LOG_DIR"),
        shared_checkpoints=checkpoints is not None,
    )


def check_output_locations(locations: OutputLocations) -> None:
    """Fail with one line, before training, if any destination cannot be written."""
    for location in (locations.checkpoints, locations.model, locations.tensorboard):
        if location:
            open_store(location).check_writable()
