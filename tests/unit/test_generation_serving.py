"""Serving a causal language model: tiny models of real families (tests/support/chat_models.py)
through `GenerationPredictor`, the object the server and `trainer.predict` call."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.support.chat_models import FAMILIES, save_family_model
from tests.support.served_app import serve, wait_ready
from trainer.tasks.instance_media import InstanceError
from trainer.tasks.text_generation.serving import (
    MAX_NEW_TOKENS_LIMIT,
    GenerationPredictor,
    checked_generation_parameters,
)

GREEDY = {"max_new_tokens": 10, "temperature": 0}
CHAT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is two plus two?"},
]


@pytest.fixture(scope="module", params=["llama", "qwen2", "gemma2"])
def predictor(request, tmp_path_factory):
    from transformers import pipeline

    family = FAMILIES[request.param]
    folder = save_family_model(family, tmp_path_factory.mktemp(family.name))
    return GenerationPredictor(pipeline("text-generation", model=str(folder)), "text-generation")


def chat_for(predictor) -> list[dict]:
    takes_system = "gemma" not in predictor.pipe.model.config.model_type
    return CHAT if takes_system else CHAT[1:]


def test_prompts_batched_together_get_what_each_gets_alone(predictor):
    instances = [{"prompt": "The capital of France"}, {"messages": chat_for(predictor)}, "Hello"]
    prepared = [predictor.prepare(instance) for instance in instances]
    assert len({len(p.model_inputs[0]["input_ids"]) for p in prepared}) == 3  # padding matters
    together = predictor.predict(prepared, GREEDY)
    alone = [predictor.predict([one], GREEDY)[0] for one in prepared]
    assert together == alone
    assert [answer["completion_tokens"] for answer in together] == [10, 10, 10]
    assert {answer["finish_reason"] for answer in together} == {"length"}


def test_the_text_is_a_plain_pipelines(predictor):
    prompt = "The capital of Japan"
    answer = predictor.predict([predictor.prepare({"prompt": prompt})], GREEDY)[0]
    plain = predictor.pipe(prompt, max_new_tokens=10, do_sample=False, return_full_text=False)
    assert answer["text"] == plain[0]["generated_text"]
    assert answer["prompt_tokens"] == len(predictor.pipe.tokenizer(prompt)["input_ids"])


def test_a_chat_is_rendered_with_the_models_template(predictor):
    messages = chat_for(predictor)
    prepared = predictor.prepare({"messages": messages})
    rendered = predictor.pipe.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True
    )
    ids = rendered if isinstance(rendered, list) else rendered["input_ids"]
    assert prepared.model_inputs[0]["input_ids"] == list(ids)


def test_the_end_of_turn_token_and_stop_strings_end_a_generation(predictor):
    prepared = predictor.prepare({"prompt": "The capital of France"})
    free = predictor.predict([prepared], {"max_new_tokens": 12, "temperature": 0})[0]
    assert free["finish_reason"] == "length"
    text = free["text"]
    at = next(i for i, c in enumerate(text)
              if i and c.isascii() and c.isalnum() and c not in text[:i])  # fmt: skip
    stopped = predictor.predict([prepared], {**GREEDY, "max_new_tokens": 12, "stop": text[at]})[0]
    assert stopped["text"] == text[:at]
    assert stopped["finish_reason"] == "stop"
    # the model's first greedy token made its end-of-turn token: nothing is said, and why
    first = predictor.pipe.model.generate(
        **predictor.pipe.tokenizer("The capital of France", return_tensors="pt"),
        max_new_tokens=1,
        do_sample=False,
    )[0, -1].item()
    config = predictor.pipe.model.generation_config
    kept = config.eos_token_id
    config.eos_token_id = first
    try:
        ended = predictor.predict([prepared], GREEDY)[0]
    finally:
        config.eos_token_id = kept
    assert (ended["text"], ended["finish_reason"], ended["completion_tokens"]) == ("", "stop", 1)


def test_a_seed_repeats_a_sample(predictor):
    prepared = [predictor.prepare("Hello")]
    sampled = {"max_new_tokens": 12, "temperature": 1.0, "top_k": 50, "seed": 7}
    first, again = (predictor.predict(prepared, sampled)[0] for _ in range(2))
    other = predictor.predict(prepared, {**sampled, "seed": 8})[0]
    assert first == again
    assert other["text"] != first["text"]


@pytest.mark.parametrize(
    ("parameters", "named"),
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": MAX_NEW_TOKENS_LIMIT + 1}, "max_new_tokens"),
        ({"max_new_tokens": 2.5}, "max_new_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"top_k": True}, "top_k"),
        ({"stop": ""}, "stop"),
        ({"stop": ["a", 3]}, "stop"),
        ({"stop": [str(i) for i in range(9)]}, "stop"),
        ({"seed": -1}, "seed"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"n": 0}, "n"),
        ({"raw_response": False}, "raw_response"),
        ({"max_length": 5}, "max_length"),
    ],
)
def test_each_bad_parameter_is_named_before_anything_is_queued(parameters, named):
    with pytest.raises(InstanceError, match=repr(named)):
        checked_generation_parameters(parameters)


def test_good_parameters_pass_as_given():
    given = {"max_new_tokens": 64, "temperature": 1, "top_p": 0.9, "top_k": 40, "stop": "\n",
             "seed": 0}  # fmt: skip
    assert checked_generation_parameters(given) == given
    # vLLM's every token, as transformers says it; no stop strings, as vLLM's default says it
    assert checked_generation_parameters({"top_k": -1, "stop": []}) == {"top_k": 0, "stop": []}


@pytest.mark.parametrize(
    "instance",
    [
        {"messages": []},
        {"messages": [{"role": "user"}]},
        {"messages": [{"role": "user", "content": 3}]},
        {"prompt": 3},
        {"text": "hello"},
        {"prompt": ""},
    ],
)
def test_an_instance_that_is_no_chat_or_prompt_is_refused(predictor, instance):
    with pytest.raises(InstanceError):
        predictor.prepare(instance)


def test_a_model_without_a_chat_template_takes_prompts_only(predictor):
    template = predictor.pipe.tokenizer.chat_template
    predictor.pipe.tokenizer.chat_template = None
    try:
        with pytest.raises(InstanceError, match="no chat template"):
            predictor.prepare({"messages": chat_for(predictor)})
        assert predictor.prepare({"prompt": "Hello"}).model_inputs
    finally:
        predictor.pipe.tokenizer.chat_template = template


@pytest.fixture(scope="module")
def endless(tmp_path_factory):
    """A small Llama whose generation config names no end-of-turn token: every answer is as
    long as asked."""
    from transformers import pipeline

    folder = save_family_model(FAMILIES["llama"], tmp_path_factory.mktemp("endless"))
    pipe = pipeline("text-generation", model=str(folder))
    pipe.model.generation_config.eos_token_id = None
    return GenerationPredictor(pipe, "text-generation")


def test_clients_asking_for_different_lengths_share_the_server_each_with_its_own(endless, capsys):
    prompts = [f"Tell me a joke number {i}" for i in range(8)]
    wanted = [3 if i % 2 else 17 for i in range(8)]
    alone = [endless.predict([endless.prepare(p)], {"max_new_tokens": n, "temperature": 0})[0]
             for p, n in zip(prompts, wanted, strict=True)]  # fmt: skip
    capsys.readouterr()
    with serve(endless, max_wait=0.3) as url:
        wait_ready(url)

        def ask(i: int) -> dict:
            body = {"instances": [{"prompt": prompts[i]}],
                    "parameters": {"max_new_tokens": wanted[i], "temperature": 0}}  # fmt: skip
            return httpx.post(url + "/predict", json=body, timeout=120).json()["predictions"][0]

        with ThreadPoolExecutor(8) as pool:
            together = list(pool.map(ask, range(8)))
    assert together == alone
    assert [answer["completion_tokens"] for answer in together] == wanted
    batches = [json.loads(line) for line in capsys.readouterr().out.splitlines()
               if line.startswith("{")]  # fmt: skip
    sizes = [b["batch_size"] for b in batches if b.get("message") == "prediction batch"]
    assert sum(sizes) == 8 and max(sizes) > 1, sizes  # the same lengths shared passes


def test_bad_generation_requests_are_400_and_cost_no_forward_pass(endless, capsys):
    with serve(endless) as url:
        wait_ready(url)
        capsys.readouterr()
        for parameters, named in [({"max_new_tokens": 0}, "max_new_tokens"),
                                  ({"temperature": -1}, "temperature"),
                                  ({"stop": 5}, "stop")]:  # fmt: skip
            answer = httpx.post(url + "/predict", json={"instances": [{"prompt": "Hi"}],
                                                       "parameters": parameters})  # fmt: skip
            assert answer.status_code == 400 and repr(named) in answer.json()["error"]
        chat = {"instances": [{"messages": [{"role": "user", "content": "Hi"}]}],
                "parameters": {"max_new_tokens": 4}}  # fmt: skip
        answer = httpx.post(url + "/predict", json=chat, timeout=60)
        assert answer.status_code == 200
        assert answer.json()["predictions"][0]["completion_tokens"] == 4
    forward_passes = [line for line in capsys.readouterr().out.splitlines()
                      if '"prediction batch"' in line]  # fmt: skip
    assert len(forward_passes) == 1  # the chat's only


def test_model_garden_instances_carry_their_own_parameters(endless):
    """As Model Garden's vLLM instances carry them: a probe asking for 3 tokens gets 3, each
    instance of one request its own length, an unknown field refused for its instance alone,
    `n` answers for `n`, and a batch job's `modelParameters: {"max_tokens": 50}` taken."""
    instances = [
        {"prompt": "Hello", "max_tokens": 3, "temperature": 0},
        {"prompt": "Hello", "max_tokens": 5, "temperature": 0, "top_p": 1.0, "top_k": 1,
         "raw_response": True},
        {"prompt": "Hello", "max_lenght": 3},
        {"prompt": "Hello", "max_tokens": 2, "n": 3, "temperature": 0},
    ]  # fmt: skip
    with serve(endless) as url:
        wait_ready(url)
        answer = httpx.post(url + "/predict", json={"instances": instances}, timeout=60)
        batch_job = httpx.post(url + "/predict", timeout=60, json={
            "instances": [{"prompt": "Hello"}], "parameters": {"max_tokens": 4}})  # fmt: skip
        overridden = httpx.post(url + "/predict", timeout=60, json={
            "instances": [{"prompt": "Hello", "max_tokens": 6}],
            "parameters": {"max_tokens": 4, "temperature": 0}})  # fmt: skip
    assert answer.status_code == 200, answer.text
    three, five, unknown, several = answer.json()["predictions"]
    assert three["completion_tokens"] == 3 and five["completion_tokens"] == 5
    assert five["text"].startswith(three["text"])
    assert "'max_lenght'" in unknown["error"] and "max_tokens" in unknown["error"]
    assert [one["completion_tokens"] for one in several] == [2, 2, 2]
    assert several[0]["text"] == several[2]["text"] == five["text"][: len(several[0]["text"])]
    assert batch_job.json()["predictions"][0]["completion_tokens"] == 4
    assert overridden.json()["predictions"][0]["completion_tokens"] == 6


def test_offline_predictions_of_mixed_instances_get_their_own_parameters(endless):
    prepared = [endless.prepare({"prompt": "Hello", "max_tokens": n}) for n in (2, 7, 2)]
    answers = endless.predict(prepared, {"temperature": 0})
    assert [answer["completion_tokens"] for answer in answers] == [2, 7, 2]
    with pytest.raises(InstanceError, match="not both"):
        endless.prepare({"prompt": "Hi", "max_tokens": 2, "max_new_tokens": 3})
