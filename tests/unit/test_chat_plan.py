"""The launch plan of text generation's models at released sizes (Llama 3.1 8B and 70B, their
config.json dimensions, built on the meta device): a full fine-tune of 8B on one L4 refused
with what would fit (QLoRA), QLoRA planned there; 70B in full on one A3 node refused with the
node count that fits, planned over that many nodes; 4-bit on a CPU refused in one line."""

from __future__ import annotations

import json
import re

import pytest

from tests.support.chat_models import save_sized_config
from tests.support.helpers import offline_dry_run as dry_run
from trainer.preflight.vertex_machines import ACCELERATORS
from trainer.settings.run_config import Hardware

CHAT = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
CHECKPOINTING = ["--gradient_checkpointing", "true", "--eval_strategy", "no"]


@pytest.fixture(scope="module")
def sized(tmp_path_factory):
    root = tmp_path_factory.mktemp("sized")
    (root / "chats").mkdir()
    (root / "chats" / "train.jsonl").write_text(json.dumps(CHAT))
    for name in ("llama-3.1-8b", "llama-3.1-70b"):
        save_sized_config(name, root / name)
    return root


def on(monkeypatch, accelerator: str, count: int) -> None:
    name, capability, memory = ACCELERATORS[accelerator]
    hardware = Hardware(count, name, capability, 12 * count, gpu_memory_bytes=memory)
    monkeypatch.setattr("trainer.node.machine.detect_hardware", lambda: hardware)


def plan(sized, model: str, capsys, *extra: str):
    args = ["--model_name_or_path", sized / model, "--dataset_name", sized / "chats",
            *CHECKPOINTING, *extra]  # fmt: skip
    code, config, err = dry_run(args, capsys)
    return code, err


def planned_gib(capsys_out: str) -> float:
    return float(re.search(r'"total_gib": ([\d.]+)', capsys_out)[1])


def test_8b_in_full_on_one_l4_is_refused_naming_qlora_which_is_planned(sized, monkeypatch, capsys):
    on(monkeypatch, "NVIDIA_L4", 1)
    code, err = plan(sized, "llama-3.1-8b", capsys)
    (line,) = err.splitlines()
    assert code == 2 and "GiB usable of this node's 22 GiB NVIDIA L4" in line, err
    assert "what would fit: --peft lora --load_in_4bit (QLoRA) (about 14.9 GiB)" in line
    args = ["--model_name_or_path", sized / "llama-3.1-8b", "--dataset_name", sized / "chats",
            *CHECKPOINTING, "--peft", "lora", "--load_in_4bit"]  # fmt: skip
    from trainer.launcher import main as launch

    launch.main(["--dry-run", "--skip_hub_check", *[str(a) for a in args]])
    out = capsys.readouterr().out
    # half a byte a frozen weight of the blocks' linear layers; the embeddings and LM head
    # (1.05 B weights) unquantized, 16-bit under DeepSpeed's bf16 (2.1 GB, not 0.5); the
    # adapters in full; three tensors of 1024 x 128,256 logits per sample for the loss
    assert planned_gib(out) == pytest.approx(15.02, abs=0.01)


def test_70b_in_full_on_one_a3_node_is_refused_with_the_node_count_that_fits(
    sized, monkeypatch, capsys
):
    on(monkeypatch, "NVIDIA_H100_80GB", 8)
    code, err = plan(sized, "llama-3.1-70b", capsys, "--deepspeed", "zero3")
    assert code == 2 and "what would fit:" in err, err
    nodes = int(re.search(r"--deepspeed zero3 on (\d+) node\(s\) of 8 GPU\(s\)", err)[1])
    assert nodes == 3  # 16 bytes a weight under ZeRO-3 (1.1 TB) over 24 GPUs, and activations
    spec = {"cluster": {"workerpool0": ["a:2222"], "workerpool1": ["b:2222", "c:2222"]},
            "task": {"type": "workerpool0", "index": 0}}  # fmt: skip
    monkeypatch.setenv("CLUSTER_SPEC", json.dumps(spec))
    from trainer.launcher import main as launch

    launch.main(["--dry-run", "--skip_hub_check", "--model_name_or_path",
                 str(sized / "llama-3.1-70b"), "--dataset_name", str(sized / "chats"),
                 *CHECKPOINTING, "--deepspeed", "zero3"])  # fmt: skip
    assert planned_gib(capsys.readouterr().out) < 69.7


def test_qlora_on_a_cpu_is_one_line(sized, monkeypatch, capsys):
    monkeypatch.setattr("trainer.node.machine.detect_hardware",
                        lambda: Hardware(0, None, None, 2))  # fmt: skip
    code, err = plan(sized, "llama-3.1-8b", capsys, "--peft", "lora", "--load_in_4bit")
    assert code == 2 and err.startswith("error: --load_in_4bit needs a CUDA GPU"), err
    assert len(err.splitlines()) == 1
