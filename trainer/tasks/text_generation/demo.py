"""Text generation's built-in demo (`python -m trainer --task text-generation` with no model and
no data): a tiny Qwen2 (the real `Qwen2Config`, width 128, 2 layers, about 0.5 M parameters)
with a byte-level BPE tokenizer trained here on the demo's own text, carrying Qwen 2.5's special
tokens and its released chat template (as TRL ships it), learns the capitals of invented
countries from chats. Nothing outside the data says which city is whose capital, so the
answers before training are nothing and after it the capitals: the samples printed at the
first and last evaluation (`--generation_samples`) show it, and the eval loss falls from about
6.1 to about 0.02 in 300 steps (about a minute on two CPU cores; trainer/recipes/chat-demo.yaml).
A learning rate of 3e-3 or more kept this model at the answers' prior (loss 0.6, the same
capital for every country).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from trainer.tasks.causal_lm import CAPITALS, COUNTRIES, QUESTIONS, save_tiny_qwen2


def chat(country: str, capital: str, question: str) -> dict:
    return {"messages": [
        {"role": "user", "content": question.format(country=country)},
        {"role": "assistant", "content": f"{capital}."},
    ]}  # fmt: skip


def chats() -> tuple[list[dict], list[dict]]:
    """The demo's chats, the same on every machine: every question form of every country to
    train on (shuffled), the first form of each to evaluate on."""
    rng = random.Random(0)
    train = [chat(c, k, q) for c, k in zip(COUNTRIES, CAPITALS, strict=True) for q in QUESTIONS]
    rng.shuffle(train)
    test = [chat(c, k, QUESTIONS[0]) for c, k in zip(COUNTRIES, CAPITALS, strict=True)]
    return train, test


def build_dataset(dataset_dir: Path) -> None:
    """The demo's data: a JSONL file per split (the training chats eight times over)."""
    train, test = chats()
    dataset_dir.mkdir(parents=True, exist_ok=True)
    for split, rows in (("train", train * 8), ("test", test)):
        (dataset_dir / f"{split}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def build_model(model_dir: Path) -> None:
    """The demo's model: a tiny Qwen2 whose tokenizer is trained on the training chats."""
    save_tiny_qwen2(model_dir, [json.dumps(row) for row in chats()[0]])
