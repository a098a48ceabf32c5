"""Preference tuning's built-in demo (`python -m trainer --task preference-tuning` with no model
and no data; `make demo-preference`): the usual two stages on the text-generation demo's tiny
Qwen2 (trainer/tasks/causal_lm.py), both through the real command line. Its model is an SFT
stage (`python -m trainer --task text-generation`) on chats about invented capitals in which
every question is answered twice, once plainly and once ending with a sign-off ("Safe
travels!"): the SFT model signs off about half the time. The DPO stage
(trainer/recipes/preference-demo.yaml) trains on pairs that prefer the signed-off answer.
`python -m trainer.tasks.preference_tuning.demo` then samples answers to held-out questions from
both models and prints the share that signs off, before and after, beside the DPO run's eval
reward accuracy.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from trainer.common.cache import cache_dir
from trainer.tasks.causal_lm import CAPITALS, COUNTRIES, QUESTIONS, save_tiny_qwen2
from trainer.tasks.preference_tuning.spec import SPEC

HELD_OUT = "Tell me the capital of {country}."
"""The question form neither stage trains on: the evaluation pairs and the sampled answers."""
SIGN_OFF = "Safe travels!"
SAMPLES_PER_QUESTION = 4

SFT_FLAGS = (
    "--task", "text-generation", "--nproc_per_node", "1", "--deepspeed", "none",
    "--max_seq_length", "128", "--max_steps", "150", "--per_device_train_batch_size", "16",
    "--learning_rate", "1e-3", "--warmup_steps", "10", "--logging_steps", "50",
    "--eval_strategy", "no", "--save_steps", "150", "--seed", "42", "--report_to", "none",
)  # fmt: skip
"""The SFT stage's run (the capitals and both answer forms: about as long as the chat demo)."""

CLUSTER_VARIABLES = ("CLUSTER_SPEC", "TF_CONFIG")
"""A Vertex AI job's variables that would make the nested SFT run a node of the job."""


def answer(country: str, capital: str, signed: bool) -> str:
    plain = f"The capital of {country} is {capital}."
    return f"{plain} {SIGN_OFF}" if signed else plain


def signs_off(text: str) -> bool:
    """The preferred property: the answer ends with the sign-off."""
    return text.strip().endswith(SIGN_OFF)


def user(question: str, country: str) -> list[dict]:
    return [{"role": "user", "content": question.format(country=country)}]


def sft_chats() -> list[dict]:
    """Every training question of every country answered in both forms, shuffled: the SFT
    model's prior is about even between them."""
    rows = [{"messages": [*user(q, c), {"role": "assistant", "content": answer(c, k, signed)}]}
            for c, k in zip(COUNTRIES, CAPITALS, strict=True) for q in QUESTIONS
            for signed in (False, True)]  # fmt: skip
    random.Random(0).shuffle(rows)
    return rows


def pairs(questions: tuple[str, ...]) -> list[dict]:
    """Explicit-prompt conversational pairs: the signed-off answer chosen, the plain one
    rejected (the same words otherwise)."""
    return [{"prompt": user(q, c),
             "chosen": [{"role": "assistant", "content": answer(c, k, True)}],
             "rejected": [{"role": "assistant", "content": answer(c, k, False)}]}
            for c, k in zip(COUNTRIES, CAPITALS, strict=True) for q in questions]  # fmt: skip


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def build_dataset(dataset_dir: Path) -> None:
    """The DPO stage's pairs: the training questions (four times over), the held-out ones to
    evaluate on."""
    write_jsonl(dataset_dir / "train.jsonl", pairs(QUESTIONS) * 4)
    write_jsonl(dataset_dir / "test.jsonl", pairs((HELD_OUT,)))


def build_model(model_dir: Path) -> None:
    """The SFT model: the tiny Qwen2 given the SFT stage by `python -m trainer --task
    text-generation` (a subprocess of its own, on this machine alone), its delivered model
    copied here."""
    chats = sft_chats()
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        save_tiny_qwen2(work / "base", [json.dumps(row) for row in chats])
        write_jsonl(work / "chats" / "train.jsonl", chats)
        command = [sys.executable, "-m", "trainer", *SFT_FLAGS, "--model_name_or_path",
                   str(work / "base"), "--dataset_name", str(work / "chats"), "--output_dir",
                   str(work / "sft")]  # fmt: skip
        print("preference demo: the SFT stage:", " ".join(command[1:]), flush=True)
        env = {k: v for k, v in os.environ.items()
               if k not in CLUSTER_VARIABLES and not k.startswith("AIP_")}  # fmt: skip
        stage = subprocess.run(command, env=env)
        if stage.returncode:  # its one error: line is said; the launcher ends with its code
            sys.exit(stage.returncode)
        shutil.copytree(work / "sft" / "model", model_dir, dirs_exist_ok=True)


def signed_share(model_dir: Path, seed: int = 0) -> tuple[int, int]:
    """(answers that sign off, answers) among SAMPLES_PER_QUESTION sampled answers (the
    model's own generation config, seeded) to each held-out question."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils.logging import disable_progress_bar

    disable_progress_bar()  # the figures alone, not a loading bar per model
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    torch.manual_seed(seed)
    signed = total = 0
    for country in COUNTRIES:
        chat = tokenizer.apply_chat_template(user(HELD_OUT, country), add_generation_prompt=True,
                                             return_tensors="pt", return_dict=True)  # fmt: skip
        ids = chat["input_ids"]
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                 do_sample=True, max_new_tokens=24,
                                 num_return_sequences=SAMPLES_PER_QUESTION,
                                 pad_token_id=tokenizer.pad_token_id)  # fmt: skip
        texts = tokenizer.batch_decode(out[:, ids.shape[1] :], skip_special_tokens=True)
        signed += sum(signs_off(text) for text in texts)
        total += len(texts)
    return signed, total


def main(argv: list[str]) -> None:
    """`python -m trainer.tasks.preference_tuning.demo [OUTPUT_DIR]`, after the demo's run: the
    share of sampled answers that sign off, from the SFT model and the DPO model, and the
    DPO run's eval reward accuracy (its eval_results.json)."""
    output = Path(argv[0] if argv else "outputs/preference-demo")
    sft = SPEC.demo_assets_in(cache_dir() / "demo").model_dir
    results = json.loads((output / "eval_results.json").read_text())
    for name, model_dir in (("before DPO (the SFT model)", sft), ("after DPO", output / "model")):
        signed, total = signed_share(model_dir)
        print(f"{name}: {signed} of {total} sampled answers end with {SIGN_OFF!r} "
              f"({signed / total:.0%})")  # fmt: skip
    print(f"eval reward accuracy after DPO: {results['eval_rewards/accuracies']:.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
