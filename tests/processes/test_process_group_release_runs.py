"""The training processes' process group on CPU: one distributed state for all of them
(trainer.training.distributed.use_gloo_on_cpu), in two processes started by
torch.distributed.run (its release in one process: tests/unit/test_process_group_release.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.helpers import REPO_ROOT, free_port

PROCESS_GROUP_STATE = """
import os, sys
from accelerate import PartialState
from trainer.training.distributed import use_gloo_on_cpu
use_gloo_on_cpu(60, deepspeed=sys.argv[1] == "deepspeed")
state = PartialState()
with open(f"state-{os.environ['RANK']}.txt", "w") as out:  # ranks' prints may interleave
    out.write(f"{state.distributed_type} {state.num_processes}")
"""


@pytest.mark.parametrize(
    ("engine", "expected"),
    [("ddp", "DistributedType.MULTI_CPU 2"), ("deepspeed", "DistributedType.DEEPSPEED 2")],
)
def test_two_cpu_processes_share_one_distributed_state(engine, expected, tmp_path):
    """Without DeepSpeed, the CPU state must be a distributed one (MULTI_CPU), or the Trainer
    never wraps the model in DDP and each rank trains alone; with DeepSpeed, DeepSpeed's."""
    script = tmp_path / "state.py"
    script.write_text(PROCESS_GROUP_STATE)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT),
           "DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": ""}  # fmt: skip
    if engine == "deepspeed":
        env["ACCELERATE_USE_DEEPSPEED"] = "true"  # what accelerate launch sets for DeepSpeed
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         "--master_port", str(free_port()), str(script), engine],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    states = [(tmp_path / f"state-{rank}.txt").read_text() for rank in (0, 1)]
    assert states == [expected, expected]
