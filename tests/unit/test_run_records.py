"""One output directory, one job; a restart never trains again a run that delivered its
model or failed in a way that would repeat (trainer/storage/run_records.py).

The launcher runs in-process with its launch replaced: a test sees whether it would have
launched, and the line and exit code it gave instead. The records are the real files, in
a local directory and in the GCS emulator through the real client. The same through real
restarts of two simulated Vertex AI nodes: tests/processes/test_run_records_runs.py."""

from __future__ import annotations

import errno
import json
import uuid

import pytest
from google.api_core.exceptions import Forbidden, ServiceUnavailable

from tests.support.gcs_emulator import BUCKET, FlakyProxy
from tests.support.helpers import launch_is_a_tripwire
from trainer.common.errors import UserError
from trainer.data.damaged_data import DataFault
from trainer.launcher import main as launch
from trainer.storage import store as storage
from trainer.storage.checkpoints import publish_model, write_manifest
from trainer.storage.run_records import (
    OWNER,
    RunIdentity,
    check_ownership,
    claim,
    record_failure,
    record_model,
    records_store,
)
from trainer.storage.store import TransferError, open_store
from trainer.training.failures import RunFailed
from trainer.training.run_end import would_repeat


class Launched(Exception):
    """The launcher reached the launch of accelerate: it would have launched."""


@pytest.fixture
def launcher(monkeypatch, capsys, demo_assets, tmp_path):
    """`python -m trainer` in-process for a job (a CLOUD_ML_JOB_ID, or None: a local run)
    writing to `outputs`: returns (exit code, stdout, stderr); exit code None if it launched."""
    monkeypatch.chdir(tmp_path)
    for name in ("CLUSTER_SPEC", "RANK", "WORLD_SIZE", "CLOUD_ML_JOB_ID", "CLOUD_ML_TRIAL_ID"):
        monkeypatch.delenv(name, raising=False)

    def never_launch(*args):
        raise Launched

    launch_is_a_tripwire(monkeypatch, never_launch)

    def run(job: str | None, outputs: str, *args: str):
        if job is None:
            monkeypatch.delenv("CLOUD_ML_JOB_ID", raising=False)
        else:
            monkeypatch.setenv("CLOUD_ML_JOB_ID", job)
        argv = ["--model_name_or_path", str(demo_assets.model_dir),
                "--dataset_name", str(demo_assets.dataset_dir),
                "--text_column_name", "transcription", "--output_dir", "out",
                "--checkpoint_dir", f"{outputs}/checkpoints", "--model_dir", f"{outputs}/model",
                *args]  # fmt: skip
        code = None
        try:
            launch.main(argv)
        except Launched:
            pass
        except SystemExit as exit_info:
            code = exit_info.code
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


@pytest.fixture(params=["local", "gs"])
def outputs(request, tmp_path):
    """An output directory on the local disk, or in the GCS emulator."""
    if request.param == "gs":
        request.getfixturevalue("gcs")
        return f"gs://{BUCKET}/{uuid.uuid4().hex}"
    return str(tmp_path / "job-outputs")


def owner_of(outputs: str) -> dict:
    return json.loads(records_store(f"{outputs}/checkpoints").read_text(OWNER))


def test_another_job_is_refused_a_directory_a_job_owns_unless_it_continues_that_run(
    launcher, outputs
):
    code, _, _ = launcher("111", outputs)
    assert code is None, "the first job launches"
    assert owner_of(outputs)["job"] == "111"

    code, out, err = launcher("222", outputs)
    assert (code, out) == (2, "")
    assert err == (
        f"error: {outputs}/checkpoints belongs to job 111, not to this run (job 222): its "
        "checkpoints and model would be overwritten. Give this job another output directory "
        "(baseOutputDirectory, --checkpoint_dir), or pass --resume_from_output_dir to "
        "continue that run.\n"
    )
    assert owner_of(outputs)["job"] == "111", "a refused job claims nothing"
    code, _, err = launcher(None, outputs)  # a local run is another job too
    assert code == 2 and "belongs to job 111, not to this run (a run outside Vertex AI" in err

    assert launcher("111", outputs)[0] is None, "a restart of the owner (same job id) launches"
    assert launcher("222", outputs, "--resume_from_output_dir")[0] is None
    owner = owner_of(outputs)
    assert (owner["job"], owner["continues"]["job"]) == ("222", "111")
    code, _, err = launcher("111", outputs)
    assert code == 2 and "belongs to job 222" in err, "the old job no longer owns it"


@pytest.fixture(params=["local", "gs"])
def raced_outputs(request, tmp_path, monkeypatch):
    """An output directory on the local disk, or in the GCS emulator behind the proxy that
    answers create-only uploads as Cloud Storage does (the emulator ignores preconditions)."""
    if request.param == "local":
        yield str(tmp_path / "job-outputs")
        return
    proxy = FlakyProxy(request.getfixturevalue("gcs"))
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
    storage._process_client.cache_clear()
    try:
        yield f"gs://{BUCKET}/{uuid.uuid4().hex}"
    finally:
        proxy.close()
        storage._process_client.cache_clear()


def test_two_jobs_whose_checks_overlap_cannot_both_claim_a_directory(raced_outputs):
    """Both jobs check while the directory has no owner (their checks take seconds); the
    first claim wins and the second, made after it, is refused with the line a later job
    gets, so exactly one launches. The record names the winner, unchanged."""
    checkpoints = f"{raced_outputs}/checkpoints"
    first, second = RunIdentity("111"), RunIdentity("222")
    seen_by_first = check_ownership(checkpoints, first, continue_other=False)
    seen_by_second = check_ownership(checkpoints, second, continue_other=False)
    assert seen_by_first is seen_by_second is None
    claim(checkpoints, first, seen_by_first)
    with pytest.raises(UserError) as refused:
        claim(checkpoints, second, seen_by_second)
    assert str(refused.value).startswith(
        f"{checkpoints} belongs to job 111, not to this run (job 222): its checkpoints and "
        "model would be overwritten."
    )
    assert owner_of(raced_outputs)["job"] == "111"
    claim(checkpoints, first, seen_by_first)  # the winner's own restart: still its own
    assert owner_of(raced_outputs)["job"] == "111"


def test_a_failed_check_claims_nothing(launcher, tmp_path):
    outputs = str(tmp_path / "job-outputs")
    code, _, err = launcher("111", outputs, "--language", "klingon")
    assert code == 2 and 'Unknown language "klingon"' in err
    assert launcher("222", outputs)[0] is None, "the fixed job, with a new id, may use it"


def test_local_runs_continue_in_their_folder_whatever_an_earlier_one_left(launcher, tmp_path):
    """Outside Vertex AI a re-run is a person's choice: it continues the folder's run, and
    neither a delivered model nor a failure record of a local run stops it."""
    outputs = str(tmp_path / "job-outputs")
    assert launcher(None, outputs)[0] is None
    deliver(outputs, RunIdentity(None), tmp_path)
    assert launcher(None, outputs)[0] is None
    assert owner_of(outputs)["job"] is None


def deliver(outputs: str, identity: RunIdentity, tmp_path) -> None:
    """A model delivered as `deliver_model` does: files, manifest last, then the record."""
    model = tmp_path / f"model-{uuid.uuid4().hex}"
    model.mkdir()
    (model / "config.json").write_text("{}")
    publish_model(open_store(f"{outputs}/model"), model)
    record_model(f"{outputs}/checkpoints", identity, f"{outputs}/model", 40)


def complete_checkpoint(outputs: str, step: int) -> None:
    write_manifest(open_store(f"{outputs}/checkpoints/checkpoint-{step}"), {"files": []})


def test_a_restart_after_the_model_was_delivered_exits_0_before_launch(launcher, outputs, tmp_path):
    assert launcher("111", outputs)[0] is None
    deliver(outputs, RunIdentity("111"), tmp_path)

    code, out, err = launcher("111", outputs)
    assert (code, err) == (0, "")
    assert out.splitlines()[-1] == (
        "model delivered: an earlier attempt of this job (job 111) delivered the trained "
        f"model to {outputs}/model (its manifest.json lists every file) after step 40; "
        "nothing is trained again"
    )
    # another job continuing the run is not this job: it trains
    assert launcher("222", outputs, "--resume_from_output_dir")[0] is None


def test_a_model_without_its_manifest_does_not_stop_a_restart(launcher, tmp_path):
    outputs = str(tmp_path / "job-outputs")
    assert launcher("111", outputs)[0] is None
    deliver(outputs, RunIdentity("111"), tmp_path)
    open_store(f"{outputs}/model/manifest.json").delete()  # a delivery that failed midway
    assert launcher("111", outputs)[0] is None


@pytest.mark.parametrize("exit_code", [78, 1])
def test_a_restart_after_a_failure_that_would_repeat_stops_with_its_line(
    launcher, outputs, exit_code
):
    assert launcher("111", outputs)[0] is None
    complete_checkpoint(outputs, 3)
    line = "the evaluation at step 3 failed (ValueError: metric backend exploded)"
    record_failure(f"{outputs}/checkpoints", RunIdentity("111"), 0, line, exit_code)

    code, out, err = launcher("111", outputs)
    assert (code, out) == (exit_code, "")
    assert err.count("\n") == 1 and err.startswith(f"error: {line} [so ended an earlier attempt")
    assert "(job 111), with checkpoint-3, still the newest complete one" in err

    complete_checkpoint(outputs, 6)  # progress since the failure: the restart resumes
    assert launcher("111", outputs)[0] is None


def test_a_failure_before_any_checkpoint_stops_the_restart_too(launcher, tmp_path):
    outputs = str(tmp_path / "job-outputs")
    assert launcher("111", outputs)[0] is None
    line = "--metric_for_best_model bleu: the task reports wer"
    record_failure(f"{outputs}/checkpoints", RunIdentity("111"), 1, line, 78)
    code, _, err = launcher("111", outputs)
    assert code == 78 and "with no complete checkpoint, and there is none yet" in err


def test_trials_of_one_tuning_job_are_different_runs(launcher, tmp_path, monkeypatch):
    outputs = str(tmp_path / "job-outputs")
    monkeypatch.setenv("CLOUD_ML_TRIAL_ID", "1")
    assert launcher("111", outputs)[0] is None
    monkeypatch.setenv("CLOUD_ML_TRIAL_ID", "2")
    code, _, err = launcher("111", outputs)
    assert code == 2 and "belongs to job 111, trial 1, not to this run (job 111, trial 2)" in err


def storage_failure(kind: type[Exception]) -> RunFailed:
    """A run's line raised from a storage error, as `WhatIsKept.failed` raises it."""
    try:
        raise kind("bucket says no")
    except Exception as cause:
        failure = RunFailed("uploading the final model failed")
        failure.__cause__ = cause
        return failure


def disk_full() -> OSError:
    return OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize(
    ("error", "repeats"),
    [
        pytest.param(UserError("--metric_for_best_model bleu"), True, id="configuration"),
        pytest.param(
            DataFault("shard train-3 has CRC32C x but index.json says y"), True, id="damaged-data"
        ),  # fmt: skip
        pytest.param(ValueError("metric backend exploded"), True, id="code"),
        pytest.param(storage_failure(Forbidden), False, id="refused"),
        pytest.param(storage_failure(ServiceUnavailable), False, id="outage"),
        pytest.param(TransferError("upload failed for: a.bin"), False, id="transfer"),
        pytest.param(RunFailed("uploading checkpoint-4 failed"), False, id="unknown-cause"),
        pytest.param(RuntimeError("Connection closed by peer"), False, id="lost-peer"),
        pytest.param(disk_full(), False, id="disk-full"),
        pytest.param(
            RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 64 vs 0"),
            False,
            id="disk-full-at-torch-save",
        ),  # fmt: skip
    ],
)
def test_only_failures_a_restart_cannot_cure_are_recorded(error, repeats):
    assert would_repeat(error) is repeats
