"""The server's continuous batching (trainer/tasks/text_generation/continuous_batching.py):
transformers' engine behind the text-generation predictor, through the real server on a
loopback port, tiny models of real families (tests/support/chat_models.py)."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.support.chat_models import FAMILIES, save_family_model
from tests.support.helpers import wait_until
from tests.support.served_app import serve, streamed_choices, wait_ready
from trainer.tasks.text_generation.continuous_batching import (
    honours,
    processor_arguments,
    stop_written,
)
from trainer.tasks.text_generation.serving import GenerationPredictor

PROMPTS = [f"Tell me a joke number {i}" for i in range(6)]
LONG = 400
"""The long generations' tokens, beside which short requests are answered (the tiny models
have 512 positions)."""


def endless_predictor(family: str, folder):
    """A tiny model whose generation config names no end-of-turn token: every answer is as
    long as asked."""
    from transformers import pipeline

    pipe = pipeline("text-generation", model=str(save_family_model(FAMILIES[family], folder)))
    pipe.model.generation_config.eos_token_id = None
    return GenerationPredictor(pipe, "text-generation")


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def alone_then_engine(request, tmp_path_factory):
    """(each prompt's greedy answer by `generate()` alone, the predictor); each test starts
    its engine, which the server stops when it stops (as `python -m trainer.serve` does)."""
    predictor = endless_predictor(request.param, tmp_path_factory.mktemp(request.param))
    wanted = [3 if i % 2 else 17 for i in range(len(PROMPTS))]
    alone = [predictor.predict([predictor.prepare(p)], {"max_new_tokens": n, "temperature": 0})[0]
             for p, n in zip(PROMPTS, wanted, strict=True)]  # fmt: skip
    return alone, wanted, predictor


def predicted(url: str, prompt: str, **parameters) -> dict | list:
    """The server's answer to one prompt with these parameters (a list of `n`)."""
    body = {"instances": [{"prompt": prompt}], "parameters": parameters}
    return httpx.post(url + "/predict", json=body, timeout=300).json()["predictions"][0]


def logged(capsys, message: str) -> list[dict]:
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()
             if line.startswith("{")]  # fmt: skip
    return [line for line in lines if line.get("message") == message]


def test_which_requests_the_engine_takes():
    """All but a seeded sample (the engine's samples come from one random stream) and
    log-probabilities (it reports none beside the token it chose)."""
    for asked in ({"max_new_tokens": 5}, {"temperature": 0, "top_p": 0.5, "seed": 3},
                  {"temperature": 0.7}, {"top_k": 5, "n": 3}, {"stop": ["\n"]}):  # fmt: skip
        assert honours(asked, model_samples=False), asked
    assert honours({}, model_samples=True)
    for asked in ({"seed": 3}, {"logprobs": 0}):
        assert not honours(asked, model_samples=True), asked
    assert not honours({"temperature": 0.7, "seed": 3}, model_samples=False)


def test_each_request_samples_as_generate_would_over_the_models_config():
    from transformers import GenerationConfig

    greedy = {"temperature": 1.0, "top_k": 1, "top_p": 1.0}
    plain = GenerationConfig()  # nothing set: generate() takes transformers' defaults
    assert processor_arguments({}, plain, 1000) == greedy
    assert processor_arguments({"temperature": 0.7}, plain, 1000) == {
        "temperature": 0.7, "top_k": 50, "top_p": 1.0}  # fmt: skip
    assert processor_arguments({"top_k": 0, "top_p": 0.5}, plain, 1000) == {
        "temperature": 1.0, "top_k": 1000, "top_p": 0.5}  # fmt: skip
    llama = GenerationConfig(do_sample=True, temperature=0.6, top_p=0.9)  # Llama 3.1's
    assert processor_arguments({"top_k": 7}, llama, 1000) == {
        "temperature": 0.6, "top_k": 7, "top_p": 0.9}  # fmt: skip
    assert processor_arguments({"temperature": 0}, llama, 1000) == greedy


def test_a_stop_string_is_seen_in_the_newest_tokens_when_the_whole_answer_shows_it():
    """The engine decodes only an answer's newest tokens at each step: for stop strings of
    several byte-level tokens each (characters outside the tokenizer's vocabulary), written
    60 tokens in, it says a stop string is written at exactly the token from which the whole
    answer's text holds one."""
    from tests.support.chat_models import family_tokenizer

    tokenizer = family_tokenizer(FAMILIES["llama"], PROMPTS)
    stops = ["ééé", "ø!", "two words"]
    for stop in stops:
        ids = tokenizer("a b " * 30 + stop + " and on", add_special_tokens=False)["input_ids"]
        written = stop_written(tokenizer, stops)
        whole = [any(s in tokenizer.decode(ids[:k], skip_special_tokens=True) for s in stops)
                 for k in range(len(ids) + 1)]  # fmt: skip
        assert whole.index(True) > 60 and len(tokenizer(stop)["input_ids"]) > 2, stop
        assert [written(ids[:k]) for k in range(len(ids) + 1)] == whole, stop


def test_greedy_answers_together_through_the_server_equal_each_alone(alone_then_engine, capsys):
    alone, wanted, predictor = alone_then_engine
    assert predictor.start_engine() is None
    capsys.readouterr()
    with serve(predictor) as url:
        wait_ready(url)

        def ask(i: int) -> dict:
            return predicted(url, PROMPTS[i], max_new_tokens=wanted[i], temperature=0)

        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            together = list(pool.map(ask, range(len(PROMPTS))))
        several = {"instances": [{"prompt": PROMPTS[0], "n": 2}, {"prompt": PROMPTS[1]}],
                   "parameters": {"max_new_tokens": 3, "temperature": 0}}  # fmt: skip
        mixed = httpx.post(url + "/predict", json=several, timeout=120).json()["predictions"]
    assert together == alone
    engine_lines = logged(capsys, "continuous batching prediction")
    assert sorted(line["completion_tokens"] for line in engine_lines) == sorted([*wanted, 2 * 3,
                                                                                3])  # fmt: skip
    # n: 2 is two requests of the engine's, the other instance one
    assert [len(mixed[0]), mixed[1]] == [2, alone[1]]
    assert mixed[0][0] == mixed[0][1]
    assert mixed[0][0]["text"] == alone[0]["text"][: len(mixed[0][0]["text"])]


def test_a_short_request_joins_a_long_one_at_its_next_steps(alone_then_engine, capsys):
    """While a 400-token generation runs, a 4-token request is answered within its own
    tokens and a few engine steps, before the long one ends (the batcher's generate() made
    it wait for all 400): counted in the engine's steps, which the server logs per request."""
    _, _, predictor = alone_then_engine
    assert predictor.start_engine() is None
    capsys.readouterr()
    with serve(predictor) as url:
        wait_ready(url)
        long_body = {"instances": [{"prompt": PROMPTS[0]}],
                     "parameters": {"max_new_tokens": LONG, "temperature": 0}}  # fmt: skip
        answers: list = []
        long = threading.Thread(target=lambda: answers.append(
            httpx.post(url + "/predict", json=long_body, timeout=300).json()))  # fmt: skip
        long.start()
        engine = predictor.continuous.greedy
        wait_until(lambda: engine.step() > 20, 120, "the long generation to be under way")
        short = httpx.post(url + "/predict", timeout=120, json={
            "instances": [{"prompt": PROMPTS[1]}],
            "parameters": {"max_new_tokens": 4, "temperature": 0}})  # fmt: skip
        long.join()
    assert short.json()["predictions"][0]["completion_tokens"] == 4
    assert "predictions" in answers[0]
    # In the order they ended: the short one, sent once the long one was 20 steps in, ended
    # first, beside it.
    short_line, long_line = logged(capsys, "continuous batching prediction")
    # (a model may write its tokenizer's end-of-sequence token: the answer then ends there,
    # as generate()'s would, though all 400 tokens were generated)
    assert short_line["completion_tokens"] == 4 and long_line["engine_steps"] >= LONG
    assert short_line["engine_steps"] <= 4 + 4, short_line  # its prefill, its 4, a few more


def test_sampled_and_stopped_requests_join_a_long_one_at_their_next_steps(alone_then_engine,
                                                                          capsys):  # fmt: skip
    """Beside two 400-token generations, one greedy, one sampled (one in each engine),
    requests that sample (each with its own temperature, top-k and top-p, `n` of them) or
    stop at a string are answered within their own tokens and a few steps of their engine,
    as `generate()` would answer them: a top-k or top-p that keeps
    one token is greedy whatever the temperature, a hot sample's answers differ, and a stop
    string ends the answer as `generate()`'s stop_strings do. Only a seeded sample
    goes to `generate()` (its `prediction batch` line), and draws the same tokens twice."""
    alone, wanted, predictor = alone_then_engine
    stop_in = alone[0]["text"]
    stop = stop_in[len(stop_in) // 2 : len(stop_in) // 2 + 2]
    stopped_alone = predictor.predict([predictor.prepare(PROMPTS[0])], {
        "max_new_tokens": wanted[0], "temperature": 0, "stop": [stop]})[0]  # fmt: skip
    assert predictor.start_engine() is None
    capsys.readouterr()
    with serve(predictor) as url:
        wait_ready(url)

        def ask(prompt: str, **parameters) -> list | dict:
            return predicted(url, prompt, **parameters)

        with ThreadPoolExecutor(6) as pool:
            longs = [pool.submit(ask, PROMPTS[2], max_new_tokens=LONG, temperature=temperature)
                     for temperature in (0, 1.0)]  # fmt: skip
            engines = predictor.continuous
            wait_until(lambda: min(engines.greedy.step(), engines.sampling.step()) > 20, 120,
                       "the long generations to be under way")  # fmt: skip
            # sent together (one after another, on a busy machine, they could outlast a long one)
            shorts = [
                pool.submit(ask, PROMPTS[0], max_new_tokens=wanted[0], temperature=1.5, top_k=1),
                pool.submit(ask, PROMPTS[0], max_new_tokens=wanted[0], temperature=1.5,
                            top_p=1e-6),
                pool.submit(ask, PROMPTS[1], max_new_tokens=6, temperature=50.0, top_k=0, n=3),
                pool.submit(ask, PROMPTS[0], max_new_tokens=wanted[0], temperature=0,
                            stop=[stop]),
            ]  # fmt: skip
            *one_token, hot, stopped = [short.result() for short in shorts]
            for long in longs:
                long.result()
            seeded = [ask(PROMPTS[1], max_new_tokens=6, temperature=1.0, seed=9) for _ in "ab"]
    assert one_token == [alone[0], alone[0]]
    assert len(hot) == 3 and len({answer["text"] for answer in hot}) > 1
    # the same answer, its request out of the batch at the token that wrote the stop string
    assert stopped == stopped_alone and stopped["finish_reason"] == "stop"
    assert stopped["completion_tokens"] < wanted[0]
    assert seeded[0] == seeded[1]
    out = capsys.readouterr().out
    engine_lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    by_engine = [line for line in engine_lines
                 if line.get("message") == "continuous batching prediction"]  # fmt: skip
    # in the order they ended: the four short ones, then the long ones
    *short, last, other = by_engine
    assert len(short) == 4 and min(last["engine_steps"], other["engine_steps"]) >= LONG
    assert all(line["engine_steps"] <= wanted[0] + 4 for line in short), short
    batches = [line for line in engine_lines if line.get("message") == "prediction batch"]
    assert len(batches) == 2  # the two seeded samples


def test_a_stop_string_late_in_a_long_answer_ends_it_there(alone_then_engine):
    """A stop string first written well past the newest tokens the engine decodes at each
    step (16 for a 2-character stop) still ends the answer there: its text cut before it,
    `finish_reason` stop, at the token that wrote it (the fewest tokens whose unstopped
    answer holds it). (The engine's own unstopped
    answer is the reference: over 80 tokens a tiny random model's near-tied logits may
    part the engine's greedy answer from `generate()`'s.)"""
    _, _, predictor = alone_then_engine
    asked = {"max_new_tokens": 80, "temperature": 0}
    assert predictor.start_engine() is None
    with serve(predictor) as url:
        wait_ready(url)
        texts = [predicted(url, prompt, **asked)["text"] for prompt in PROMPTS]
        # the 2-character string (no replacement character) first written latest in any
        at, stop, prompt = max((text.find(text[i : i + 2]), text[i : i + 2], prompt)
                               for text, prompt in zip(texts, PROMPTS, strict=True)
                               for i in range(len(text) - 1)
                               if "\ufffd" not in text[i : i + 2])  # fmt: skip
        stopped = predicted(url, prompt, **asked, stop=[stop])
        low, high = 1, 80  # the fewest tokens whose text holds the stop string, unstopped
        while low < high:
            middle = (low + high) // 2
            written = predicted(url, prompt, max_new_tokens=middle, temperature=0)["text"]
            low, high = (low, middle) if stop in written else (middle + 1, high)
    assert (stopped["text"], stopped["finish_reason"]) == (texts[PROMPTS.index(prompt)][:at],
                                                           "stop")  # fmt: skip
    assert stopped["completion_tokens"] == low > 2 * 16, (stopped, stop)


def test_each_sample_in_one_batch_keeps_its_own_top_k(alone_then_engine):
    """Hot samples (temperature 50: near uniform) of one token, sent together: those asking
    for top-k 3 come out as at most 3 tokens, those asking for no top-k as many more."""
    _, _, predictor = alone_then_engine
    assert predictor.start_engine() is None
    with serve(predictor) as url:
        wait_ready(url)

        def texts(top_k: int) -> list[str]:
            answers = predicted(url, PROMPTS[3], max_new_tokens=1, temperature=50.0,
                                top_k=top_k, n=16)  # fmt: skip
            return [answer["text"] for answer in answers]

        with ThreadPoolExecutor(6) as pool:
            kept, free = [pool.map(texts, [k] * 3) for k in (3, 0)]
            kept, free = sum(kept, []), sum(free, [])
    assert 1 < len(set(kept)) <= 3 < len(set(free)), (set(kept), set(free))


def test_the_sdk_streams_through_the_engine_what_it_answers_whole(alone_then_engine, capsys):
    from openai import OpenAI

    _, _, predictor = alone_then_engine
    assert predictor.start_engine() is None
    capsys.readouterr()
    with serve(predictor) as url:
        wait_ready(url)
        client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        messages = [{"role": "user", "content": "What is two plus two?"}]
        whole = client.chat.completions.create(model="tiny", messages=messages, max_tokens=12,
                                               temperature=0)  # fmt: skip
        stream = client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=12, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        chunks = list(stream)
        pair = list(
            client.chat.completions.create(
                model="tiny", messages=messages, n=2, max_tokens=12, temperature=0, stream=True
            )
        )
        prompt = client.completions.create(model="tiny", prompt=PROMPTS[2], max_tokens=5,
                                           temperature=0, stream=True)  # fmt: skip
        completed = "".join(c.choices[0].text for c in prompt)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == 12
    texts, ends = streamed_choices(pair, 2)
    assert texts == [whole.choices[0].message.content] * 2  # n: 2, each choice streamed
    assert ends == ["length", "length"]
    alone = predictor.predict([predictor.prepare(PROMPTS[2])], {"max_new_tokens": 5,
                                                                "temperature": 0})[0]  # fmt: skip
    assert completed == alone["text"]
    assert len(logged(capsys, "continuous batching prediction")) == 4


@pytest.mark.parametrize("how", ["stream closed", "client timed out"])
def test_a_chat_whose_caller_goes_leaves_the_engine_at_once(alone_then_engine, how):
    """A client that closes a 400-token stream after its first chunks, or times out waiting
    for the whole answer (as the OpenAI SDK does, and then retries), frees its place in the
    batch: the engine stops stepping for it then, not 400 tokens later (no step is spent on
    an answer nobody reads)."""
    from openai import APITimeoutError, OpenAI

    _, _, predictor = alone_then_engine
    assert predictor.start_engine() is None
    with serve(predictor) as url:
        wait_ready(url)
        client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        engine = predictor.continuous.greedy
        begun = engine.step()
        chat = {"model": "tiny", "messages": [{"role": "user", "content": PROMPTS[0]}],
                "max_tokens": 400, "temperature": 0}  # fmt: skip
        if how == "stream closed":
            stream = client.chat.completions.create(**chat, stream=True)
            for _ in zip(range(4), stream, strict=False):
                pass
            stream.close()
        else:
            with pytest.raises(APITimeoutError):
                client.with_options(timeout=0.2).chat.completions.create(**chat)
        gone_at = engine.step() - begun
        wait_until(lambda: not engine.waiting, 60, "the request to leave the engine")
        time.sleep(1)  # time for 200 more steps, were it still in the batch
        stepped = engine.step() - begun
        # Its outputs of the steps it was still in, for no handler: not kept.
        unclaimed = engine.manager.output_router.output_queue.qsize()
    assert stepped - gone_at < 100, f"its caller gone at step {gone_at}, it ran to {stepped}"
    assert unclaimed == 0


def test_a_prompt_too_long_for_its_tokens_is_refused_alone_with_its_numbers(alone_then_engine):
    _, _, predictor = alone_then_engine
    assert predictor.start_engine() is None
    limit = predictor.positions()
    with serve(predictor) as url:
        wait_ready(url)
        body = {"instances": [{"prompt": "Hello"}, {"prompt": "Hello", "max_tokens": limit}],
                "parameters": {"max_tokens": 3, "temperature": 0}}  # fmt: skip
        fits, refused = httpx.post(url + "/predict", json=body, timeout=60).json()["predictions"]
    assert fits["completion_tokens"] == 3
    assert f"over the model's {limit} positions" in refused["error"]


def test_a_dead_engine_stops_the_server_with_one_line(tmp_path, capsys):
    """The engine's thread dies (its forward pass raises): the request it held fails as the
    server's fault (500, not its own 400), so does a request on the model's thread meanwhile
    (at once, not when, or if, its forward pass ends), health turns 503, and one line says
    why (`python -m trainer.serve` then ends, exit 1, and a worker of --workers is started
    again: the batching loop's own stop)."""
    predictor = endless_predictor("llama", tmp_path)
    assert predictor.start_engine() is None
    layer = predictor.pipe.model.model.layers[0].mlp
    on_thread, go_on = threading.Event(), threading.Event()
    plain_generate = predictor.generate

    def held_generate(batch, parameters):
        on_thread.set()
        go_on.wait(60)
        return plain_generate(batch, parameters)

    def broken(*args, **kwargs):
        raise RuntimeError("a broken layer")

    predictor.generate = held_generate
    ask = {"instances": [{"prompt": "Hello"}], "parameters": {"max_tokens": 3}}
    seeded = {"instances": [{"prompt": "Hello"}],
              "parameters": {"max_tokens": 3, "temperature": 0.7, "seed": 1}}  # fmt: skip
    with serve(predictor) as url, ThreadPoolExecutor(1) as pool:
        wait_ready(url)
        capsys.readouterr()
        try:
            on_generate = pool.submit(httpx.post, url + "/predict", json=seeded, timeout=60)
            wait_until(on_thread.is_set, 60, "the seeded sample on the model's thread")
            layer.forward = broken
            failed = httpx.post(url + "/predict", json=ask, timeout=60)
            held = on_generate.result()
            wait_until(lambda: httpx.get(url + "/health").status_code == 503, 60, "health 503")
        finally:
            go_on.set()
    assert (failed.status_code, held.status_code) == (500, 500), (failed.text, held.text)
    assert held.json() == {"error": "the prediction failed: EngineStopped"}
    errors = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert errors == ["error: the batching loop stopped: EngineStopped: the continuous "
                      "batching engine failed: RuntimeError: a broken layer; health answers "
                      "503 from now on"]  # fmt: skip


def test_a_model_the_engine_would_serve_otherwise_keeps_generate(tmp_path):
    """A repetition penalty the engine would drop, an eager attention it would make paged:
    no engine, one line saying why, every request on generate()."""
    from transformers import pipeline

    penalised = endless_predictor("llama", tmp_path / "llama")
    penalised.pipe.model.generation_config.repetition_penalty = 1.3
    assert penalised.start_engine() == (
        "continuous batching off: its generation config processes the logits "
        "(RepetitionPenaltyLogitsProcessor); every request uses generate()"
    )
    gemma = save_family_model(FAMILIES["gemma2"], tmp_path / "gemma2")
    eager = GenerationPredictor(pipeline("text-generation", model=str(gemma)), "text-generation")
    assert "its attention is eager" in eager.start_engine()
    assert penalised.engine() is None and eager.engine() is None
