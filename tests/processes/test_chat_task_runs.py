"""Text generation through the real `python -m trainer`, two processes under ZeRO-3 with LoRA and
packing, on a tiny Llama (tests/support/chat_models.py) and generated chats: the delivered
merged model, in a fresh process, generates through `pipeline("text-generation")` exactly what
the trained model generated for `--do_predict`; and a run stopped by SIGTERM mid-run, restarted,
ends with the weights of the uninterrupted run. One uninterrupted run serves both. What is
checked in this process (the loss mask of each family, packing, bad rows, flags):
tests/unit/test_chat_task.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.support.chat_models import FAMILIES, save_family_model
from tests.support.helpers import (
    assert_same_weights,
    run_trainer,
    stopped_then_resumed,
    trainer_env,
    use_delivered_model,
)
from tests.support.lora_flags import LORA

pytestmark = pytest.mark.slow

COUNTRIES = ["Zorvia", "Quelland", "Marnok", "Tivessa", "Brolt", "Yendra", "Culpa", "Osgard"]
CAPITALS = ["Velt", "Arrin", "Pesk", "Lumo", "Drace", "Nirra", "Sollo", "Kett"]
MAX_NEW_TOKENS = 8


def chat(i: int) -> dict:
    country, capital = COUNTRIES[i % 8], CAPITALS[i % 8]
    return {"messages": [
        {"role": "user", "content": f"What is the capital of {country}?"},
        {"role": "assistant", "content": f"The capital of {country} is {capital}."},
    ]}  # fmt: skip


@pytest.fixture(scope="module")
def llama_and_chats(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("chat-assets")
    data = root / "chats"
    data.mkdir()
    (data / "train.jsonl").write_text("\n".join(json.dumps(chat(i)) for i in range(96)))
    (data / "test.jsonl").write_text("\n".join(json.dumps(chat(i)) for i in range(4)))
    corpus = [json.dumps(chat(i)) for i in range(8)]
    return save_family_model(FAMILIES["llama"], root / "llama", corpus), data


def chat_args(assets: tuple[Path, Path]) -> list[str]:
    model, data = assets
    return [
        "--model_name_or_path", str(model), "--dataset_name", str(data), "--packing",
        "--max_seq_length", "128", "--deepspeed", "zero3", "--nproc_per_node", "2",
        "--per_device_train_batch_size", "2", "--learning_rate", "5e-3", "--max_steps", "10",
        "--save_steps", "4", "--eval_strategy", "no", "--do_predict",
        "--max_new_tokens", str(MAX_NEW_TOKENS), "--seed", "3", "--output_dir", "out",
        "--report_to", "none", *LORA,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def uninterrupted(llama_and_chats, tmp_path_factory) -> Path:
    cwd = tmp_path_factory.mktemp("chat-zero3")
    code, output = run_trainer(chat_args(llama_and_chats), cwd, trainer_env(cwd / "cache"))
    assert code == 0, output[-3000:]
    return cwd


def test_the_merged_model_generates_in_a_fresh_process_what_the_trained_model_did(
    uninterrupted, tmp_path
):
    model_dir = uninterrupted / "out" / "model"
    files = {path.name for path in model_dir.iterdir()}
    # vLLM's and pipeline()'s layout: safetensors, config, generation config, tokenizer, template
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
            "chat_template.jinja"} <= files  # fmt: skip
    assert not any("lora" in name for name in load_file(model_dir / "model.safetensors"))
    predicted = [json.loads(line) for line in
                 (uninterrupted / "out" / "model-test" / "predictions.jsonl").open()]  # fmt: skip
    assert [p["reference"] for p in predicted] == [
        chat(i)["messages"][1]["content"] for i in range(4)
    ]
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps({
        "prompts": [chat(i)["messages"][:1] for i in range(4)],
        "max_new_tokens": MAX_NEW_TOKENS,
    }))  # fmt: skip
    used = use_delivered_model("text-generation", model_dir, prompts)
    assert used["texts"] == [p["prediction"]["text"] for p in predicted]
    assert all(text for text in used["texts"])


def test_a_run_stopped_mid_run_resumes_to_the_uninterrupted_weights(
    llama_and_chats, uninterrupted, tmp_path
):
    args = chat_args(llama_and_chats)
    stopped_then_resumed(args, tmp_path, trainer_env(tmp_path / "cache"), 5, 10)
    assert_same_weights(uninterrupted / "out" / "model" / "model.safetensors",
                        tmp_path / "out" / "model" / "model.safetensors")  # fmt: skip


def test_the_built_in_chat_demo_learns_the_capitals_it_can_only_learn_from_data(tmp_path):
    """`python -m trainer --task text-generation` with no model and no data: the tiny Qwen2
    answers nothing before training and each country's capital after it; the eval loss falls
    from about 6 to under 0.5 (the closing before -> after line)."""
    args = ["--task", "text-generation", "--nproc_per_node", "1", "--deepspeed", "none",
            "--report_to", "none"]  # fmt: skip
    code, output = run_trainer(args, tmp_path, trainer_env(tmp_path / "cache"))
    assert code == 0, output[-3000:]
    before, after = re.search(r"result: loss ([\d.]+) before training -> ([\d.]+)", output).groups()
    assert float(before) > 4 and float(after) < 0.5, output[-2000:]
    last = re.findall(r"sample (\d) at step 300: (reference|output): (.*)", output)
    pairs = {(number, kind): text for number, kind, text in last}
    assert all(pairs[(n, "output")] == pairs[(n, "reference")] for n in "012"), last
