"""Real runs through `python -m trainer`: real processes, real rendezvous, real DeepSpeed.

Each test starts the launcher as a subprocess, which execs `accelerate launch`, which
starts the training processes; they meet over 127.0.0.1 with gloo, train a tiny Whisper
with DeepSpeed on CPU, evaluate WER, save checkpoints and the final model.
"""

from __future__ import annotations

import json
import re

import pytest
import torch
from datasets import Audio, load_dataset
from transformers import WhisperForConditionalGeneration, WhisperProcessor

from tests.support.helpers import DEMO_SPEECH_FLAGS, run_trainer, start_nodes, trainer_env
from trainer.config.demo import DATASET_DIRNAME, MODEL_DIRNAME

pytestmark = pytest.mark.slow

EVAL_LINE = re.compile(r"^eval at step (\d+) \| loss ([\d.]+) \| wer ([\d.]+)", re.MULTILINE)
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


ENGLISH_TRANSCRIBE = ["<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"]


def evaluations(output: str) -> dict[int, tuple[float, float]]:
    """step -> (loss, WER) of each `eval at step N` line."""
    return {int(step): (float(loss), float(wer)) for step, loss, wer in EVAL_LINE.findall(output)}


def assert_trained_model_reloads_and_generates(model_dir, initial_model_dir, dataset_dir):
    """The saved folder loads with from_pretrained, holds trained weights, and transcribes
    English (the run's --language en) with no arguments to generate()."""
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
        transcript = model.generate(features.input_features, max_new_tokens=8)
        # the same call, returning the prompt that generate() chose too
        prompted = model.generate(
            features.input_features, max_new_tokens=8, return_dict_in_generate=True
        ).sequences
    tokenizer = processor.tokenizer
    prompt = prompted[0, : prompted.shape[1] - transcript.shape[1]]
    assert tokenizer.convert_ids_to_tokens(prompt) == ENGLISH_TRANSCRIBE
    assert prompted[0, len(prompt) :].tolist() == transcript[0].tolist()
    assert 0 < transcript.shape[1] <= 8 and int(transcript.max()) < model.config.vocab_size
    # the prompt is special tokens only: the text is the transcript's, nothing more
    assert processor.batch_decode(prompted, skip_special_tokens=True) == processor.batch_decode(
        transcript, skip_special_tokens=True
    )


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
    # a training batch (4 per device), not the evaluation at step 0 (--eval_on_start)
    assert output.count("first batch of 4 examples") == 2
    assert output.count("eval at step 4 |") == 1, "the last step's evaluation is not redone"
    assert re.search(r"step 4/4 \(100%\) \| epoch [\d.]+ \| loss [\d.]+", output)
    assert re.search(r"samples/s \| data wait \d+% \|", output)
    startup = re.search(r"time to first step: ([\d.]+) s \((.*)\)", output)
    assert startup, "no time-to-first-step line"
    phases = dict(re.findall(r"([a-z ,]+?) ([\d.]+) s(?:, |$)", startup.group(2)))
    assert [p.strip(", ") for p in phases] == [
        "launcher, torchrun and imports", "flags", "rendezvous", "model",
        "data and resume point", "engine start and first step"]  # fmt: skip
    assert sum(map(float, phases.values())) == pytest.approx(float(startup.group(1)), abs=0.5)

    out = tmp_path / "out"
    # --eval_on_start (the demo recipe) scores the untrained model at step 0; the results
    # saved are step 4's, and 4 steps of training lowered the evaluation loss.
    scores = evaluations(output)
    assert sorted(scores) == [0, 4], output[-3000:]
    eval_results = json.loads((out / "eval_results.json").read_text())
    loss, wer = scores[4]
    assert eval_results["eval_loss"] == pytest.approx(loss, abs=1e-4)
    assert eval_results["eval_wer"] == pytest.approx(wer, abs=1e-4)
    assert loss < scores[0][0], f"evaluation loss {scores[0][0]} before training, {loss} after"
    assert f"result: WER {scores[0][1]:.1f} before training -> {wer:.1f} after 4 steps" in output
    checkpoint = out / "checkpoint-4"
    shards = list((checkpoint / "global_step4").glob("*optim_states.pt"))
    assert len(shards) == 2, "ZeRO-2 writes one optimizer shard per rank"
    assert json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == 4
    assert list((out / "runs").rglob("events.out.tfevents.*")), "no TensorBoard logs"
    assert not (tmp_path / ".deepspeed_env").exists(), ".deepspeed_env would hold the env"
    demo = demo_cache / "demo"
    assert_trained_model_reloads_and_generates(
        out / "model", demo / MODEL_DIRNAME, demo / DATASET_DIRNAME
    )


def test_two_nodes_on_one_machine_with_zero3(tmp_path, spoken_assets):
    """Two launchers with Vertex-style CLUSTER_SPECs, sharing no directory, meet and train.

    Log-mel features are computed by the training processes (as on GPU nodes), so that path
    runs under DeepSpeed too."""
    nodes = start_nodes(tmp_path, spoken_assets.model_dir, spoken_assets.dataset_dir,
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
        tmp_path / "node0" / "out" / "model", spoken_assets.model_dir, spoken_assets.dataset_dir
    )
    # ZeRO-3 partitions parameters and optimizer state: each node holds only its own shard.
    for rank in (0, 1):
        step_dir = tmp_path / f"node{rank}" / "out" / "checkpoint-4" / "global_step4"
        shards = sorted(path.name for path in step_dir.glob("zero_pp_rank_*_optim_states.pt"))
        assert shards == [f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"], (rank, shards)
        assert not (tmp_path / f"node{rank}" / ".deepspeed_env").exists()
