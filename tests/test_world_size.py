"""A ZeRO checkpoint's process count, read from its optimizer shards, against the run's."""

from __future__ import annotations

import json

import pytest

from trainer.common.errors import UserError
from trainer.training.world_size import check_world_size, saved_world_size


def zero_checkpoint(root, ranks: int, prefix: str = ""):
    step = root / "checkpoint-4" / "global_step4"
    step.mkdir(parents=True)
    (step / "mp_rank_00_model_states.pt").write_bytes(b"m")
    for rank in range(ranks):
        (step / f"{prefix}zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").write_bytes(b"o")
    return root / "checkpoint-4"


@pytest.mark.parametrize("prefix", ["", "bf16_"])
def test_the_count_is_that_of_the_optimizer_shards(tmp_path, prefix):
    assert saved_world_size(zero_checkpoint(tmp_path, 3, prefix)) == 3


def test_a_checkpoint_without_shards_has_no_count(tmp_path):
    (tmp_path / "checkpoint-4").mkdir()
    assert saved_world_size(tmp_path / "checkpoint-4") is None


def test_another_count_is_one_line_naming_the_count_it_needs(tmp_path):
    checkpoint = zero_checkpoint(tmp_path, 2)
    check_world_size(checkpoint, 2, {"zero_optimization": {"stage": 2}})  # the same: fine
    check_world_size(checkpoint, 1, None)  # not DeepSpeed: the Trainer reads no shards
    with pytest.raises(UserError) as refused:
        check_world_size(checkpoint, 1, {"zero_optimization": {"stage": 2}})
    message = str(refused.value)
    assert message.startswith(
        "checkpoint-4 holds DeepSpeed ZeRO optimizer state split over 2 processes, and this "
        "run has 1: DeepSpeed cannot load it into another count. Restart with 2 processes "
        "in all (nodes x --nproc_per_node)"
    ), message
    assert (
        f"python -m deepspeed.checkpoint.ds_to_universal --input_folder {checkpoint}/"
        f"global_step4 --output_folder {checkpoint}/global_step4_universal" in message
    )


def test_a_universal_checkpoint_loads_into_any_count_when_the_config_asks(tmp_path):
    checkpoint = zero_checkpoint(tmp_path, 2)
    (checkpoint / "latest_universal").write_text("global_step4_universal")
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"checkpoint": {"load_universal": True}}))
    check_world_size(checkpoint, 4, str(config))
    with pytest.raises(UserError):
        check_world_size(checkpoint, 4, {"zero_optimization": {"stage": 2}})
