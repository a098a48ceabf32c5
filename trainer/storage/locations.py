"""Where checkpoints, the final model and TensorBoard logs go.

Vertex AI derives `AIP_CHECKPOINT_DIR`, `AIP_MODEL_DIR` and `AIP_TENSORBOARD_LOG_DIR` from
the job's `baseOutputDirectory` (hyperparameter trials get their own sub-directory); the
flags below override them, and without either everything stays under `--output_dir`.
Each may be a `gs://` URI, a `/gcs/BUCKET/...` path (stored through the Cloud Storage
client as `gs://BUCKET/...`, see `storage.open_store`) or a local directory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from trainer.storage.store import open_store

STOP_GRACE_SECONDS = 8
"""How long uploads get after SIGTERM by default. Compute Engine switches a Spot VM off 30 s
after its notice, but GKE gives non-system pods only 15 s of those 30 (GKE's Spot VM
page) and Vertex AI documents nothing for training containers, so the whole stop must fit
in 15 s: this grace, plus the launcher's margin to report and exit
(trainer/launcher/plan.py SHUTDOWN_MARGIN_SECONDS, 5 s), leaves 2 s to spare. Which
checkpoints fit: docs/restarts.md ("From SIGTERM to a complete checkpoint")."""


@dataclass
class OutputArguments:
    checkpoint_dir: str | None = field(
        default=None,
        metadata={
            "help": "Where complete checkpoints are kept and resumed from: gs://, /gcs/ or a "
            "local directory (default: $AIP_CHECKPOINT_DIR, else --output_dir)."
        },
    )
    model_dir: str | None = field(
        default=None,
        metadata={"help": "Where the final model goes (default: $AIP_MODEL_DIR, else "
                  "OUTPUT_DIR/model)."},
    )  # fmt: skip
    tensorboard_dir: str | None = field(
        default=None,
        metadata={"help": "Where TensorBoard logs are synced during training (default: "
                  "$AIP_TENSORBOARD_LOG_DIR; else they stay in OUTPUT_DIR/runs)."},
    )  # fmt: skip
    resume: str = field(
        default="auto",
        metadata={"help": "auto (the newest complete checkpoint, if any), never, or the path "
                  "or gs:// URI of one checkpoint."},
    )  # fmt: skip
    resume_from_output_dir: bool = field(
        default=False,
        metadata={"help": "Let this job continue the run of another job whose output "
                  "directory this is (its checkpoints, then its model); without it, a "
                  "directory another Vertex AI job owns is refused (docs/storage.md)."},
    )  # fmt: skip
    tensorboard_sync_seconds: int = field(
        default=60, metadata={"help": "How often TensorBoard logs are synced."}
    )
    peer_upload_timeout: int = field(
        default=1800,
        metadata={"help": "Seconds the chief waits for the other nodes' part of a checkpoint "
                  "before giving that checkpoint up."},
    )  # fmt: skip
    save_interval_minutes: float | None = field(
        default=None,
        metadata={"help": "Also save a checkpoint when this many minutes have passed since the "
                  "last one (rank 0's clock decides, every rank saves at the same step): bounds "
                  "the work a crash loses whatever the step time."},
    )  # fmt: skip
    stop_grace_seconds: float = field(
        default=STOP_GRACE_SECONDS,
        metadata={"help": "On SIGTERM (Spot preemption, a stopped job) every rank finishes its "
                  "step and saves; uploads get this long from the signal before the process "
                  "exits (with the launcher's 5 s to exit, 13 s: GKE gives a pod 15 s of a "
                  "Spot VM's 30 s notice, Vertex AI documents nothing; docs/restarts.md)."},
    )  # fmt: skip

    def __post_init__(self) -> None:
        if self.save_interval_minutes is not None and self.save_interval_minutes <= 0:
            raise ValueError(
                f"--save_interval_minutes must be more than 0, got {self.save_interval_minutes}."
            )
        if self.stop_grace_seconds < 0:
            raise ValueError(
                f"--stop_grace_seconds must be 0 or more, got {self.stop_grace_seconds}."
            )


@dataclass(frozen=True)
class OutputLocations:
    checkpoints: str
    model: str
    tensorboard: str | None
    shared_checkpoints: bool
    """False when checkpoints stay in each node's own output dir (nothing shared)."""


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
