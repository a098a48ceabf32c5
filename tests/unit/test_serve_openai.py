"""The generation server's OpenAI routes called as their users call them: the real OpenAI SDK
pointed at a server on loopback, its answers compared with the server's own format for the
same request (greedy), and the Vertex AI request forms (predict with `@requestFormat`)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.support.chat_models import FAMILIES, save_family_model
from tests.support.helpers import wait_until
from tests.support.served_app import serve, streamed_choices, wait_ready
from trainer.tasks.text_generation.serving import GenerationPredictor

CHAT = [{"role": "user", "content": "What is two plus two?"}]
PARTS = [{"role": "user", "content": [{"type": "text", "text": "What is"},
                                       {"type": "text", "text": "two plus two?"}]}]  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny Llama's pipeline, its generation config naming no end-of-turn token (every
    answer as long as asked)."""
    from transformers import pipeline

    folder = save_family_model(FAMILIES["llama"], tmp_path_factory.mktemp("llama"))
    pipe = pipeline("text-generation", model=str(folder))
    pipe.model.generation_config.eos_token_id = None
    return pipe


@pytest.fixture(scope="module")
def served(tiny):
    """The tiny Llama served; yields (base URL, OpenAI client)."""
    from openai import OpenAI

    with serve(GenerationPredictor(tiny, "text-generation")) as url:
        wait_ready(url)
        yield url, OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def own_format(url: str, instance: dict, parameters: dict) -> dict:
    body = {"instances": [instance], "parameters": parameters}
    return httpx.post(url + "/predict", json=body, timeout=60).json()["predictions"][0]


def test_the_sdk_completes_a_chat_as_the_servers_own_format_answers_it(served):
    url, client = served
    answer = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=6,
                                            temperature=0)  # fmt: skip
    own = own_format(url, {"messages": CHAT}, {"max_new_tokens": 6, "temperature": 0})
    assert answer.object == "chat.completion" and answer.model == "tiny"
    (choice,) = answer.choices
    assert choice.message.role == "assistant"
    assert (choice.message.content, choice.finish_reason) == (own["text"], "length")
    assert answer.usage.prompt_tokens == own["prompt_tokens"]
    assert answer.usage.completion_tokens == 6 == own["completion_tokens"]
    assert answer.usage.total_tokens == own["prompt_tokens"] + 6
    parts = client.chat.completions.create(model="tiny", messages=PARTS,
                                           max_completion_tokens=6, temperature=0)  # fmt: skip
    joined = [{"role": "user", "content": "What is\ntwo plus two?"}]
    assert parts.choices[0].message.content == own_format(
        url, {"messages": joined}, {"max_new_tokens": 6, "temperature": 0})["text"]  # fmt: skip


def test_the_sdk_lists_the_one_model_served_and_finds_no_other(served, tiny):
    from openai import NotFoundError

    url, client = served
    (listed,) = client.models.list().data
    assert (listed.id, listed.object) == (tiny.model.name_or_path, "model")
    assert client.models.retrieve(listed.id) == listed
    with pytest.raises(NotFoundError, match="is not served here"):
        client.models.retrieve("another-model")


def test_the_sdk_asks_for_n_choices_and_stop_strings(served):
    url, client = served
    several = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=4, n=3,
                                             temperature=0)  # fmt: skip
    assert [c.index for c in several.choices] == [0, 1, 2]
    assert len({c.message.content for c in several.choices}) == 1  # greedy: one answer
    assert several.usage.completion_tokens == 12
    free = own_format(url, {"messages": CHAT}, {"max_new_tokens": 12, "temperature": 0})["text"]
    stop = next(c for c in free[1:] if c.isalnum())
    stopped = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=12,
                                             temperature=0, stop=[stop])  # fmt: skip
    assert stopped.choices[0].message.content == free[: free.index(stop, 1)]
    assert stopped.choices[0].finish_reason == "stop"


def test_the_sdk_streams_a_chat_chunk_by_chunk_with_its_usage(served):
    url, client = served
    whole = client.chat.completions.create(model="tiny", messages=PARTS, max_tokens=24,
                                           temperature=0)  # fmt: skip
    stream = client.chat.completions.create(
        model="tiny", messages=PARTS, max_tokens=24, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(texts) == whole.choices[0].message.content
    assert len(texts) > 1  # pieces, not the whole answer at once
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert len({c.id for c in chunks}) == 1
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24


def test_the_sdk_streams_n_choices_each_as_it_is_answered_whole(served):
    """n: 2 streamed, each chunk naming its choice (`generate()`'s rows here: a seeded sample
    is generated there, so the stream and the whole answer draw the same tokens)."""
    _, client = served
    asked = {"model": "tiny", "messages": CHAT, "max_tokens": 8, "n": 2, "temperature": 0.9,
             "seed": 5}  # fmt: skip
    whole = client.chat.completions.create(**asked)
    chunks = list(client.chat.completions.create(**asked, stream=True))
    texts, ends = streamed_choices(chunks, 2)
    assert texts == [choice.message.content for choice in whole.choices]
    assert texts[0] != texts[1]  # two samples, each in its own choice
    assert ends == ["length", "length"]
    pieces = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 2  # as generated, not each answer at once


def test_the_sdk_completes_and_streams_a_prompt(served):
    url, client = served
    answer = client.completions.create(model="tiny", prompt="The capital of France",
                                       max_tokens=5, temperature=0)  # fmt: skip
    own = own_format(url, {"prompt": "The capital of France"}, {"max_new_tokens": 5,
                                                                "temperature": 0})  # fmt: skip
    assert answer.choices[0].text == own["text"] and answer.usage.completion_tokens == 5
    streamed = client.completions.create(model="tiny", prompt="The capital of France",
                                         max_tokens=5, temperature=0, stream=True)  # fmt: skip
    assert "".join(c.choices[0].text for c in streamed) == own["text"]
    default = client.completions.create(model="tiny", prompt="Hello", temperature=0)
    assert default.usage.completion_tokens == 16  # OpenAI's default length of a completion


def test_the_sdk_is_told_what_the_server_cannot_honour(served):
    from openai import BadRequestError

    url, client = served
    for extra, named in [({"presence_penalty": 0.5}, "presence_penalty"),
                         ({"max_tokens": 0}, "max_tokens"), ({"top_logprobs": 2}, "logprobs: true"),
                         ({"logprobs": True, "top_logprobs": 21}, "0 to 20"),
                         ({"extra_body": {"frobnicate": 1}}, "frobnicate")]:  # fmt: skip
        with pytest.raises(BadRequestError, match=named):
            client.chat.completions.create(model="tiny", messages=CHAT, **extra)
    with pytest.raises(BadRequestError, match="image_url"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:,"}}]}])  # fmt: skip
    for extra, named in [({"response_format": {"type": "json_object"}}, "response_format"),
                         ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
                         ({"store": True}, "store")]:  # fmt: skip
        with pytest.raises(BadRequestError, match=named):
            client.chat.completions.create(model="tiny", messages=CHAT, **extra)
    for body, said in [
        ({"stream": "true"}, "stream must be true or false"),
        ({"stream_options": {"include_usage": True}}, "stream_options needs stream: true"),
    ]:
        answer = httpx.post(url + "/v1/chat/completions", json={"messages": CHAT} | body)
        assert (answer.status_code, answer.json()["error"]["message"]) == (400, said)


def test_fields_a_client_sends_at_values_that_change_nothing_are_taken(served):
    """As clients that write every optional field send them: null, or a value that changes
    nothing here (no tools, plain text, no stop strings)."""
    url, client = served
    plain = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=4,
                                           temperature=0)  # fmt: skip
    neutral = {"stop": [], "logit_bias": {}, "response_format": {"type": "text"}, "tools": [],
               "tool_choice": "none", "parallel_tool_calls": True, "store": False,
               "metadata": {"app": "x"}, "modalities": ["text"], "seed": None, "user": "u",
               "stream_options": None}  # fmt: skip
    for extra in ({name: None for name in neutral}, neutral):
        answer = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=4,
                                                temperature=0, extra_body=extra)  # fmt: skip
        assert answer.choices[0].message.content == plain.choices[0].message.content


def greedy_logprobs(pipe, prompt_ids: list[int], tokens: int):
    """Plain transformers on the served model: the greedy answer's ids (`generate()`), and a
    forward pass's log-softmax over the prompt and that answer: each answer token's
    log-probability and the 3 largest at its position."""
    import torch

    model = pipe.model
    with torch.inference_mode():
        ids = model.generate(torch.tensor([prompt_ids]), max_new_tokens=tokens, do_sample=False,
                             eos_token_id=None)[0].tolist()  # fmt: skip
        logits = model(torch.tensor([ids])).logits[0].float()
    positions = logits.log_softmax(-1)[len(prompt_ids) - 1 : -1]
    answer = ids[len(prompt_ids) :]
    own = positions.gather(1, torch.tensor(answer)[:, None]).squeeze(1).tolist()
    return answer, own, positions.topk(3, dim=-1).values.tolist()


def test_the_sdk_gets_each_tokens_logprob_and_the_most_likely_beside_it(served, tiny):
    """`logprobs` with `top_logprobs` (a chat) and a completion's `logprobs` count: each
    answer token and its log-probability, and the most likely ones beside it, are those of
    plain transformers' greedy answer and a forward pass's log-softmax over it (the raw
    distribution, as vLLM reports by default); refused while streaming."""
    from openai import BadRequestError

    _, client = served
    tokenizer = tiny.tokenizer
    chat = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=5,
                                          temperature=0, logprobs=True, top_logprobs=3)  # fmt: skip
    (choice,) = chat.choices
    tokens = choice.logprobs.content
    prompt = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True,
                                           return_dict=True)["input_ids"]  # fmt: skip
    answer, own, top = greedy_logprobs(tiny, list(prompt), 5)
    assert [entry.token for entry in tokens] == [tokenizer.decode([i]) for i in answer]
    assert [entry.logprob for entry in tokens] == pytest.approx(own, abs=1e-4)
    shown = [t.logprob for entry in tokens for t in entry.top_logprobs]
    assert shown == pytest.approx([value for row in top for value in row], abs=1e-4)
    assert all(entry.bytes == list(entry.token.encode()) for entry in tokens)

    text = client.completions.create(model="tiny", prompt="Hello", max_tokens=4, temperature=0,
                                     logprobs=2)  # fmt: skip
    logprobs = text.choices[0].logprobs
    answer, own, top = greedy_logprobs(tiny, tokenizer("Hello")["input_ids"], 4)
    assert logprobs.tokens == [tokenizer.decode([i]) for i in answer]
    assert logprobs.text_offset == [len("".join(logprobs.tokens[:i])) for i in range(4)]
    assert logprobs.token_logprobs == pytest.approx(own, abs=1e-4)
    # keyed by the token's text, as OpenAI writes them: two tokens of one text are one entry
    assert all(1 <= len(most) <= 2 for most in logprobs.top_logprobs)
    assert [max(most.values()) for most in logprobs.top_logprobs] == pytest.approx(
        [row[0] for row in top], abs=1e-4)  # fmt: skip
    with pytest.raises(BadRequestError, match="logprobs are answered whole"):
        client.chat.completions.create(model="tiny", messages=CHAT, logprobs=True, stream=True)


def test_predict_takes_chat_completions_instances_as_model_garden_does(served):
    url, client = served
    instance = {"@requestFormat": "chatCompletions", "messages": PARTS, "max_tokens": 5,
                "temperature": 0}  # fmt: skip
    answer = httpx.post(url + "/predict", json={"instances": [instance, {"prompt": "Hi",
                        "max_tokens": 2}]}, timeout=60).json()["predictions"]  # fmt: skip
    sdk = client.chat.completions.create(model="tiny", messages=PARTS, max_tokens=5,
                                         temperature=0)  # fmt: skip
    assert answer[0]["object"] == "chat.completion"
    assert answer[0]["choices"][0]["message"]["content"] == sdk.choices[0].message.content
    assert answer[0]["usage"] == {
        "prompt_tokens": sdk.usage.prompt_tokens,
        "completion_tokens": 5,
        "total_tokens": sdk.usage.total_tokens,
    }
    assert answer[1]["completion_tokens"] == 2


def test_a_streamed_answer_comes_as_it_is_generated_not_at_the_end(served):
    import time

    _, client = served
    started = time.monotonic()
    arrivals = []
    for chunk in client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=300,
                                                temperature=0, stream=True):  # fmt: skip
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.monotonic() - started)
    assert len(arrivals) > 10
    assert arrivals[0] < arrivals[-1] / 3, arrivals  # the first piece long before the last


def test_raw_predict_bodies_on_the_prediction_route_are_answered_as_openais(served):
    """rawPredict and streamRawPredict pass the body as it is to the prediction route, as
    Model Garden's notebooks send OpenAI bodies through them."""
    import json

    url, client = served
    body = {"model": "tiny", "messages": PARTS, "max_tokens": 5, "temperature": 0}
    raw = httpx.post(url + "/predict", json=body, timeout=60).json()
    sdk = client.chat.completions.create(**body)
    assert raw["object"] == "chat.completion"
    assert raw["choices"][0]["message"]["content"] == sdk.choices[0].message.content
    with httpx.stream("POST", url + "/predict", json=body | {"stream": True},
                      timeout=60) as streamed:  # fmt: skip
        assert streamed.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in streamed.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    pieces = [json.loads(line[6:])["choices"][0]["delta"].get("content") for line in lines[:-1]]
    assert "".join(p for p in pieces if p) == sdk.choices[0].message.content
    completion = httpx.post(
        url + "/predict", timeout=60, json={"prompt": "Hello", "max_tokens": 3, "temperature": 0}
    ).json()
    assert completion["object"] == "text_completion"
    assert completion["usage"]["completion_tokens"] == 3


def test_a_prompt_too_long_for_its_tokens_is_refused_streamed_or_not(served, tiny):
    """With a 400 before any event, as vLLM refuses it; a length nobody asked for is cut to
    what the prompt leaves instead."""
    from openai import BadRequestError

    _, client = served
    long = [{"role": "user", "content": "Hello " * 130}]
    for stream in (False, True):
        with pytest.raises(BadRequestError, match="positions") as refused:  # at the status
            client.chat.completions.create(model="tiny", messages=long, max_tokens=200,
                                           stream=stream)  # fmt: skip
        assert refused.value.code == "context_length_exceeded"
    positions = tiny.model.config.max_position_embeddings
    answer = client.chat.completions.create(model="tiny", messages=long, temperature=0)
    assert answer.usage.prompt_tokens > positions - 256  # the default, 256, would not fit
    assert answer.usage.total_tokens <= positions
    streamed = client.chat.completions.create(model="tiny", messages=long, temperature=0,
                                              stream=True)  # fmt: skip
    assert streamed_choices(list(streamed), 1)[0] == [answer.choices[0].message.content]


class HeldPredictor(GenerationPredictor):
    """Its `generate()` waits for `release` first: a request held on the model's thread."""

    def __init__(self, pipe, task: str) -> None:
        super().__init__(pipe, task)
        self.holding, self.release = threading.Event(), threading.Event()

    def generate(self, batch, parameters):
        self.holding.set()
        self.release.wait(60)
        return super().generate(batch, parameters)


def test_a_streamed_request_the_queue_cannot_take_is_a_503_before_any_event(tiny):
    """The SDK retries a 503; an error inside a started stream it cannot."""
    from openai import InternalServerError, OpenAI

    predictor = HeldPredictor(tiny, "text-generation")
    with serve(predictor, queue_size=1) as url:
        wait_ready(url)
        client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        ask = {"model": "tiny", "messages": CHAT, "temperature": 0}
        with ThreadPoolExecutor(2) as pool:
            try:
                # One held on the model's thread, the next waiting in the queue: it is full.
                running = [pool.submit(client.chat.completions.create, **ask, max_tokens=3)]
                wait_until(predictor.holding.is_set, 60, "a request on the model's thread")
                running.append(pool.submit(client.chat.completions.create, **ask, max_tokens=4))
                wait_until(lambda: httpx.get(url + "/health").json()["queued"] == 1, 60,
                           "a request queued behind it")  # fmt: skip
                with pytest.raises(InternalServerError, match="waiting; try again") as refused:
                    client.chat.completions.create(**ask, max_tokens=3, stream=True)
                assert refused.value.status_code == 503
            finally:
                predictor.release.set()
            assert [r.result().usage.completion_tokens for r in running] == [3, 4]
