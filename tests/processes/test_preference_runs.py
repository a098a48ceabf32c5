"""Preference tuning through the real `python -m trainer`: two processes under ZeRO-3, in full
(the frozen reference model sharded like the policy), on a tiny Llama (tests/support/
chat_models.py) and chats whose chosen answer is a polite one and rejected answer a curt one,
a bad row among them. One run: the bad row skipped and counted, checkpoints with manifests,
TRL's evaluation metrics with the reward accuracy as the run's metric, and the delivered model
a text-generation model: a fresh process generates with it through `pipeline("text-generation")`,
the server's loader picks text generation's predictor for it, and it prefers the chosen answers
more than the model it started from. The same run stopped by SIGTERM mid-run (policy, frozen
reference, optimizer and data order all in play) and restarted ends with that run's weights.
What is checked in this process (TRL's tokenisation of
each format, bad and long rows, flags, LoRA's reference, the plan):
tests/unit/test_preference_task.py and tests/unit/test_preference_plan.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.support.chat_models import FAMILIES, save_family_model
from tests.support.helpers import (
    assert_same_weights,
    run_trainer,
    stopped_then_resumed,
    trainer_env,
    use_delivered_model,
)

pytestmark = pytest.mark.slow

QUESTIONS = ["the time", "the way out", "a pen", "some water", "the menu", "a seat", "help",
             "the news"]  # fmt: skip


def pair(i: int) -> dict:
    asked = QUESTIONS[i % len(QUESTIONS)]
    return {
        "prompt": [{"role": "user", "content": f"May I have {asked}?"}],
        "chosen": [{"role": "assistant", "content": f"Of course! Here is {asked}, with pleasure."}],
        "rejected": [{"role": "assistant", "content": "No."}],
    }


@pytest.fixture(scope="module")
def model_and_args(tmp_path_factory) -> tuple[Path, list[str]]:
    """The tiny Llama and the run's flags (its pairs written beside it)."""
    root = tmp_path_factory.mktemp("preference")
    data = root / "pairs"
    data.mkdir()
    rows = [pair(i) for i in range(40)]
    rows[7]["rejected"] = rows[7]["chosen"]  # a bad row: chosen equals rejected
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (data / "test.jsonl").write_text("".join(json.dumps(pair(i)) + "\n" for i in range(8)))
    corpus = [json.dumps(pair(i)) for i in range(8)]
    model = save_family_model(FAMILIES["llama"], root / "llama", corpus)
    args = [
        "--model_name_or_path", str(model), "--dataset_name", str(data),
        "--deepspeed", "zero3", "--nproc_per_node", "2", "--per_device_train_batch_size", "2",
        "--learning_rate", "2e-3", "--max_steps", "8", "--save_steps", "4",
        "--eval_strategy", "steps", "--eval_steps", "8", "--max_seq_length", "256",
        "--max_bad_examples", "1", "--seed", "3", "--output_dir", "out", "--report_to", "none",
    ]  # fmt: skip
    return model, args


@pytest.fixture(scope="module")
def run(model_and_args, tmp_path_factory) -> tuple[Path, Path, str]:
    """The run, uninterrupted, once for the module."""
    model, args = model_and_args
    root = tmp_path_factory.mktemp("uninterrupted")
    code, output = run_trainer(args, root, trainer_env(root / "cache"))
    assert code == 0, output[-3000:]
    return root, model, output


def chosen_margin(model_dir: Path, rows: list[dict]) -> float:
    """Mean log-probability of the chosen answer minus the rejected one, given the prompt."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    margins = []
    for row in rows:
        sides = []
        for side in ("chosen", "rejected"):
            prompt, whole = (
                tokenizer(text, add_special_tokens=False).input_ids
                for text in (
                    tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True,
                                                  tokenize=False),
                    tokenizer.apply_chat_template(row["prompt"] + row[side], tokenize=False),
                )
            )  # fmt: skip
            ids = torch.tensor([whole])
            with torch.no_grad():
                logps = model(ids).logits[0, :-1].log_softmax(-1)
            targets = ids[0, 1:]
            picked = logps.gather(1, targets[:, None])[:, 0][len(prompt) - 1 :]
            sides.append(picked.sum().item())
        margins.append(sides[0] - sides[1])
    return sum(margins) / len(margins)


def test_a_zero3_run_delivers_a_text_generation_model_that_prefers_the_chosen_answers(run):
    root, base, output = run
    out = root / "out"
    assert "skipped 1 of 40 rows of split train" in output, output[-3000:]
    assert "row 7 (chosen equals rejected)" in output
    assert {"checkpoint-4", "checkpoint-8"} <= {p.name for p in out.iterdir()}
    assert (out / "checkpoint-8" / "manifest.json").is_file()
    results = json.loads((out / "eval_results.json").read_text())
    for name in ("rewards/accuracies", "rewards/margins", "rewards/chosen", "rewards/rejected",
                 "logps/chosen", "logps/rejected"):  # fmt: skip
        assert f"eval_{name}" in results, sorted(results)
    assert results["eval_rewards/accuracies"] > 0.5
    assert "result: rewards/accuracies" in output
    model_dir = out / "model"
    from trainer.tasks.served_model import task_of_model_dir

    assert task_of_model_dir(model_dir) == "text-generation"  # the server's predictor
    prompts = root / "prompts.json"
    prompts.write_text(json.dumps({"prompts": [pair(i)["prompt"] for i in range(2)],
                                   "max_new_tokens": 6}))  # fmt: skip
    used = use_delivered_model("text-generation", model_dir, prompts)
    assert len(used["texts"]) == 2
    tests = [pair(i) for i in range(8)]
    before, after = chosen_margin(base, tests), chosen_margin(model_dir, tests)
    print(f"chosen minus rejected log-probability: {before:.2f} before, {after:.2f} after")
    assert after > before + 1.0


def test_a_run_stopped_mid_run_resumes_to_the_uninterrupted_weights(model_and_args, run, tmp_path):
    _, args = model_and_args
    stopped_then_resumed(args, tmp_path, trainer_env(tmp_path / "cache"), 5, 8)
    assert_same_weights(run[0] / "out" / "model" / "model.safetensors",
                        tmp_path / "out" / "model" / "model.safetensors")  # fmt: skip
