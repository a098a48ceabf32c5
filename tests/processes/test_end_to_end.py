"""A real multi-node run through `python -m trainer`: real processes, real rendezvous, real
DeepSpeed.

Two launchers start as two Vertex AI nodes would; each runs `accelerate launch`, which
forks the training process from the node's zygote; they meet over 127.0.0.1 with gloo, train
a tiny Whisper with DeepSpeed ZeRO-3 on CPU, evaluate WER, save checkpoints and the final
model. (The two-process ZeRO-2 run of the demo as shipped is
tests/processes/test_demo_run.py.)
"""

from __future__ import annotations

import re

import pytest

from tests.support.helpers import DEMO_SPEECH_FLAGS, start_nodes
from tests.support.speech_run_checks import (
    assert_trained_model_reloads_and_generates,
    rank_reports,
)

pytestmark = pytest.mark.slow

SHORT_RUN = [
    "--max_steps", "4",
    "--eval_steps", "4",
    "--save_steps", "4",
    "--logging_steps", "2",
    "--per_device_train_batch_size", "4",
    "--per_device_eval_batch_size", "6",
    "--max_eval_samples", "6",
]  # fmt: skip


def test_two_nodes_on_one_machine_with_zero3(tmp_path, demo_assets):
    """Two launchers with Vertex-style CLUSTER_SPECs, sharing no directory, meet and train
    (the demo's tiny Whisper on the tone clips: what is tested is the nodes, not learning).

    Log-mel features are computed by the training processes (as on GPU nodes), so that path
    runs under DeepSpeed too."""
    nodes = start_nodes(tmp_path, demo_assets.model_dir, demo_assets.dataset_dir,
                        [*DEMO_SPEECH_FLAGS, "--deepspeed", "zero3", *SHORT_RUN,
                         "--log_mel_on", "device", "--output_dir", "out"])  # fmt: skip
    outputs = []
    for rank, node in enumerate(nodes):
        code, output = node.finish(timeout=600)
        outputs.append(output)
        assert code == 0, f"node {rank} failed:\n{output[-3000:]}"

    chief, worker = (rank_reports(output) for output in outputs)
    assert chief.keys() == {0} and worker.keys() == {1}
    assert chief[0][:2] == (2, 0) and worker[1][:2] == (2, 1), "world size 2, node ranks 0/1"
    assert chief[0][2] != worker[1][2], "both nodes trained on the same batch"
    assert "node 1 of 2 (worker)" in outputs[1]
    # Before the first step, the chief says how fast the nodes' all-reduce ran (gloo here).
    fabric = re.search(r"fabric: all-reduce bus bandwidth ([0-9.]+) GB/s between 2 nodes \(gloo",
                       outputs[0])  # fmt: skip
    assert fabric and float(fabric[1]) > 0, outputs[0][-3000:]
    assert "fabric:" not in outputs[1], "one line, from the chief"

    assert_trained_model_reloads_and_generates(
        tmp_path / "node0" / "out" / "model", demo_assets.model_dir, demo_assets.dataset_dir
    )
    # ZeRO-3 partitions parameters and optimizer state: each node holds only its own shard.
    for rank in (0, 1):
        step_dir = tmp_path / f"node{rank}" / "out" / "checkpoint-4" / "global_step4"
        shards = sorted(path.name for path in step_dir.glob("zero_pp_rank_*_optim_states.pt"))
        assert shards == [f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"], (rank, shards)
        assert not (tmp_path / f"node{rank}" / ".deepspeed_env").exists()
