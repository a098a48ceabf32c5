"""A ZeRO checkpoint's process count, read from its optimizer shards, against the run's; a
checkpoint saved by another count, converted to DeepSpeed's universal form (in this
process, on made-up shards). Real runs resumed with another count:
tests/processes/test_world_size_runs.py and tests/processes/test_faults.py."""

from __future__ import annotations

import json

import pytest

from tests.support.checkpoint_files import contents
from tests.support.helpers import small_disk
from trainer.common.errors import UserError
from trainer.training.failures import RunFailed
from trainer.training.world_size import (
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
