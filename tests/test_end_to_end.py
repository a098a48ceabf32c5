"""Real runs through `python -m trainer`: real processes, real rendezvous, real DeepSpeed.

Each test starts the launcher as a subprocess, which execs `accelerate launch`, which
starts the training processes; they meet over 127.0.0.1 with gloo, train a tiny Whisper
with DeepSpeed on CPU, evaluate WER, save checkpoints and the final model.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
from datasets import Audio, load_dataset
from transformers import WhisperForConditionalGeneration, WhisperProcessor

from tests.conftest import free_port, run_trainer, start_trainer, trainer_env

pytestmark = pytest.mark.slow

RANK_LINE = re.compile(
    r"rank (\d+)/(\d+) \(node (\d+), local rank \d+\): first batch of \d+ examples, "
    r"fingerprint (\w+)"
)

SHORT_RUN = [
    "--max_steps", "4",
    "--eval_steps", "4",
    "--save_steps", "4",
    "--logging_steps", "2",
    "--per_device_train_batch_size", "4",
    "--per_device_eval_batch_size", "6",
    "--max_eval_samples", "6",
]  # fmt: skip


def rank_reports(output: str) -> dict[int, tuple[int, int, str]]:
    """rank -> (world size, node, fingerprint of its first batch)."""
    return {
        int(rank): (int(world), int(node), fingerprint)
        for rank, world, node, fingerprint in RANK_LINE.findall(output)
    }


def assert_trained_model_reloads_and_generates(model_dir, initial_model_dir, dataset_dir):
    """The saved folder loads with from_pretrained, holds trained weights, and transcribes."""
    model = WhisperForConditionalGeneration.from_pretrained(model_dir)
    processor = WhisperProcessor.from_pretrained(model_dir)
    initial = WhisperForConditionalGeneration.from_pretrained(initial_model_dir).state_dict()
    changed = [
        name for name, value in model.state_dict().items() if not torch.equal(value, initial[name])
    ]
    assert len(changed) > len(initial) // 2, "the saved weights are not the trained ones"

    clip = load_dataset("audiofolder", data_dir=str(dataset_dir), split="test")
    clip = clip.cast_column("audio", Audio(sampling_rate=16_000))[0]["audio"]
    waveform = clip.get_all_samples().data.mean(dim=0).numpy()
    features = processor.feature_extractor(waveform, sampling_rate=16_000, return_tensors="pt")
    with torch.no_grad():
        generated = model.generate(features.input_features, max_new_tokens=8)
    assert 0 < generated.shape[1] <= 8 + 4
    assert int(generated.max()) < model.config.vocab_size
    assert isinstance(processor.batch_decode(generated, skip_special_tokens=True)[0], str)


def test_demo_trains_two_processes_with_zero2(tmp_path, demo_cache):
    """The built-in default (no model, no dataset) through the real entrypoint."""
    code, output = run_trainer(
        ["--nproc_per_node", "2", *SHORT_RUN, "--output_dir", "out"],
        cwd=tmp_path,
        env=trainer_env(demo_cache),
    )
    assert code == 0, output[-3000:]

    reports = rank_reports(output)
    assert set(reports) == {0, 1}
    assert all(world == 2 for world, _, _ in reports.values())
    assert reports[0][2] != reports[1][2], "both ranks trained on the same batch"
    assert re.search(r"step 4/4 \(100%\) \| epoch [\d.]+ \| loss [\d.]+", output)

    out = tmp_path / "out"
    eval_results = json.loads((out / "eval_results.json").read_text())
    assert eval_results["eval_wer"] >= 0 and eval_results["eval_loss"] > 0
    checkpoint = out / "checkpoint-4"
    shards = list((checkpoint / "global_step4").glob("*optim_states.pt"))
    assert len(shards) == 2, "ZeRO-2 writes one optimizer shard per rank"
    assert json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == 4
    assert list((out / "runs").rglob("events.out.tfevents.*")), "no TensorBoard logs"
    assert not (tmp_path / ".deepspeed_env").exists(), ".deepspeed_env would hold the env"
    demo = demo_cache / "demo"
    assert_trained_model_reloads_and_generates(
        out / "model", demo / "tiny-whisper", demo / "speech-demo"
    )


def test_two_nodes_on_one_machine_with_zero3(tmp_path, demo_assets):
    """Two launchers with Vertex-style CLUSTER_SPECs, sharing no directory, meet and train."""
    port = free_port()
    cluster = {"workerpool0": [f"127.0.0.1:{port}"], "workerpool1": [f"127.0.0.1:{port}"]}
    nodes = []
    for pool in ("workerpool0", "workerpool1"):
        node_dir = tmp_path / pool
        node_dir.mkdir()
        # Nodes share no disk: each gets its own copy of the model and data.
        model_dir = shutil.copytree(demo_assets.model_dir, node_dir / "model-in")
        data_dir = shutil.copytree(demo_assets.dataset_dir, node_dir / "data")
        spec = {
            "cluster": cluster,
            "environment": "cloud",
            "task": {"type": pool, "index": 0, "trial": "1"},
        }
        env = trainer_env(
            tmp_path / f"cache-{pool}",
            CLUSTER_SPEC=json.dumps(spec),
            RANK="0" if pool == "workerpool0" else "1",
            WORLD_SIZE="2",
        )
        args = [
            "--deepspeed", "zero3",
            "--nproc_per_node", "1",
            "--model_name_or_path", str(model_dir),
            "--dataset_name", str(data_dir),
            "--text_column_name", "transcription",
            "--language", "en",
            *SHORT_RUN,
            "--output_dir", "out",
        ]  # fmt: skip
        nodes.append((node_dir, start_trainer(args, cwd=node_dir, env=env)))

    outputs = []
    for node_dir, node in nodes:
        code, output = node.finish(timeout=600)
        outputs.append(output)
        assert code == 0, f"{node_dir.name} failed:\n{output[-3000:]}"

    chief, worker = (rank_reports(output) for output in outputs)
    assert chief.keys() == {0} and worker.keys() == {1}
    assert chief[0][:2] == (2, 0) and worker[1][:2] == (2, 1), "world size 2, node ranks 0/1"
    assert chief[0][2] != worker[1][2], "both nodes trained on the same batch"
    assert "node 1 of 2 (worker)" in outputs[1]

    chief_out = tmp_path / "workerpool0" / "out"
    assert_trained_model_reloads_and_generates(
        chief_out / "model", demo_assets.model_dir, demo_assets.dataset_dir
    )
    # ZeRO-3 partitions parameters and optimizer state: each node holds only its own shard.
    for node, rank in (("workerpool0", 0), ("workerpool1", 1)):
        step_dir = tmp_path / node / "out" / "checkpoint-4" / "global_step4"
        shards = sorted(path.name for path in step_dir.glob("zero_pp_rank_*_optim_states.pt"))
        assert shards == [f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"], (node, shards)
    for node_dir, _ in nodes:
        assert not (node_dir / ".deepspeed_env").exists()
