"""The launch plan of preference tuning with its reference model, at released sizes (Llama 3.1
8B, its config.json dimensions, on the meta device): a full fine-tune keeps a frozen copy
(counted in the dry run's memory and in the micro-batch's FLOPs), LoRA keeps none (the base,
adapter disabled), nor does --precompute_ref_log_probs; 8B in full on one L4 is refused in one
line naming what would fit (LoRA, QLoRA, precomputing, more nodes); 8B in full on one A3 node
under ZeRO-3 is planned."""

from __future__ import annotations

import json
import re

import pytest

from tests.support.chat_models import save_sized_config
from trainer.preflight.vertex_machines import ACCELERATORS
from trainer.settings.run_config import Hardware

PAIR = {"prompt": "a", "chosen": "b", "rejected": "c"}
SETTINGS = ["--task", "preference-tuning", "--gradient_checkpointing", "true",
            "--eval_strategy", "no", "--max_seq_length", "1024"]  # fmt: skip
MICRO_BATCH = "micro_batch_time_per_gpu"
EIGHT_B = 8_030_261_248
"""Llama 3.1 8B's parameters (embeddings and LM head untied)."""


@pytest.fixture(scope="module")
def sized(tmp_path_factory):
    root = tmp_path_factory.mktemp("sized")
    (root / "pairs").mkdir()
    (root / "pairs" / "train.jsonl").write_text(json.dumps(PAIR))
    save_sized_config("llama-3.1-8b", root / "llama-3.1-8b")
    return root


def on(monkeypatch, accelerator: str, count: int) -> None:
    name, capability, memory = ACCELERATORS[accelerator]
    hardware = Hardware(count, name, capability, 12 * count, gpu_memory_bytes=memory)
    monkeypatch.setattr("trainer.node.machine.detect_hardware", lambda: hardware)


def plan(sized, capsys, *extra: str) -> tuple[int, str, dict | None]:
    from trainer.launcher import main as launch

    args = ["--model_name_or_path", sized / "llama-3.1-8b", "--dataset_name", sized / "pairs",
            *SETTINGS, *extra]  # fmt: skip
    try:
        launch.main(["--dry-run", "--skip_hub_check", *[str(a) for a in args]])
    except SystemExit as exit:
        return exit.code, capsys.readouterr().err, None
    out = capsys.readouterr().out
    return 0, "", json.loads(out)["model"]


def test_8b_in_full_on_one_l4_is_refused_naming_what_would_fit(sized, monkeypatch, capsys):
    on(monkeypatch, "NVIDIA_L4", 1)
    code, err, _ = plan(sized, capsys)
    (line,) = err.splitlines()
    assert code == 2 and "GiB usable of this node's 22 GiB NVIDIA L4" in line, err
    would = line.split("what would fit: ", 1)[1]
    assert "--peft lora --load_in_4bit (QLoRA) (about" in would
    assert "--deepspeed zero3 on " in would
    # precomputing alone (8B's weights, gradients and Adam in full) does not fit one L4
    assert "--precompute_ref_log_probs" not in would


def test_8b_in_full_on_one_a3_node_names_precomputing_and_counts_the_reference(
    sized, monkeypatch, capsys
):
    on(monkeypatch, "NVIDIA_H100_80GB", 8)
    code, err, full = plan(sized, capsys, "--deepspeed", "zero3")
    assert code == 0, err
    memory = full["memory_per_gpu"]
    assert memory["reference_parameters"] == EIGHT_B
    code, err, precomputed = plan(sized, capsys, "--deepspeed", "zero3",
                                  "--precompute_ref_log_probs", "true")  # fmt: skip
    assert code == 0, err
    assert "reference_parameters" not in precomputed["memory_per_gpu"]
    # the reference's 16-bit weights, partitioned over the node's 8 GPUs
    saved = memory["weights_bytes"] - precomputed["memory_per_gpu"]["weights_bytes"]
    assert saved == pytest.approx(2 * EIGHT_B / 8, rel=1e-6)
    # and its forward pass over both sequences of a pair (2 x 1024 positions): about
    # 2 x 8.03 B weights x 2048 = 32.9 TFLOP, plus attention
    time, without = full[MICRO_BATCH], precomputed[MICRO_BATCH]
    extra = time["training_tflop_per_example"] - without["training_tflop_per_example"]
    assert 32.9 <= extra < 36
    assert time["seconds_estimate"] > without["seconds_estimate"]


def test_lora_keeps_no_second_copy(sized, monkeypatch, capsys):
    on(monkeypatch, "NVIDIA_L4", 1)
    code, err, lora = plan(sized, capsys, "--peft", "lora", "--load_in_4bit")
    assert code == 0, err
    assert "reference_parameters" not in lora["memory_per_gpu"]
    assert lora["memory_per_gpu"]["total_gib"] < 22


def test_a_full_run_that_fits_only_without_the_reference_names_precomputing(
    sized, monkeypatch, capsys
):
    on(monkeypatch, "NVIDIA_H100_80GB", 2)
    code, err, _ = plan(sized, capsys, "--deepspeed", "zero3")
    assert code == 2, err
    assert re.search(r"--precompute_ref_log_probs true \(about [\d.]+ GiB\)", err), err
