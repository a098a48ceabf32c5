"""The output flags: where checkpoints, the final model and TensorBoard logs go, resuming,
and when checkpoints are saved besides `--save_strategy` (trainer/storage/locations.py
resolves the locations)."""

from __future__ import annotations

from dataclasses import dataclass

from trainer.common.flag_fields import flag

STOP_GRACE_SECONDS = 8
"""How long uploads get after SIGTERM by default. Compute Engine switches a Spot VM off 30 s
after its notice, but GKE gives non-system pods only 15 s of those 30 (GKE's Spot VM
page) and Vertex AI documents nothing for training containers, so the whole stop must fit
in 15 s: this grace, plus the launcher's margin to report and exit
(trainer/launcher/plan.py SHUTDOWN_MARGIN_SECONDS, 5 s), leaves 2 s to spare. Which
checkpoints fit: docs/restarts.md ("From SIGTERM to a complete checkpoint")."""


@dataclass(frozen=True)
class OutputArguments:
    checkpoint_dir: str | None = flag(
        None,
        "Where complete checkpoints are kept and resumed from: gs://, /gcs/ or a "
        "local directory (default: $AIP_CHECKPOINT_DIR, else --output_dir).",
    )
    model_dir: str | None = flag(
        None, "Where the final model goes (default: $AIP_MODEL_DIR, else OUTPUT_DIR/model)."
    )
    tensorboard_dir: str | None = flag(
        None,
        "Where TensorBoard logs are synced during training (default: "
        "$AIP_TENSORBOARD_LOG_DIR; else they stay in OUTPUT_DIR/runs).",
    )
    resume: str = flag(
        "auto",
        "auto (the newest complete checkpoint, if any), never, or the path "
        "or gs:// URI of one checkpoint.",
    )
    resume_from_output_dir: bool = flag(
        False,
        "Continue the run of the other Vertex AI job that owns this output directory.",
    )
    tensorboard_sync_seconds: int = flag(60, "How often TensorBoard logs are synced.")
    peer_upload_timeout: int = flag(
        1800, "Seconds the chief waits for the other nodes' part of a checkpoint."
    )
    save_interval_minutes: float | None = flag(
        None,
        "Also save when this many minutes passed since the last save: "
        "bounds the work a crash loses.",
    )
    stop_grace_seconds: float = flag(
        STOP_GRACE_SECONDS,
        "On SIGTERM each rank saves its step, uploads get this long (docs/restarts.md).",
    )
    failure_upload_seconds: float = flag(
        600,
        "After a failure (not a stop): how long saved checkpoints get to upload.",
    )
    # --register_model and its place: docs/serving.md, "Registering the model" (one line each
    # in --help, which must fit a terminal page).
    register_model: str | None = flag(None, "Register the model as NAME.")
    serving_image: str | None = flag(None, "Its serving image, pinned.")
    registry_project: str | None = flag(None, "The registry's project.")
    registry_region: str | None = flag(None, "The registry's region.")
    registry_api_endpoint: str | None = flag(None, "Private registry API address.")
    version_alias: list[str] = flag([], "Its version aliases.", action="extend")
    deployment_timeout_s: int | None = flag(None, "Its deploymentTimeout (s).")

    def __post_init__(self) -> None:
        if self.save_interval_minutes is not None and self.save_interval_minutes <= 0:
            raise ValueError(
                f"--save_interval_minutes must be more than 0, got {self.save_interval_minutes}."
            )
        for name in ("stop_grace_seconds", "failure_upload_seconds"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name} must be 0 or more, got {getattr(self, name)}.")
