"""A ZeRO checkpoint's process count, read from its optimizer shards, against the run's; a
checkpoint saved by another count, converted to DeepSpeed's universal form and resumed."""

from __future__ import annotations

import hashlib
import json
import re
import time
import uuid

import pytest

from tests.support.gcs_emulator import BUCKET
from tests.support.helpers import (
    DEMO_SPEECH_FLAGS,
    assert_manifest_matches_store,
    finish_all,
    run_trainer,
    small_disk,
    start_nodes,
    trainer_env,
    vertex_outputs,
)
from trainer.common.errors import UserError
from trainer.storage.checkpoints import complete_checkpoints
from trainer.storage.store import open_store
from trainer.training.failures import RunFailed
from trainer.training.world_size import (
    ZERO_SHARD,
    convert_to_universal,
    needs_conversion,
    saved_world_size,
)

ZERO2 = {"zero_optimization": {"stage": 2}}


def zero_checkpoint(root, ranks: int, prefix: str = ""):
    checkpoint = root / "checkpoint-4"
    step = checkpoint / "global_step4"
    step.mkdir(parents=True)
    (step / "mp_rank_00_model_states.pt").write_bytes(b"m")
    for rank in range(ranks):
        (step / f"{prefix}zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").write_bytes(b"o")
    (checkpoint / "latest").write_text("global_step4")
    (checkpoint / "trainer_state.json").write_text('{"global_step": 4}')
    return checkpoint


def contents(folder) -> dict[str, str]:
    """Every file under `folder`, relative path -> SHA-256."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


@pytest.mark.parametrize("prefix", ["", "bf16_"])
def test_the_count_is_that_of_the_optimizer_shards(tmp_path, prefix):
    assert saved_world_size(zero_checkpoint(tmp_path, 3, prefix)) == 3


def test_a_checkpoint_without_shards_has_no_count(tmp_path):
    (tmp_path / "checkpoint-4").mkdir()
    assert saved_world_size(tmp_path / "checkpoint-4") is None


def test_only_another_count_under_deepspeed_needs_a_conversion(tmp_path):
    checkpoint = zero_checkpoint(tmp_path, 2)
    assert needs_conversion(checkpoint, 2, ZERO2) is None  # the same count
    assert needs_conversion(checkpoint, 1, None) is None  # not DeepSpeed: no shards read
    assert needs_conversion(checkpoint, 1, ZERO2) == 2


def test_a_universal_checkpoint_loads_into_any_count_when_the_config_asks(tmp_path):
    checkpoint = zero_checkpoint(tmp_path, 2)
    (checkpoint / "latest_universal").write_text("global_step4_universal")
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"checkpoint": {"load_universal": True}}))
    assert needs_conversion(checkpoint, 4, str(config)) is None
    assert needs_conversion(checkpoint, 4, ZERO2) == 2


def test_a_full_disk_while_converting_names_the_disk_and_gives_its_space_back(tmp_path):
    """The conversion copies the Trainer's files where hard links cannot go (another
    disk): a disk too small for them is one line naming it, and the partial copy is gone."""
    checkpoint = zero_checkpoint(tmp_path / "saved", 2)
    (checkpoint / "model.safetensors").write_bytes(b"w" * 3 * 2**20)
    before = contents(checkpoint)
    with small_disk(tmp_path / "out", 2) as out:
        with pytest.raises(RunFailed) as failed:
            convert_to_universal(checkpoint, out / ".universal" / "checkpoint-4", 2, 1)
        message = str(failed.value)
        assert message.startswith(f"no space left on the disk mounted at {out} ("), message
        assert message.endswith(
            "while converting checkpoint-4 to DeepSpeed's universal checkpoint to "
            f"{out / '.universal'}"
        ), message
        assert not (out / ".universal").exists(), "the partial copy was left on the disk"
    assert contents(checkpoint) == before, "the original was changed"


def test_an_unconvertible_checkpoint_is_one_line_naming_the_count_it_needs(tmp_path):
    checkpoint = zero_checkpoint(tmp_path / "saved", 2)  # its shards are not torch files
    before = contents(checkpoint)
    converted = tmp_path / "out" / ".universal" / "checkpoint-4"
    with pytest.raises(UserError) as refused:
        convert_to_universal(checkpoint, converted, 2, 1)
    message = str(refused.value)
    assert message.startswith(
        "checkpoint-4 holds DeepSpeed ZeRO optimizer state split over 2 processes, and this "
        "run has 1; converting it to DeepSpeed's universal checkpoint failed ("
    ), message
    assert message.endswith(
        "Restart with 2 processes in all (nodes x --nproc_per_node), or start afresh with "
        "--resume never."
    ), message
    assert "\n" not in message
    assert contents(checkpoint) == before, "the original was changed"
    # the copy holds the Trainer's files, not DeepSpeed's step folder or `latest`
    assert contents(converted) == {"trainer_state.json": before["trainer_state.json"]}


def test_a_complete_conversion_is_reused_and_an_incomplete_one_redone(tmp_path):
    checkpoint = zero_checkpoint(tmp_path / "saved", 2)
    converted = tmp_path / "out" / ".universal" / "checkpoint-4"
    converted.mkdir(parents=True)
    (converted / "latest_universal").write_text("global_step4_universal")
    convert_to_universal(checkpoint, converted, 2, 1)  # complete: nothing to do
    assert contents(converted) == {"latest_universal": contents(converted)["latest_universal"]}
    (converted / "latest_universal").unlink()  # a conversion cut short
    (converted.parent / "checkpoint-2").mkdir()  # an older one
    with pytest.raises(UserError):
        convert_to_universal(checkpoint, converted, 2, 1)
    assert sorted(p.name for p in converted.parent.iterdir()) == ["checkpoint-4"]


@pytest.mark.slow
def test_a_zero2_checkpoint_of_two_processes_resumes_with_one(tmp_path, demo_cache):
    """Two processes train 2 steps and save; one process resumes that checkpoint (another
    output directory) and trains steps 3 and 4 from the converted universal copy."""
    short = [
        "--deepspeed", "zero2", "--per_device_train_batch_size", "4", "--logging_steps", "1",
        "--eval_strategy", "no", "--eval_on_start", "false",
    ]  # fmt: skip
    started = time.monotonic()
    two = ["--nproc_per_node", "2", "--max_steps", "2", "--save_steps", "2"]  # fmt: skip
    code, output = run_trainer(
        [*two, *short, "--output_dir", "saved"],
        cwd=tmp_path,
        env=trainer_env(demo_cache),
    )
    assert code == 0, output[-3000:]
    original = tmp_path / "saved" / "checkpoint-2"
    assert saved_world_size(original) == 2
    before = contents(original)
    saved_at = time.monotonic()

    one = ["--nproc_per_node", "1", "--max_steps", "4", "--save_steps", "4"]  # fmt: skip
    code, output = run_trainer(
        [*one, *short, "--resume", str(original), "--output_dir", "resumed"],
        cwd=tmp_path,
        env=trainer_env(demo_cache),
    )
    assert code == 0, output[-3000:]
    print(
        f"two processes, 2 steps: {saved_at - started:.1f} s; "
        f"one process, converted and 2 more: {time.monotonic() - saved_at:.1f} s"
    )
    assert re.search(
        r"checkpoint-2 was saved by 2 processes: converted to DeepSpeed's universal "
        r"checkpoint \([\d.]+ s, .*\), resuming with 1",
        output,
    ), output[-3000:]
    steps = [int(step) for step in re.findall(r"^step (\d+)/4 ", output, re.MULTILINE)]
    assert steps == [3, 4], output[-3000:]  # from the checkpoint's step, not from 0
    resumed = tmp_path / "resumed" / "checkpoint-4"
    assert json.loads((resumed / "trainer_state.json").read_text())["global_step"] == 4
    assert saved_world_size(resumed) == 1
    assert (tmp_path / "resumed" / "model" / "model.safetensors").is_file()
    assert contents(original) == before, "the original checkpoint was changed"


@pytest.mark.slow
def test_a_job_with_more_processes_converts_on_every_node_and_resumes(tmp_path, spoken_assets, gcs):
    """Vertex AI's case: a job of 2 nodes x 1 process saves step 2 to Cloud Storage; a job
    of 2 nodes x 2 processes on fresh machines, same output location, resumes it by
    itself: each node downloads the checkpoint and converts its own copy."""
    base = f"gs://{BUCKET}/{uuid.uuid4().hex}/job"
    env = {"STORAGE_EMULATOR_HOST": gcs, **vertex_outputs(base)}
    run = [*DEMO_SPEECH_FLAGS, "--deepspeed", "zero2", "--per_device_train_batch_size", "4",
           "--logging_steps", "1", "--eval_strategy", "no", "--output_dir", "out"]  # fmt: skip
    assets = spoken_assets.model_dir, spoken_assets.dataset_dir
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


def saved_world_size_of_store(checkpoint) -> int:
    """The process count of a stored checkpoint, from its optimizer shards' names."""
    return len([path for path in checkpoint.list_files() if ZERO_SHARD.match(path.split("/")[-1])])
