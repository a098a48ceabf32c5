"""Every ending and warning is one line of at most 300 characters that still says what failed
and what to do, however long the locations: each composed here with Vertex AI's own (a
`baseOutputDirectory` with the job's timestamp, its `checkpoints/` and `model/`) and the
inputs that made it long in a replay of injected faults (a storage error's JSON body, a full
disk's path named again, a restart quoting the line before it, three full clip paths). The
faults themselves, in the real trainer: tests/processes/test_faults.py."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from google.api_core.exceptions import Forbidden

from tests.support.gcs_emulator import BUCKET
from trainer.common.handoff import RUN_CONFIG_VARIABLE
from trainer.storage.checkpoints import write_manifest
from trainer.storage.store import open_store
from trainer.training.failures import MAX_LINE

STAMP = "aiplatform-custom-training-2026-11-28-12:00:00.000"
"""A Vertex AI custom job's output folder, as the console names it."""
NEWEST = "checkpoint-1200"
BODY = (
    '{"error": {"code": 403, "message": "vertex-sa@my-project.iam.gserviceaccount.com does '
    'not have storage.objects.create access to the Google Cloud Storage object."}}'
)


def vertex_outputs(job: int) -> tuple[str, str]:
    """A job's checkpoints (80 characters) and model location in the emulator's bucket, the
    checkpoints holding a complete `NEWEST` (`job`: a test's own, in the stamp's last digits)."""
    base = f"gs://{BUCKET}/{STAMP[:-3]}{job:03d}"
    checkpoints, model = f"{base}/checkpoints/", f"{base}/model/"
    write_manifest(open_store(checkpoints).child(NEWEST), {"files": []})
    return checkpoints, model


def what_is_kept(checkpoints: str):
    from trainer.training.kept import WhatIsKept

    return WhatIsKept(None, checkpoints, grace=8, node=0, failure_wait=0)


def test_a_refused_model_upload_fits_300_characters(gcs):
    """368 characters in the replay: the model's location and the checkpoints' both in full,
    and the storage error's JSON body. The model's `model/` is named beside the checkpoints,
    whose location the end names."""
    from trainer.training.delivery import upload_failed

    checkpoints, model = vertex_outputs(1)
    refused = Forbidden(f"POST https://storage.googleapis.com/upload/storage/v1/b/{BUCKET}/o?"
                        f"uploadType=multipart: {BODY}")  # fmt: skip
    line = str(what_is_kept(checkpoints).failed(upload_failed(model, checkpoints, refused)))
    assert line.startswith("uploading the final model to model/ beside the checkpoints failed "
                           "(Forbidden: 403 "), line  # fmt: skip
    assert line.endswith(
        f"): incomplete there (no manifest.json); the newest complete checkpoint is "
        f"{checkpoints}{NEWEST}, where a restart resumes"
    ), line
    assert len(line) <= MAX_LINE, len(line)

    # --model_dir elsewhere: named in full (two long locations may pass 300 characters)
    elsewhere = f"gs://{BUCKET}/models/whisper-small/"
    line = str(what_is_kept(checkpoints).failed(upload_failed(elsewhere, checkpoints, refused)))
    assert line.startswith(f"uploading the final model to {elsewhere} failed (Forbidden: 403 ")
    assert len(line) <= MAX_LINE, len(line)


def test_a_full_disk_at_a_save_fits_300_characters(gcs, tmp_path, monkeypatch):
    """381 characters in the replay: the error after the disk's line named the path again."""
    from trainer.training.keep_work import SaveFailed

    checkpoints, _ = vertex_outputs(2)
    monkeypatch.chdir(tmp_path)
    saved = Path("out", NEWEST.replace("1200", "1300"))
    full = OSError(errno.ENOSPC, "No space left on device", str(saved / "model.safetensors"))
    line = str(what_is_kept(checkpoints).failed(SaveFailed(saved, full)))
    assert line.startswith("no space left on the disk mounted at "), line
    assert f"while writing checkpoint-1300 to {saved}; the newest complete checkpoint is " \
           f"{checkpoints}{NEWEST}, where a restart resumes" in line, line  # fmt: skip
    assert len(line) <= MAX_LINE, len(line)


def test_the_restarts_refusal_to_repeat_a_failure_fits_300_characters(gcs):
    """647 characters in the replay: the earlier attempt's whole line, then why nothing
    starts. The earlier line's end about the checkpoint is said anew, and what is left of it
    is cut to the room the rest leaves."""
    from trainer.storage.run_records import RunIdentity, how_it_ended, record_failure, records_store

    checkpoints, _ = vertex_outputs(3)
    identity = RunIdentity("4412873645738139648", "12")
    earlier = ("the evaluation at step 1200 failed (ValueError: the metric's backend raised "
               f"on a batch of {'very ' * 30}long transcripts); the newest complete checkpoint "
               f"is {checkpoints}{NEWEST}, where a restart resumes")  # fmt: skip
    record_failure(checkpoints, identity, 0, earlier, 1)
    ended = how_it_ended(checkpoints, records_store(checkpoints), identity)
    assert ended is not None and ended.exit_code == 1
    line = ended.line
    assert line.startswith("error: the evaluation at step 1200 failed (ValueError: "), line
    assert line.endswith(
        f" [so ended an earlier attempt of this job (job {identity.job}, trial 12), with "
        f"{NEWEST}, still the newest complete one: nothing was started; fix the cause in a "
        "new job (--resume_from_output_dir continues this run)]"
    ), line
    assert len(line.removeprefix("error: ")) <= MAX_LINE, len(line)


def test_the_line_of_a_rank_stopped_by_another_nodes_failure_fits_300_characters(
    monkeypatch, tmp_path
):
    """315 characters in the replay: the echo (the broken collective's error) took what the
    end needs; now it keeps its type and what room is left."""
    from trainer.training.failures import report_failure

    place = {"RANK": "0", "WORLD_SIZE": "16", "GROUP_RANK": "0", "LOCAL_RANK": "0"}
    for name, value in place.items():
        monkeypatch.setenv(name, value)
    echo = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection "
                        "closed by peer [10.128.0.7]:29500")  # fmt: skip
    echo.add_note(f"the newest complete checkpoint is gs://{BUCKET}/{STAMP}/checkpoints/"
                  "checkpoint-12000, where a restart resumes")  # fmt: skip
    line, _ = report_failure(echo, lambda error: None, sleep=lambda seconds: None)
    assert line.startswith("rank 0 of 16 (node 0, local rank 0) stopped: another node's "
                           "process or machine failed (RuntimeError: ["), line  # fmt: skip
    assert line.endswith(f"); that node's log says why; {echo.__notes__[0]}"), line
    assert len(line) <= MAX_LINE, len(line)


@pytest.fixture
def handed_over(gcs, monkeypatch):
    """The configuration the launcher hands the node's agent, checkpoints in Vertex AI's
    location; returns it."""
    from trainer.config.resolve import resolve_run
    from trainer.settings.run_config import Hardware

    checkpoints, model = vertex_outputs(4)
    hardware = Hardware(gpu_count=0, gpu_name=None, compute_capability=None, cpu_count=2)
    argv = ["--task", "speech-recognition", "--model_name_or_path", "org/model",
            "--dataset_name", "org/data", "--checkpoint_dir", checkpoints,
            "--model_dir", model]  # fmt: skip
    config = resolve_run(argv, {}, hardware)
    monkeypatch.setenv(RUN_CONFIG_VARIABLE, config.to_json())
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "13")
    return checkpoints


def test_the_node_agents_lines_after_a_sigterm_fit_300_characters(handed_over):
    """A SIGTERM torchrun passed on: during the start-up (the checkpoint's conversion), or
    during a step longer than torchrun waits (307 characters in the replay)."""
    from trainer.launcher.accelerate_launch import not_training_yet, unsaved_stop

    kept = f"; the newest complete checkpoint is {handed_over}{NEWEST}, where a restart resumes"
    line = not_training_yet()
    assert line == ("SIGTERM on node 0 before its training processes began training: nothing "
                    f"new was trained{kept}")  # fmt: skip
    assert len(line) <= MAX_LINE, len(line)
    line = unsaved_stop()
    assert line == ("SIGTERM on node 0: torchrun killed the training processes after its wait "
                    "(13 s: --stop_grace_seconds + 5), before they saved the step in flight"
                    f"{kept}")  # fmt: skip
    assert len(line) <= MAX_LINE, len(line)


CLIPS = "/gcs/my-project-datasets/common-voice/cv-corpus-21.0-2025-03-14/en/clips"


def test_the_warnings_of_skipped_clips_fit_300_characters(capsys):
    """377 characters in the replay: three full paths of clips. Their folder is named once."""
    from datasets import Dataset

    from trainer.data.bad_examples import StreamSkips, screen

    paths = [f"{CLIPS}/common_voice_en_{41000000 + n}.mp3" for n in range(8)]
    clips = Dataset.from_dict({"audio": [{"path": path, "bytes": None} for path in paths]})
    bad = set(paths[1:6])
    where = "split train of /gcs/my-project-datasets/common-voice/cv-corpus-21.0-2025-03-14/en"
    kept, _ = screen(clips, "audio", lambda value: None if value["path"] in bad else 1.0,
                     where, "70%", None, "clips", training=False)  # fmt: skip
    assert len(kept) == 3
    line = capsys.readouterr().out.strip()
    assert line.startswith(
        f"warning: skipped 5 of 8 clips in {where} that could not be decoded (first: "
        "common_voice_en_41000001.mp3, common_voice_en_41000002.mp3, common_voice_en_41000003"
        ".mp3, ... in …"  # the folder's start, which `where` names, is cut
    ), line
    assert line.endswith("-2025-03-14/en/clips/); --max_bad_examples 70% allows 5"), line
    assert len(line.removeprefix("warning: ")) <= MAX_LINE, len(line)

    skips = StreamSkips("1%", f"split train of {CLIPS.rpartition('/')[0]}", rows=100_000)
    skips.trained(60, sorted(bad))
    assert skips.agree(lambda mine: mine)
    line = skips.first_warning()
    assert "common_voice_en_41000003.mp3, ... in " in line and "/en/clips/; --max_bad" in line
    assert len(line.removeprefix("warning: ")) <= MAX_LINE, len(line)
