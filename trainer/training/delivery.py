"""The trained model delivered: saved by every rank together, merged when it is a LoRA
adapter (trainer/training/adapter_merge.py), uploaded by the chief with its manifest last,
and recorded for a restart (trainer/training/run_end.py) before anything else can fail."""

from __future__ import annotations

from pathlib import Path

from trainer.storage.checkpoints import MANIFEST, publish_model
from trainer.storage.failure_kinds import brief, disk_full, disk_line
from trainer.storage.file_modes import make_readable
from trainer.storage.store import open_store
from trainer.training.adapter_merge import merge_delivered_adapter
from trainer.training.failures import RunFailed
from trainer.training.run_end import remember_delivery

FINAL_MODEL_DIRNAME = "model"


class ModelNotDelivered(RunFailed):
    """Saving or uploading the final model failed; the message says what is left where. Its
    cause may be cut short (the storage error's type and status come first; its whole text
    is in the traceback file the line before names)."""

    cause_kept = 30


def deliver_model(run) -> str:
    """Save the final model and processor of `run` (a trainer/training/run.py `TrainingRun`),
    upload them, return where the model is; its manifest, written last, says it is complete.
    Every rank takes part in saving (under ZeRO-3 gathering the weights is a collective); the
    global main process writes (with `--peft lora`, merges) and uploads."""
    final_dir = Path(run.trainer.args.output_dir) / FINAL_MODEL_DIRNAME
    destination = run.config.locations.model
    try:
        run.trainer.save_model(str(final_dir))
        if run.place.is_global_main:
            merge_delivered_adapter(run.task, final_dir, run.trainer.args)
        if run.trainer.args.should_save:  # the process that wrote it (safetensors: 0600)
            make_readable(final_dir)
    except Exception as error:
        what = (
            disk_line(final_dir, "writing the final model")
            if disk_full(error)
            else f"saving the final model to {final_dir} failed"
        )
        raise ModelNotDelivered(f"{what} ({brief(error)})") from error
    if not run.place.is_global_main:
        return destination
    try:
        publish_model(open_store(destination), final_dir)
    except Exception as error:
        raise upload_failed(destination, run.config.locations.checkpoints, error) from error
    print(
        f"final model and processor saved to {destination} (load with from_pretrained)", flush=True
    )
    # a restart of this job then stops before launch, saying the model is there
    remember_delivery(run.config.locations.checkpoints, destination, run.trainer.state.global_step)
    return destination


def upload_failed(destination: str, checkpoints: str, error: Exception) -> ModelNotDelivered:
    """The model's upload failed: it is incomplete where it went (no manifest)."""
    where = named_beside(destination, checkpoints)
    return ModelNotDelivered(f"uploading the final model to {where} failed (", brief(error),
                             f"): incomplete there (no {MANIFEST})")  # fmt: skip


def named_beside(location: str, checkpoints: str) -> str:
    """`location` as the line ending with the newest complete checkpoint names it: by its
    last folder when it is beside the checkpoints (Vertex AI's `model/` and `checkpoints/`
    under `baseOutputDirectory`), whose long location that ending names already."""
    parent, name = location.rstrip("/").rpartition("/")[::2]
    if parent and parent == checkpoints.rstrip("/").rpartition("/")[0]:
        return f"{name}/ beside the checkpoints"
    return location
