"""Who owns an output directory, and how this job's run ended: small JSON files in
`<checkpoints>/.run/`, on Cloud Storage or a local disk alike.

Two things go wrong without them (docs/restarts.md, "One output directory, one job"):
- two jobs given the same output directory both run, one overwriting the other's checkpoints
  and model. `owner.json` names the job owning the directory (Vertex AI's `CLOUD_ML_JOB_ID`,
  plus the tuning trial); the launcher refuses another job there unless told to continue that
  job's run (`--resume_from_output_dir`);
- Vertex AI restarts a replica that exits non-zero, so a run that delivered its model and then
  failed (the final evaluation), or whose failure will only repeat (a configuration, data or
  code error), would train again, up to five times. `model.json` records a delivered model,
  `failure-rank-R.json` a failure a restart cannot cure; a restart of the same job finding them
  stops before launch.

Runs outside Vertex AI have no job id: they are all one "local" job, so running `python -m
trainer` again in the same folder continues the run there, and neither record stops it (a
person re-running a command has usually changed something).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from trainer.common.errors import UserError
from trainer.common.log_lines import MAX_LINE
from trainer.storage.checkpoints import (
    NEWEST_COMPLETE,
    checkpoint_step,
    complete_checkpoints,
    read_manifest,
)
from trainer.storage.store import Store, open_store

RECORDS_DIRNAME = ".run"
OWNER = "owner.json"
MODEL = "model.json"
FAILURE_PREFIX = "failure-rank-"

JOB_ID_VARIABLE = "CLOUD_ML_JOB_ID"
"""Set by Vertex AI in every replica: the CustomJob's id, the same on every restart and
whole-job retry of that job ("Understand the custom training service")."""


@dataclass(frozen=True)
class RunIdentity:
    """Which job (and tuning trial) a run belongs to. `job` is None outside Vertex AI."""

    job: str | None
    trial: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> RunIdentity:
        job = env.get(JOB_ID_VARIABLE, "").strip() or None
        return cls(job, env.get("CLOUD_ML_TRIAL_ID", "").strip() or trial_in_cluster_spec(env))

    @property
    def restartable(self) -> bool:
        """Whether the platform restarts this run by itself (a Vertex AI job): only then
        are the ends of earlier attempts a reason not to start."""
        return self.job is not None

    def describe(self) -> str:
        who = f"job {self.job}" if self.job else "a run outside Vertex AI (no CLOUD_ML_JOB_ID)"
        return f"{who}, trial {self.trial}" if self.trial else who


def trial_in_cluster_spec(env: Mapping[str, str]) -> str | None:
    """The hyperparameter-tuning trial CLUSTER_SPEC may carry in `task.trial`."""
    try:
        trial = json.loads(env.get("CLUSTER_SPEC") or "{}")["task"].get("trial")
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return str(trial) if trial not in (None, "") else None


class RunAlreadyEnded(Exception):
    """A restart of a job whose run already ended in a way another attempt cannot change:
    the launcher prints `line` and exits with `exit_code`, before launching anything."""

    def __init__(self, line: str, exit_code: int) -> None:
        super().__init__(line)
        self.line = line
        self.exit_code = exit_code


def records_store(checkpoints: str) -> Store:
    return open_store(checkpoints).child(RECORDS_DIRNAME)


def read_json(store: Store, name: str) -> dict | None:
    text = store.read_text(name)
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None  # a torn write: as if absent


def identity_of(record: dict | None) -> RunIdentity | None:
    return RunIdentity(record.get("job"), record.get("trial")) if record else None


def check_ownership(checkpoints: str, identity: RunIdentity, continue_other: bool) -> dict | None:
    """Before launch, on every node: refuse (UserError) a directory another job owns,
    unless `continue_other` (`--resume_from_output_dir`); stop (`RunAlreadyEnded`) a restart
    of this job whose run already ended. Returns the owner's record (None: no owner yet)."""
    records = records_store(checkpoints)
    owner_record = read_json(records, OWNER)
    owner = identity_of(owner_record)
    if owner is not None and owner != identity and not continue_other:
        raise owned_by_another(checkpoints, owner, identity)
    if owner == identity and identity.restartable:
        ended = how_it_ended(checkpoints, records, identity)
        if ended is not None:
            raise ended
    return owner_record


def owned_by_another(checkpoints: str, owner: RunIdentity, identity: RunIdentity) -> UserError:
    return UserError(
        f"{checkpoints} belongs to {owner.describe()}, not to this run "
        f"({identity.describe()}): its checkpoints and model would be overwritten. "
        "Give this job another output directory (baseOutputDirectory, "
        "--checkpoint_dir), or pass --resume_from_output_dir to continue that run."
    )


def claim(checkpoints: str, identity: RunIdentity, owner_record: dict | None) -> None:
    """Record this job as the directory's owner (the chief, once every check passed: a job
    refused before launch owns nothing), naming the run it continues, if any.

    A directory that had no owner at the check is claimed with an atomic create, and the
    outcome is checked here: two jobs whose checks overlapped (a gs:// dataset or a Hub
    check takes seconds) both saw no owner, and only the first create succeeds; the other
    is refused (UserError) before it launches. A create that fails because this job's own
    earlier attempt of the request landed (a retried write) finds this job the owner."""
    if identity_of(owner_record) == identity:
        return
    record = {**asdict(identity), "host": socket.gethostname(), "claimed_at": time.time()}
    records = records_store(checkpoints)
    if owner_record is not None:  # continuing another job's run, as asked
        records.write_text(OWNER, json.dumps({**record, "continues": owner_record}, indent=1))
        return
    if records.create_text(OWNER, json.dumps(record, indent=1)):
        return
    winner = identity_of(read_json(records, OWNER))
    if winner is not None and winner != identity:
        raise owned_by_another(checkpoints, winner, identity)


def how_it_ended(checkpoints: str, records: Store, identity: RunIdentity) -> RunAlreadyEnded | None:
    """What an earlier attempt of this job left: a complete model it delivered (exit 0), or
    a failure that would repeat, recorded when the newest complete checkpoint was already
    the newest there is (the original exit code). None when a restart should resume."""
    delivered = read_json(records, MODEL)
    if identity_of(delivered) == identity and read_manifest(open_store(delivered["model"])):
        return RunAlreadyEnded(
            f"model delivered: an earlier attempt of this job ({identity.describe()}) "
            f"delivered the trained model to {delivered['model']} (its manifest.json lists "
            f"every file) after step {delivered['step']}; nothing is trained again",
            0,
        )
    complete = complete_checkpoints(open_store(checkpoints))
    newest = checkpoint_step(complete[-1]) if complete else -1
    for name in sorted(records.list_files()):
        if not name.startswith(FAILURE_PREFIX):
            continue
        failure = read_json(records, name)
        if identity_of(failure) != identity or failure["checkpoint_step"] < newest:
            continue
        return RunAlreadyEnded(
            repeated_line(failure["line"], identity, failure["checkpoint_step"]),
            failure["exit_code"],
        )
    return None


def repeated_line(line: str, identity: RunIdentity, step: int) -> str:
    """The restart's line for a failure that would repeat: the earlier attempt's line without
    its end about the checkpoint (said anew), cut to what is left of MAX_LINE."""
    at = (
        f"checkpoint-{step}, still the newest complete one"
        if step >= 0
        else "no complete checkpoint, and there is none yet"
    )
    note = (
        f" [so ended an earlier attempt of this job ({identity.describe()}), with {at}: "
        "nothing was started; fix the cause in a new job (--resume_from_output_dir "
        "continues this run)]"
    )
    earlier = line.split(f"; {NEWEST_COMPLETE}")[0]
    room = max(MAX_LINE - len(note), 60)
    cut = earlier if len(earlier) <= room else f"{earlier[: room - 1]}…"
    return f"error: {cut}{note}"


def record_model(checkpoints: str, identity: RunIdentity, model: str, step: int) -> None:
    """After the model's manifest is written: this job's run has delivered its model."""
    record = {**asdict(identity), "model": model, "step": step, "at": time.time()}
    records_store(checkpoints).write_text(MODEL, json.dumps(record, indent=1))


def record_failure(
    checkpoints: str, identity: RunIdentity, rank: int, line: str, exit_code: int
) -> None:
    """This rank's failure, which a restart would repeat, with the newest complete
    checkpoint at this moment (-1: none). One file per rank: ranks never write the same
    object (Cloud Storage allows about one write a second per object)."""
    complete = complete_checkpoints(open_store(checkpoints))
    record = {
        **asdict(identity),
        "line": line,
        "exit_code": exit_code,
        "checkpoint_step": checkpoint_step(complete[-1]) if complete else -1,
        "at": time.time(),
    }
    records_store(checkpoints).write_text(f"{FAILURE_PREFIX}{rank}.json", json.dumps(record))
