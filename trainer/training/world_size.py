"""A ZeRO checkpoint resumed by another number of processes.

DeepSpeed's ZeRO splits the optimizer state into one file per data-parallel rank
(`global_stepN/zero_pp_rank_R_mp_rank_00_optim_states.pt`) and cannot load it into another
count: it fails the same way on every restart. So the count is read from the files before
training, and a mismatch is one line that says which count the checkpoint needs. A
checkpoint converted to DeepSpeed's universal form (`latest_universal` beside the step
folders) loads into any count when the DeepSpeed config says `"checkpoint":
{"load_universal": true}`, and is let through.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from trainer.common.errors import UserError

ZERO_SHARD = re.compile(r"^(?:bf16_|fp16_)?zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt$")


def saved_world_size(checkpoint: Path) -> int | None:
    """How many processes saved this ZeRO checkpoint (its optimizer shards), or None
    when it has none (not DeepSpeed, or DeepSpeed without a partitioned optimizer)."""
    ranks = {
        int(match.group(1))
        for path in checkpoint.glob("global_step*/*")
        if (match := ZERO_SHARD.match(path.name))
    }
    return len(ranks) or None


def loads_universal(deepspeed_config: str | dict | None) -> bool:
    """Whether the DeepSpeed config asks for a universal checkpoint."""
    config = deepspeed_config
    if isinstance(config, str):
        config = json.loads(Path(config).read_text())
    return bool((config or {}).get("checkpoint", {}).get("load_universal"))


def check_world_size(checkpoint: Path, world_size: int, deepspeed_config) -> None:
    """Refuse, before training, a ZeRO checkpoint saved by another number of processes."""
    if deepspeed_config is None:
        return
    saved = saved_world_size(checkpoint)
    if saved is None or saved == world_size:
        return
    if (checkpoint / "latest_universal").is_file() and loads_universal(deepspeed_config):
        return
    step = checkpoint.name.removeprefix("checkpoint-")
    raise UserError(
        f"{checkpoint.name} holds DeepSpeed ZeRO optimizer state split over {saved} "
        f"processes, and this run has {world_size}: DeepSpeed cannot load it into another "
        f"count. Restart with {saved} processes in all (nodes x --nproc_per_node), or "
        "convert it to DeepSpeed's universal checkpoint (python -m "
        f"deepspeed.checkpoint.ds_to_universal --input_folder {checkpoint}/global_step{step} "
        f"--output_folder {checkpoint}/global_step{step}_universal) and resume it with "
        f'--resume {checkpoint} and "checkpoint": {{"load_universal": true}} in the '
        "--deepspeed config, or start afresh with --resume never."
    )
