"""A ZeRO checkpoint resumed by another number of processes: converted, then resumed.

DeepSpeed's ZeRO keeps the optimizer state in one file per data-parallel rank
(`global_stepN/zero_pp_rank_R_mp_rank_00_optim_states.pt`) and cannot load it into another
count: it would fail the same way on every restart. Its universal checkpoint
(`deepspeed.checkpoint.ds_to_universal`) holds each parameter's state whole and loads into any
count with `"checkpoint": {"load_universal": true}` in the engine's config. So the count is
read from the shards before training; on a mismatch each node's local main process converts its
node's copy while the others wait, and every process resumes it with `load_universal` set.

The copy lives in `<output_dir>/.universal/checkpoint-N`, never in the original: its Trainer
files (state, RNG, processor, weights) are hard links to the original's,
`global_stepN_universal` and `latest_universal` the converter's output. Nothing uploads or
rotates it (they handle `checkpoint-*` folders only), and this run's first save is an ordinary
one, in its own count. The folder holds one conversion: a restart needing the same one finds it
complete (the converter writes `latest_universal` last) and reuses it; any other replaces it.

The converter (DeepSpeed 0.19) runs with `inject_missing_state`, as a Hugging Face model never
records `universal_checkpoint_info` (the engine saves it only for DeepSpeed's own tensor- or
expert-parallel models), and with one worker each for extraction and merging, which keeps it in
this process (its `ProcessPoolExecutor` would fork a training process that holds a process
group). A checkpoint it cannot read ends the run with one line naming the process count it
needs.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import time
from argparse import Namespace
from pathlib import Path

from trainer.common.errors import UserError
from trainer.storage.failure_kinds import disk_full, disk_line
from trainer.training.distributed import ProcessPlace
from trainer.training.failures import RunFailed

ZERO_SHARD = re.compile(r"^(?:bf16_|fp16_)?zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt$")
UNIVERSAL_DIRNAME = ".universal"
LATEST = "latest"
LATEST_UNIVERSAL = "latest_universal"


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


def needs_conversion(checkpoint: Path, world_size: int, deepspeed_config) -> int | None:
    """The count that saved this checkpoint when it must be converted to resume with
    `world_size` processes; None when it loads as it is (the same count, no ZeRO shards,
    no DeepSpeed, or already universal and the config asks for that)."""
    if deepspeed_config is None:
        return None
    saved = saved_world_size(checkpoint)
    if saved is None or saved == world_size:
        return None
    if (checkpoint / LATEST_UNIVERSAL).is_file() and loads_universal(deepspeed_config):
        return None
    return saved


def resume_with_world_size(checkpoint: Path, args, place: ProcessPlace) -> Path:
    """The checkpoint this run's processes resume: `checkpoint`, or, when another count saved it,
    its universal conversion (made once per node), the engine's DeepSpeed config told to load
    it (`args.hf_deepspeed_config` is the dict accelerate gives `deepspeed.initialize`)."""
    saved = needs_conversion(checkpoint, args.world_size, args.deepspeed)
    if saved is None:
        return checkpoint
    converted = Path(args.output_dir) / UNIVERSAL_DIRNAME / checkpoint.name
    started = time.monotonic()
    with args.main_process_first(local=True, desc="converting to a universal checkpoint"):
        if place.is_local_main:
            convert_to_universal(checkpoint, converted, saved, args.world_size)
    args.hf_deepspeed_config.config.setdefault("checkpoint", {})["load_universal"] = True
    if place.is_global_main:
        print(
            f"{checkpoint.name} was saved by {saved} processes: converted to DeepSpeed's "
            f"universal checkpoint ({time.monotonic() - started:.1f} s, {converted}), "
            f"resuming with {args.world_size}",
            flush=True,
        )
    return converted


def convert_to_universal(checkpoint: Path, converted: Path, saved: int, world_size: int) -> None:
    """`checkpoint`'s universal copy at `converted`, unless a complete one is there; the
    original is only read. A full disk is one line naming it (`RunFailed`)."""
    if (converted / LATEST_UNIVERSAL).is_file():
        return
    try:
        _convert(checkpoint, converted, saved, world_size)
    except OSError as error:
        if disk_full(error):
            shutil.rmtree(converted.parent, ignore_errors=True)  # the space back, for training
            writing = f"converting {checkpoint.name} to DeepSpeed's universal checkpoint"
            raise RunFailed(disk_line(converted.parent, writing)) from error
        raise  # an unreadable file: what a restart may not meet again


def _convert(checkpoint: Path, converted: Path, saved: int, world_size: int) -> None:
    shutil.rmtree(converted.parent, ignore_errors=True)  # an older or partial conversion
    tag = step_folder(checkpoint)
    shutil.copytree(
        checkpoint,
        converted,
        copy_function=link_or_copy,
        ignore=lambda folder, names: trainer_files_only(checkpoint, folder, names),
    )
    options = Namespace(
        input_folder=str(checkpoint / tag),
        output_folder=str(converted / f"{tag}_universal"),
        num_extract_workers=1,
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        inject_missing_state=True,
    )
    # imported here: a run without DeepSpeed, or with a matching count, skips its import
    from deepspeed.checkpoint.ds_to_universal import main as ds_to_universal

    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            ds_to_universal(options)
    except OSError:
        raise  # the caller's to say
    except Exception as error:
        raise UserError(
            f"{checkpoint.name} holds DeepSpeed ZeRO optimizer state split over {saved} "
            f"processes, and this run has {world_size}; converting it to DeepSpeed's "
            f"universal checkpoint failed ({type(error).__name__}: {error}). Restart with "
            f"{saved} processes in all (nodes x --nproc_per_node), or start afresh with "
            "--resume never."
        ) from error


def step_folder(checkpoint: Path) -> str:
    """The step folder DeepSpeed's `latest` names (`global_stepN`)."""
    latest = checkpoint / LATEST
    if latest.is_file():
        return latest.read_text().strip()
    return f"global_step{checkpoint.name.removeprefix('checkpoint-')}"


def trainer_files_only(checkpoint: Path, folder: str, names: list[str]) -> list[str]:
    """What the converted copy leaves out of the original: DeepSpeed's own step folders
    and `latest`, which the converted step folder and `latest_universal` replace."""
    if Path(folder) != checkpoint:
        return []
    return [name for name in names if name.startswith("global_step") or name == LATEST]


def link_or_copy(source: str, destination: str) -> None:
    """A hard link (instant, no space), or a copy where the two are on different disks."""
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)
