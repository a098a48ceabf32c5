"""How this attempt ended, recorded for the launcher of the next one
(trainer/storage/run_records.py): Vertex AI restarts a replica that exits non-zero (five times,
then the whole job), and unrecorded, every restart would train again, after a delivered model
or up to the same failure. Only jobs with a `CLOUD_ML_JOB_ID` record.

Recorded: a configuration error found in training (`UserError`, exit 78) and any failure whose
causes hold no storage, network, disk or peer error (damaged data, a raising metric, a bug).
Not recorded, so the restart resumes: a lost peer, a preemption (75, never routed here), a
storage outage or refusal (maybe fixed meanwhile), a full disk, a `RunFailed` with no cause
(failed uploads): a needless restart costs some GPU time, a wrong record ends a job that could
have finished.
"""

from __future__ import annotations

import logging
import os

from google.api_core.exceptions import GoogleAPIError
from google.auth.exceptions import GoogleAuthError

from trainer.common.errors import UserError
from trainer.settings.run_config import RunConfig
from trainer.storage.failure_kinds import causes, disk_full
from trainer.storage.run_records import RunIdentity, record_failure, record_model
from trainer.storage.store import TransferError
from trainer.training.failures import RunFailed, is_peer_failure

CURABLE = (GoogleAPIError, GoogleAuthError, TransferError, OSError)
"""Storage and network errors (requests' and the socket's are OSErrors), and a full disk."""


def would_repeat(error: BaseException) -> bool:
    """Whether the same attempt, restarted from the same checkpoint, would fail the same way."""
    if isinstance(error, UserError):
        return True
    if isinstance(error, RunFailed) and error.__cause__ is None:
        return False
    if disk_full(error):  # torch's zip writer says so in a RuntimeError ("unexpected pos")
        return False
    return not any(
        isinstance(cause, CURABLE) or (isinstance(cause, Exception) and is_peer_failure(cause))
        for cause in causes(error)
    )


def remember_failure(
    config: RunConfig | None, error: BaseException, line: str, exit_code: int
) -> None:
    """Record this rank's failure (its one line, without `error: `) if it would repeat and
    the platform restarts this job; a record that cannot be written only costs a retrain."""
    identity = RunIdentity.from_env(os.environ)
    if config is None or not identity.restartable or not would_repeat(error):
        return
    checkpoints = config.locations.checkpoints
    try:
        record_failure(checkpoints, identity, int(os.environ.get("RANK", "0")), line, exit_code)
    except Exception as failure:  # noqa: BLE001 - the run's own line is already out
        logging.getLogger(__name__).warning("could not record the failure in %s: %s",
                                            checkpoints, failure)  # fmt: skip


def remember_delivery(checkpoints: str, model: str, step: int) -> None:
    """Record that this job's model is delivered (its manifest written) at `step`."""
    identity = RunIdentity.from_env(os.environ)
    if not identity.restartable:
        return
    try:
        record_model(checkpoints, identity, model, step)
    except Exception as failure:  # noqa: BLE001 - the model is delivered; a restart retrains
        logging.getLogger(__name__).warning("could not record the delivered model in %s: %s",
                                            checkpoints, failure)  # fmt: skip
