"""A training process fails: one `error:` line naming its rank, node and exception, and
where its traceback was kept; not a traceback per rank plus torchrun's ChildFailedError box.
Here the reports themselves, in this process; real runs whose process fails or is killed:
tests/processes/test_failure_report_runs.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.common.exit_codes import CONFIG_ERROR_IN_TRAINING_EXIT_CODE
from trainer.common.handoff import RUN_CONFIG_VARIABLE, STOP_REPORTS_VARIABLE
from trainer.config.resolve import resolve_run
from trainer.launcher import accelerate_launch
from trainer.settings.run_config import Hardware
from trainer.storage.checkpoints import write_manifest
from trainer.storage.store import open_store
from trainer.training.failures import (
    MAX_LINE,
    PEER_FAILURE_GRACE_SECONDS,
    RunFailed,
    exit_after_the_line,
    is_peer_failure,
    report_failure,
    report_run_failed,
)
from trainer.training.tracebacks import keep_traceback, traceback_text


def keep_in(folder: Path):
    """A traceback keeper writing to `folder/traceback.txt` (training's writes to the run's
    output directory: test_a_traceback_is_kept_in_the_output_dir_and_beside_gs_checkpoints)."""

    def keep(error: BaseException) -> str:
        (folder / "traceback.txt").write_text(traceback_text(error))
        return str(folder / "traceback.txt")

    return keep


class Failure:
    def __init__(self, exitcode: int, local_rank: int = 1) -> None:
        self.exitcode, self.local_rank = exitcode, local_rank

    def signal_name(self) -> str:
        return "SIGKILL"


class ChildFailed:
    def __init__(self, failure: Failure) -> None:
        self.failure = failure

    def get_first_failure(self):
        return 3, self.failure


@pytest.mark.parametrize("exitcode", [1, CONFIG_ERROR_IN_TRAINING_EXIT_CODE])
def test_a_process_that_reported_itself_gets_no_second_line(exitcode, capsys):
    assert accelerate_launch.report(ChildFailed(Failure(exitcode)), node_rank=1) == exitcode
    assert capsys.readouterr().err == ""


def test_a_killed_process_gets_one_line_naming_rank_node_and_signal(capsys):
    assert accelerate_launch.report(ChildFailed(Failure(-9)), node_rank=1) == 1
    assert capsys.readouterr().err == (
        "error: training process rank 3 (node 1, local rank 1) was killed by SIGKILL "
        "(out of memory? the kernel's OOM killer sends SIGKILL)\n"
    )


def test_a_killed_process_s_line_says_where_the_newest_complete_checkpoint_is(
    tmp_path, capsys, monkeypatch
):
    """A process killed by a signal (the OOM killer) cannot say what is kept: its node's
    launcher does, from the configuration handed over to the run and the store itself
    (checkpoint-4 has no manifest: not complete)."""
    checkpoints = open_store(str(tmp_path / "checkpoints"))
    for name in ("checkpoint-2", "checkpoint-4"):
        checkpoints.child(name).write_text("trainer_state.json", "{}")
    write_manifest(checkpoints.child("checkpoint-2"), {"files": []})
    hardware = Hardware(gpu_count=0, gpu_name=None, compute_capability=None, cpu_count=2)
    argv = ["--task", "speech-recognition", "--model_name_or_path", "org/model",
            "--dataset_name", "org/data",
            "--checkpoint_dir", str(tmp_path / "checkpoints")]  # fmt: skip
    config = resolve_run(argv, {}, hardware)
    monkeypatch.setenv(RUN_CONFIG_VARIABLE, config.to_json())

    assert accelerate_launch.report(ChildFailed(Failure(-9)), node_rank=1) == 1
    assert capsys.readouterr().err == (
        "error: training process rank 3 (node 1, local rank 1) was killed by SIGKILL "
        "(out of memory? the kernel's OOM killer sends SIGKILL); the newest complete "
        f"checkpoint is {tmp_path / 'checkpoints' / 'checkpoint-2'}, where a restart resumes\n"
    )


def test_a_broken_collective_waits_for_torchrun_before_reporting(capsys, monkeypatch, tmp_path):
    """An echo of another process's failure waits (torchrun stops it if the cause was on
    its node), then (started without the agent) its node's local rank 0 alone says so, keeping
    no traceback; a cause reports at once, in one line naming the file its traceback went to."""
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("GROUP_RANK", "1")
    waits = []
    echo = RuntimeError("[gloo] Connection closed by peer [127.0.0.1]:1234")
    assert is_peer_failure(echo)
    monkeypatch.setenv("LOCAL_RANK", "1")
    report_failure(echo, keep_in(tmp_path), sleep=waits.append)
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("LOCAL_RANK", "0")
    report_failure(echo, keep_in(tmp_path), sleep=waits.append)
    assert capsys.readouterr().err.startswith(
        "error: rank 2 of 4 (node 1, local rank 0) stopped: another node's process or machine "
        "failed"
    )
    assert len(waits) == 2

    try:
        raise ValueError("bad\nclip")
    except ValueError as raised:
        cause = raised
    assert not is_peer_failure(cause)
    assert not (tmp_path / "traceback.txt").exists()  # an echo keeps none
    report_failure(cause, keep_in(tmp_path), sleep=waits.append)
    assert len(waits) == 2
    assert capsys.readouterr().err == (
        f"the traceback of the error below is in {tmp_path / 'traceback.txt'}\n"
        "error: rank 2 of 4 (node 1, local rank 0) failed: ValueError: bad clip\n"
    )
    kept = (tmp_path / "traceback.txt").read_text()
    assert kept.startswith("Traceback (most recent call last)") and "ValueError: bad\nclip" in kept


def test_the_first_echo_of_a_node_to_end_its_wait_says_the_node_line(capsys, monkeypatch, tmp_path):
    """In a launched run (the agent's directory is there), the first echo to end its wait says
    the node's line, whatever its local rank: the local main process may be waiting in a
    collective on that one. Any later echo of the node says nothing."""
    reports = tmp_path / "reports"
    reports.mkdir()
    monkeypatch.setenv(STOP_REPORTS_VARIABLE, str(reports))
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("GROUP_RANK", "1")
    echo = RuntimeError("[gloo] Connection closed by peer [127.0.0.1]:1234")
    said_by = []
    for rank, local_rank in (("3", "1"), ("2", "0")):
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("LOCAL_RANK", local_rank)
        line, said = report_failure(echo, keep_in(tmp_path), sleep=lambda seconds: None)
        assert capsys.readouterr().err == (f"error: {line}\n" if said else "")
        said_by.append((line.split(" stopped:")[0], said))
    assert said_by == [("rank 3 of 4 (node 1, local rank 1)", True),
                       ("rank 2 of 4 (node 1, local rank 0)", False)]  # fmt: skip


def test_a_run_failure_is_said_by_the_local_main_process_and_the_others_wait_to_exit(
    capsys, monkeypatch, tmp_path
):
    """A RunFailed is the node's one line, said by local rank 0 after it kept the cause's
    traceback; another local rank says nothing, and waits before it exits: the first exit
    torchrun sees ends every process of the node, and would cut the line short."""
    waits = []
    try:
        raise OSError("403 Forbidden")
    except OSError as raised:
        failed = RunFailed("reading checkpoint-4 failed (403 Forbidden)")
        failed.__cause__ = raised
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert not report_run_failed(failed, keep_in(tmp_path))
    assert capsys.readouterr().err == "" and not (tmp_path / "traceback.txt").exists()
    with pytest.raises(SystemExit) as ended:
        exit_after_the_line(1, said=False, sleep=waits.append)
    assert ended.value.code == 1 and waits == [PEER_FAILURE_GRACE_SECONDS]
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert report_run_failed(failed, keep_in(tmp_path))
    assert capsys.readouterr().err == (
        f"the traceback of the error below is in {tmp_path / 'traceback.txt'}\n"
        "error: reading checkpoint-4 failed (403 Forbidden)\n"
    )
    with pytest.raises(SystemExit):
        exit_after_the_line(1, said=True, sleep=waits.append)
    assert len(waits) == 1


def test_a_failure_in_training_ends_its_line_with_what_is_kept(capsys, monkeypatch, tmp_path):
    """Training notes on the exception where the newest complete checkpoint is (a dead
    node or a crash on one rank, like every other failure, says where a restart resumes);
    the line ends with it, secrets masked."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("HF_TOKEN", "hf_secretvalue123")
    kept = (
        "the newest complete checkpoint is gs://b/checkpoints/checkpoint-8, where a restart resumes"
    )
    echo = RuntimeError("[gloo] Connection closed by peer [127.0.0.1]:1234")
    echo.add_note(kept)
    line, _ = report_failure(echo, keep_in(tmp_path), sleep=lambda seconds: None)
    assert line.endswith(f"that node's log says why; {kept}"), line
    assert capsys.readouterr().err == f"error: {line}\n"

    crash = ValueError("a NaN on this rank")
    crash.add_note("there is no complete checkpoint in gs://b/hf_secretvalue123/checkpoints")
    line, _ = report_failure(crash, lambda error: None)
    assert line == ("rank 0 of 2 (node 0, local rank 0) failed: ValueError: a NaN on this rank; "
                    "there is no complete checkpoint in gs://b/***/checkpoints"), line  # fmt: skip
    assert "hf_secretvalue123" not in capsys.readouterr().err


def test_a_long_exception_is_cut_so_the_line_keeps_what_is_kept_and_where_the_traceback_is(
    capsys, monkeypatch, tmp_path
):
    """A storage client's exception quotes the whole request URL and its status tuple: the
    cause is cut, not the end of the line that says where the work is (the traceback file
    keeps all of it)."""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    url = "https://storage.googleapis.com/upload/storage/v1/b/bucket/o?uploadType=resumable"
    error = ConnectionError(f"403 POST {url}&name=checkpoints%2Fcheckpoint-4%2Fmodel.safetensors: "
                            "('Request failed with status code', 403, 'Expected one of', "
                            "<HTTPStatus.OK: 200>, <HTTPStatus.CREATED: 201>)" * 3)  # fmt: skip
    kept = (
        "the newest complete checkpoint is gs://b/checkpoints/checkpoint-2, where a restart resumes"
    )
    error.add_note(kept)
    line, _ = report_failure(error, keep_in(tmp_path))
    assert len(line) <= MAX_LINE, len(line)
    assert line.startswith("rank 1 of 2 (node 0, local rank 0) failed: ConnectionError: 403 POST")
    assert line.endswith(f"…; {kept}"), line
    assert "HTTPStatus" in (tmp_path / "traceback.txt").read_text()  # the whole of it is kept
    assert capsys.readouterr().err.endswith(f"\nerror: {line}\n")


def test_a_traceback_is_kept_in_the_output_dir_and_beside_gs_checkpoints(
    gcs, tmp_path, monkeypatch
):
    """In training, the traceback goes to OUTPUT_DIR/logs/, and beside the checkpoints when
    they are in Cloud Storage (a node's disk goes with the job): the line names the copy.
    A copy that cannot be made leaves the line naming the local file."""
    monkeypatch.setenv("RANK", "3")
    monkeypatch.chdir(tmp_path)
    hardware = Hardware(gpu_count=0, gpu_name=None, compute_capability=None, cpu_count=2)
    argv = ["--task", "speech-recognition", "--model_name_or_path", "org/model",
            "--dataset_name", "org/data", "--output_dir", str(tmp_path / "out"),
            "--checkpoint_dir", "gs://test-bucket/traceback-run/checkpoints"]  # fmt: skip
    config = resolve_run(argv, {}, hardware)
    try:
        raise KeyError("a missing column")
    except KeyError as raised:
        error = raised

    where = keep_traceback(error, config)
    assert where == "gs://test-bucket/traceback-run/checkpoints/debug/traceback-rank3.txt"
    copy = open_store("gs://test-bucket/traceback-run/checkpoints/debug").read_text(
        "traceback-rank3.txt"
    )
    local = (tmp_path / "out" / "logs" / "traceback-rank3.txt").read_text()
    assert copy == local and "KeyError: 'a missing column'" in local

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")  # nothing listens
    from trainer.storage import store as storage

    storage._process_client.cache_clear()
    monkeypatch.setattr("trainer.training.tracebacks.UPLOAD_SECONDS", 3.0)
    assert keep_traceback(error, config) == str(tmp_path / "out" / "logs" / "traceback-rank3.txt")
