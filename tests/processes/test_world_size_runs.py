"""A Vertex AI job restarted with more processes than saved its ZeRO checkpoint: every node
converts its own copy to DeepSpeed's universal form and the job resumes. (Fewer processes,
and the original left unchanged: tests/processes/test_faults.py; the conversion itself on
made-up shards: tests/unit/test_world_size.py.)"""

from __future__ import annotations

import re
import uuid

import pytest

from tests.support.checkpoint_files import saved_world_size_of_store
from tests.support.gcs_emulator import BUCKET
from tests.support.helpers import (
    DEMO_SPEECH_FLAGS,
    assert_manifest_matches_store,
    finish_all,
    start_nodes,
    vertex_outputs,
)
from trainer.storage.checkpoints import complete_checkpoints
from trainer.storage.store import open_store

pytestmark = pytest.mark.slow


def test_a_job_with_more_processes_converts_on_every_node_and_resumes(tmp_path, demo_assets, gcs):
    """Vertex AI's case: a job of 2 nodes x 1 process saves step 2 to Cloud Storage; a job
    of 2 nodes x 2 processes on fresh machines, same output location, resumes it by
    itself: each node downloads the checkpoint and converts its own copy."""
    base = f"gs://{BUCKET}/{uuid.uuid4().hex}/job"
    env = {"STORAGE_EMULATOR_HOST": gcs, **vertex_outputs(base)}
    run = [*DEMO_SPEECH_FLAGS, "--deepspeed", "zero2", "--per_device_train_batch_size", "4",
           "--logging_steps", "1", "--eval_strategy", "no", "--output_dir", "out"]  # fmt: skip
    assets = demo_assets.model_dir, demo_assets.dataset_dir
    finish_all(start_nodes(tmp_path / "first", *assets,
                           [*run, "--max_steps", "2", "--save_steps", "2"], **env))  # fmt: skip
    store = open_store(env["AIP_CHECKPOINT_DIR"])
    saved = store.child("checkpoint-2").list_files()

    outputs = finish_all(start_nodes(tmp_path / "second", *assets,
                                     [*run, "--max_steps", "4", "--save_steps", "4",
                                      "--nproc_per_node", "2"], **env))  # fmt: skip
    assert re.search(
        r"checkpoint-2 was saved by 2 processes: converted to DeepSpeed's universal "
        r"checkpoint \([\d.]+ s, out/.universal/checkpoint-2\), resuming with 4",
        outputs[0],
    ), outputs[0][-3000:]
    steps = [int(step) for step in re.findall(r"^step (\d+)/4 ", outputs[0], re.MULTILINE)]
    assert steps == [3, 4], outputs[0][-3000:]
    for node in ("node0", "node1"):  # each node converted its own download
        converted = tmp_path / "second" / node / "out" / ".universal" / "checkpoint-2"
        assert (converted / "latest_universal").read_text() == "global_step2_universal"
    # the stored original is as it was, and the conversion was not uploaded
    assert store.child("checkpoint-2").list_files() == saved
    assert complete_checkpoints(store) == ["checkpoint-2", "checkpoint-4"]
    assert_manifest_matches_store(store.child("checkpoint-4"))
    assert saved_world_size_of_store(store.child("checkpoint-4")) == 4
