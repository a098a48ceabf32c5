"""No instance fails another on the generation server: a prompt that cannot fit with its new
tokens is refused alone, naming the numbers, and a prompt whose generation fails fails only
its own row. A tiny GPT-2 (learned position embeddings: past them `generate()` raises
IndexError) with a tokenizer that knows one word its model does not (a vocabulary resized on
one side only), served over loopback."""

from __future__ import annotations

import httpx
import pytest

from tests.support.chat_models import FAMILIES, family_tokenizer
from tests.support.served_app import serve, wait_ready
from trainer.tasks.text_generation.serving import GenerationPredictor

POSITIONS = 64
UNKNOWN_WORD = "zebra"


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    import torch
    import transformers

    tokenizer = family_tokenizer(FAMILIES["llama"])
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=len(tokenizer), n_positions=POSITIONS, n_embd=32, n_layer=2, n_head=4,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=None,
    )  # fmt: skip
    config.architectures = ["GPT2LMHeadModel"]
    folder = tmp_path_factory.mktemp("gpt2")
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    tokenizer.add_tokens([UNKNOWN_WORD])  # beyond the model's embeddings
    tokenizer.save_pretrained(folder)
    pipe = transformers.pipeline("text-generation", model=str(folder))
    pipe.model.generation_config.eos_token_id = None  # every answer as long as asked
    return GenerationPredictor(pipe, "text-generation")


def long_prompt(predictor, tokens: int) -> str:
    words = ["Hello"]
    while len(predictor.pipe.tokenizer(" ".join(words))["input_ids"]) < tokens:
        words.append("Hello")
    return " ".join(words)


def test_a_prompt_too_long_for_its_new_tokens_is_refused_alone_with_the_numbers(gpt2):
    prompt = long_prompt(gpt2, 50)
    length = len(gpt2.pipe.tokenizer(prompt)["input_ids"])
    body = {"instances": [{"prompt": prompt}, {"prompt": "Hi"}],
            "parameters": {"max_new_tokens": 20, "temperature": 0}}  # fmt: skip
    with serve(gpt2) as url:
        wait_ready(url)
        answer = httpx.post(url + "/predict", json=body, timeout=60)
        alone = httpx.post(url + "/predict", json={**body, "instances": body["instances"][:1]},
                           timeout=60)  # fmt: skip
    assert answer.status_code == 200, answer.text
    refused, short = answer.json()["predictions"]
    assert set(refused) == {"error"}
    for number in (length, 20, length + 20, POSITIONS, POSITIONS - length):
        assert str(number) in refused["error"]
    assert short["completion_tokens"] == 20
    assert alone.status_code == 400
    assert alone.json()["instances"] == [{"index": 0, "error": refused["error"]}]


def test_a_generation_that_fails_fails_its_own_row_only(gpt2):
    body = {"instances": [{"prompt": "Hello"}, {"prompt": f"Hello {UNKNOWN_WORD}"},
                          {"prompt": "The capital of France"}],
            "parameters": {"max_new_tokens": 5, "temperature": 0}}  # fmt: skip
    with serve(gpt2) as url:
        wait_ready(url)
        answer = httpx.post(url + "/predict", json=body, timeout=60)
        alone = [httpx.post(url + "/predict", json={**body, "instances": [instance]}, timeout=60)
                 for instance in body["instances"][::2]]  # fmt: skip
    assert answer.status_code == 200, answer.text
    first, failed, last = answer.json()["predictions"]
    assert failed["error"].startswith("the generation failed: IndexError")
    assert [first, last] == [one.json()["predictions"][0] for one in alone]
    assert first["completion_tokens"] == last["completion_tokens"] == 5
