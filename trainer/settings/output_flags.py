"""The output flags: where checkpoints, the final model and TensorBoard logs go, resuming,
and when checkpoints are saved besides `--save_strategy` (trainer/storage/locations.py
resolves the locations)."""

from __future__ import annotations

from dataclasses import dataclass, field

STOP_GRACE_SECONDS = 8
"""How long uploads get after SIGTERM by default. Compute Engine switches a Spot VM off 30 s
after its notice, but GKE gives non-system pods only 15 s of those 30 (GKE's Spot VM
page) and Vertex AI documents nothing for training containers, so the whole stop must fit
in 15 s: this grace, plus the launcher's margin to report and exit
(trainer/launcher/plan.py SHUTDOWN_MARGIN_SECONDS, 5 s), leaves 2 s to spare. Which
checkpoints fit: docs/restarts.md ("From SIGTERM to a complete checkpoint")."""


@dataclass(frozen=True)
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
        metadata={"help": "Continue the run of the other Vertex AI job that owns this "
                  "output directory (refused without it; docs/storage.md)."},
    )  # fmt: skip
    tensorboard_sync_seconds: int = field(
        default=60, metadata={"help": "How often TensorBoard logs are synced."}
    )
    peer_upload_timeout: int = field(
        default=1800,
        metadata={"help": "Seconds the chief waits for the other nodes' part of a checkpoint."},
    )  # fmt: skip
    save_interval_minutes: float | None = field(
        default=None,
        metadata={"help": "Also save when this many minutes passed since the last save: "
                  "bounds the work a crash loses."},
    )  # fmt: skip
    stop_grace_seconds: float = field(
        default=STOP_GRACE_SECONDS,
        metadata={"help": "On SIGTERM every rank saves its step; uploads get this long "
                  "before the process exits (docs/restarts.md)."},
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
