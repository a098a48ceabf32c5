"""How a delivered causal language model serves: a chat (`{"messages": [...]}`, rendered with
the model's own chat template) or a prompt (`{"prompt": "..."}`) in, the generated text out,
with why it ended and how many tokens it took.

On the server, a request goes to transformers' continuous batching engine
(continuous_batching.py: `start_engine`, `engine`), joining its running batch at the next
step, unless it asks for what only `generate()` gives (a seeded sample, log-probabilities).
Those, and every request of `trainer.predict` and `--do_predict`, are generated here: the
server's batcher (trainer/serve/batching.py) groups instances whose parameters are equal,
and `predict` left-pads their prompts into one `generate()` call, so each row's positions
and attention ignore the padding and its text is the one it would get alone
(tests/unit/test_generation_serving.py compares them). Requests with other parameters go in
other batches, one after the other on the model's thread.

The decoding is transformers' own `generate()` with the model's `generation_config.json` as
the defaults a request's parameters override: sampling (`temperature` > 0), `top_p`, `top_k`,
`stop` strings (`stop_strings`), the end-of-turn tokens the config names. Every parameter is
checked before the instance is queued, so a bad value is a 400 that costs no forward pass.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from trainer.tasks.instance_media import InstanceError
from trainer.tasks.predictor import Predictor, Prepared
from trainer.tasks.text_generation.chat_completions import (
    CHAT,
    COMPLETIONS,
    REQUEST_FORMAT,
    message_text,
    openai_request,
    reply,
)
from trainer.tasks.text_generation.continuous_batching import (
    ContinuousEngines,
    ContinuousPredictions,
    engine_refusal,
)
from trainer.tasks.text_generation.logprobs import (
    MAX_TOP_LOGPROBS,
    answer_logprobs,
    covering,
    step_logprobs,
)

DEFAULT_MAX_NEW_TOKENS = 256
"""Tokens generated when neither the request nor the model's generation_config.json says."""
MAX_NEW_TOKENS_LIMIT = 8192
"""The most one request may ask for: a larger value is a 400, not an hour on the GPU."""
MAX_STOP_STRINGS = 8
MAX_CHOICES = 16
"""The most answers (`n`) one instance may ask for."""
PROMPT_FIELDS = ("prompt", "messages")
"""An instance object's own text; its other fields are parameters (`PARAMETER_CHECKS`)."""

FINISHED_BY_STOP = "stop"
"""The model ended its turn (an end-of-sequence token) or wrote one of the `stop` strings."""
FINISHED_BY_LENGTH = "length"
"""`max_new_tokens` were generated first."""


def generated(text: str, finish_reason: str, prompt_tokens: int, completion_tokens: int) -> dict:
    """The task's answer: what the server, `--do_predict` and `trainer.predict` write."""
    return {
        "text": text,
        "finish_reason": finish_reason,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
    }


def checked_generation_parameters(parameters: object, what: str = "parameter") -> dict[str, Any]:
    """The request's generation parameters, or InstanceError naming the first bad one
    (`what`: "parameter", or "field" for an instance's own). Model Garden's `max_tokens` is
    `max_new_tokens`; `raw_response` (Model Garden's vLLM: true, the generated text alone,
    which is all this server answers) is checked and dropped; a `top_k` of -1 (vLLM's every
    token) is transformers' 0 (`in_transformers_terms`)."""
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise InstanceError("parameters must be an object")
    unknown = sorted(set(parameters) - set(PARAMETER_CHECKS))
    if unknown:
        known = ", ".join(PARAMETER_CHECKS)
        raise InstanceError(f"unknown {what} {unknown[0]!r} (known: {known})")
    for name, value in parameters.items():
        problem = PARAMETER_CHECKS[name](value)
        if problem:
            raise InstanceError(f"{what} {name!r} {problem}")
    return in_transformers_terms(
        {name: value for name, value in parameters.items() if name != "raw_response"}, what
    )


def in_transformers_terms(checked: dict[str, Any], what: str) -> dict[str, Any]:
    """Checked parameters as `generate()` names them: Model Garden's `max_tokens` is
    `max_new_tokens`, vLLM's every-token `top_k` of -1 is 0."""
    if checked.get("top_k") == -1:
        checked["top_k"] = 0
    if "max_tokens" in checked:
        if "max_new_tokens" in checked:
            raise InstanceError(f"give the {what} max_tokens or max_new_tokens, not both")
        checked["max_new_tokens"] = checked.pop("max_tokens")
    return checked


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _stop_problem(value: object) -> str | None:
    strings = [value] if isinstance(value, str) else value
    if not isinstance(strings, list) or not all(isinstance(s, str) and s for s in strings):
        return "must be a non-empty string or a list of them"
    if len(strings) > MAX_STOP_STRINGS:  # none (`[]`, vLLM's default) stops nothing
        return f"must hold at most {MAX_STOP_STRINGS} strings"
    return None


def _max_new_tokens_problem(value: object) -> str | None:
    if _is_int(value) and 1 <= value <= MAX_NEW_TOKENS_LIMIT:
        return None
    return f"must be an integer from 1 to {MAX_NEW_TOKENS_LIMIT}"


PARAMETER_CHECKS: dict[str, Callable[[object], str | None]] = {
    "max_new_tokens": _max_new_tokens_problem,
    "max_tokens": _max_new_tokens_problem,
    "n": lambda v: None if _is_int(v) and 1 <= v <= MAX_CHOICES
    else f"must be an integer from 1 to {MAX_CHOICES}",
    "temperature": lambda v: None if _is_number(v) and 0 <= v <= 100
    else "must be a number from 0 (greedy) to 100",
    "top_p": lambda v: None if _is_number(v) and 0 < v <= 1 else "must be a number in (0, 1]",
    "top_k": lambda v: None if _is_int(v) and v >= -1
    else "must be an integer of at least 0 (0, or vLLM's -1: every token)",
    "stop": _stop_problem,
    "seed": lambda v: None if _is_int(v) and 0 <= v < 2**63 else "must be a non-negative integer",
    "logprobs": lambda v: None if _is_int(v) and 0 <= v <= MAX_TOP_LOGPROBS
    else f"must be an integer from 0 to {MAX_TOP_LOGPROBS} (the most likely tokens shown "
    "beside each one's own)",
    "raw_response": lambda v: None if v is True else "must be true (this server answers the "
    "generated text alone, never the prompt with it)",
}  # fmt: skip
"""Each parameter a request may give, and what is wrong with a value (None: nothing)."""


class GenerationPredictor(Predictor):
    pipeline_task = "text-generation"
    media_key = "prompt"
    reference_columns = ("completion", "reference")
    raw_media_types = ("text/plain",)
    openai_formats = {"chat/completions": CHAT, "completions": COMPLETIONS}

    def __init__(self, pipe, task: str) -> None:
        super().__init__(pipe, task)
        self.tokenizer_lock = threading.Lock()
        """One tokenizer call at a time (a fast tokenizer is not safe across the
        pre-processing threads)."""
        self.continuous: ContinuousEngines | None = None
        """transformers' continuous batching engines, once the server started them."""

    def start_engine(self, workers: int = 1) -> str | None:
        """Continuous batching (continuous_batching.py) for the server, warmed with two
        tokens; the line saying why not when the model's generation config stops it."""
        model = self.pipe.model
        why_not = engine_refusal(model)
        if why_not:
            return f"continuous batching off: {why_not}; every request uses generate()"
        self.continuous = ContinuousEngines(model, workers)
        self.continuous.warm_up(self.prepared(self.warm_up_input()).model_inputs[0]["input_ids"])
        return None

    def engine(self) -> ContinuousPredictions | None:
        return None if self.continuous is None else ContinuousPredictions(self, self.continuous)

    def model_in_use(self):
        """Around `generate()` on the model's thread: the engines, if any, paused meanwhile."""
        return nullcontext() if self.continuous is None else self.continuous.paused()

    @classmethod
    def media_extensions(cls) -> frozenset[str]:
        return frozenset({".txt"})

    @classmethod
    def row_instance(cls, row: dict) -> Callable[[], object]:
        """A saved dataset's row as a request: its conversation up to its last assistant
        turn, or its prompt."""
        messages = row.get("messages")
        if messages:
            asked = list(messages)
            while asked and asked[-1].get("role") == "assistant":
                asked.pop()
            return lambda: {"messages": asked}
        return lambda: {"prompt": row.get("prompt")}

    def checked_parameters(self, parameters: object) -> dict[str, Any]:
        return checked_generation_parameters(parameters)

    def prepare(self, instance: object) -> Prepared:
        """The prompt tokenized, with the instance's own parameters (Model Garden's
        instances carry `max_tokens`, `temperature`, ...), which override the request's."""
        if isinstance(instance, dict) and REQUEST_FORMAT in instance:
            return self.prepared_openai(instance)
        own = None
        if isinstance(instance, dict) and set(instance) != {"b64"}:
            fields = {k: v for k, v in instance.items() if k not in PROMPT_FIELDS}
            own = checked_generation_parameters(fields, "field") or None
        prepared = self.prepared(self.decoded(instance))
        prepared.parameters = own
        return prepared

    def prepared_openai(self, instance: dict) -> Prepared:
        """An OpenAI request's body as an instance (`"@requestFormat": "chatCompletions"`, as
        Model Garden's containers take it; or `completions`), answered in OpenAI's format."""
        form = instance[REQUEST_FORMAT]
        body = {k: v for k, v in instance.items() if k != REQUEST_FORMAT}
        if body.get("stream"):
            raise InstanceError("stream: true is answered on /v1/chat/completions and "
                                "/v1/completions, not on the prediction route")  # fmt: skip
        asked, parameters = openai_request(body, form)
        decoded = (self.rendered_chat(asked), True) if form == CHAT else (asked, False)
        checked = checked_generation_parameters(parameters, "field")
        prepared = self.prepared(decoded)
        prepared.parameters, prepared.reply = checked, reply(form, body.get("model"))
        return prepared

    def streamer(self, on_text: Callable[[int, str], None], choices: int = 1) -> Any:
        """A streamer for `generate()` (transformers' `BaseStreamer`) over the rows of the
        instance's `choices` answers, handing `on_text(choice, text)` each new piece of an
        answer's text as its tokens come; its `choices` are one streamer per answer, which
        the continuous batching engine feeds instead."""
        tokenizer, ends = self.pipe.tokenizer, self.end_ids()
        return Rows([Pieces(index, on_text, tokenizer, ends) for index in range(choices)])

    def decoded(self, instance: object) -> tuple[str, bool]:
        """(the text the model continues, whether it is a rendered chat)."""
        if isinstance(instance, str):
            return instance, False
        if isinstance(instance, bytes) or (isinstance(instance, dict) and set(instance) == {
                "b64"}):  # fmt: skip
            try:
                return self.media(instance).decode(), False
            except UnicodeDecodeError:
                raise InstanceError("the prompt is not UTF-8 text") from None
        if isinstance(instance, dict) and "messages" in instance:
            return self.rendered_chat(instance["messages"]), True
        if isinstance(instance, dict) and isinstance(instance.get("prompt"), str):
            return instance["prompt"], False
        raise InstanceError('an instance needs "messages" (a chat) or "prompt" (a string)')

    def rendered_chat(self, messages: object) -> str:
        """The chat in the model's own template, ending where the assistant's turn begins."""
        if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m
            for m in messages
        ):  # fmt: skip
            raise InstanceError('"messages" must be a non-empty list of {"role", "content"}')
        messages = [{**m, "content": message_text(m["content"])} for m in messages]
        tokenizer = self.pipe.tokenizer
        if not tokenizer.chat_template:
            raise InstanceError('this model has no chat template: send {"prompt": ...}')
        try:
            with self.tokenizer_lock:
                return tokenizer.apply_chat_template(
                    messages, add_generation_prompt=True, tokenize=False
                )
        except Exception as error:  # noqa: BLE001 - the template's own complaint, e.g. roles
            raise InstanceError(f"the chat template refused the messages: {error}") from None

    def prepared(self, pipeline_input: tuple[str, bool]) -> Prepared:
        text, chat = pipeline_input
        with self.tokenizer_lock:
            # A rendered chat holds its special tokens already (the template writes them).
            ids = self.pipe.tokenizer(text, add_special_tokens=not chat)["input_ids"]
        if not ids:
            raise InstanceError("the prompt is empty")
        limit = self.positions()
        if limit and len(ids) >= limit:
            raise InstanceError(f"the prompt is {len(ids)} tokens; the model takes fewer than "
                                f"{limit} in all")  # fmt: skip
        return Prepared([{"input_ids": ids}])

    def positions(self) -> int | None:
        """The most tokens, prompt and generation together, the model takes (None: unsaid)."""
        return getattr(self.pipe.model.config, "max_position_embeddings", None)

    def predict(self, batch: list[Prepared], parameters: dict[str, Any]) -> list:
        """Each instance's answer (a list of `n` when it asks for more than one), its own
        parameters over the request's: instances that ask for the same are generated
        together (the server's batcher sends only such; `trainer.predict` may mix them)."""
        groups: dict[str, list[int]] = {}
        for index, prepared in enumerate(batch):
            key = json.dumps(self.asked(prepared, parameters), sort_keys=True)
            groups.setdefault(key, []).append(index)
        answers: list = [None] * len(batch)
        for indexes in groups.values():
            alike = [batch[index] for index in indexes]
            asked = self.asked(alike[0], parameters)
            for index, answer in zip(indexes, self.predict_alike(alike, asked), strict=True):
                written = batch[index].reply
                answers[index] = written(answer) if written and "error" not in answer else (
                    answer)  # fmt: skip
        return answers

    def predict_alike(self, batch: list[Prepared], parameters: dict[str, Any]) -> list:
        """Each instance's answer, or `{"error": ...}` for one alone: a prompt that cannot
        fit with its new tokens is refused without a forward pass, and when the batch's
        `generate()` fails, each prompt is tried alone, so that a failure is only its own
        (one that fails every prompt alone is raised: the model, not a prompt, is broken)."""
        answers: list[dict | None] = [self.refusal(prepared, parameters) for prepared in batch]
        fitting = [index for index, answer in enumerate(answers) if answer is None]
        if not fitting:
            return answers
        rows = [batch[index] for index in fitting]
        try:
            generated_rows = self.generate(rows, parameters)
        except Exception:
            if len(rows) == 1:
                raise
            generated_rows = self.each_alone(rows, parameters)
        for index, answer in zip(fitting, generated_rows, strict=True):
            answers[index] = answer
        return answers

    def asked(self, prepared: Prepared, parameters: dict[str, Any]) -> dict[str, Any]:
        """What an instance is answered with: its own parameters over the request's; when
        neither names a length, the default (`max_new_tokens`) cut to the positions its prompt
        leaves, as vLLM cuts its own: a length nobody asked for never refuses a prompt."""
        asked = parameters | (prepared.parameters or {})
        limit = self.positions()
        if "max_new_tokens" in asked or not limit:
            return asked
        room = limit - len(prepared.model_inputs[0]["input_ids"])
        return asked | {"max_new_tokens": room} if self.max_new_tokens(asked) > room else asked

    def refusal(self, prepared: Prepared, parameters: dict[str, Any]) -> dict | None:
        """`{"error": ...}` naming the numbers when the prompt and the new tokens it asks for
        exceed the model's positions; None when they fit."""
        limit = self.positions()
        prompt = len(prepared.model_inputs[0]["input_ids"])
        wanted = self.max_new_tokens(self.asked(prepared, parameters))
        if limit and prompt + wanted > limit:
            return {"error": f"the prompt is {prompt} tokens and {wanted} new tokens were "
                    f"asked for: {prompt + wanted} in all, over the model's {limit} positions; "
                    f"ask for at most {limit - prompt} (max_new_tokens or max_tokens)"}  # fmt: skip
        return None

    def each_alone(self, rows: list[Prepared], parameters: dict[str, Any]) -> list[dict]:
        """Each row generated by itself, a failure its own `{"error": ...}`; raised when
        every row fails."""
        answers, failure = [], None
        for row in rows:
            try:
                answers.append(self.generate([row], parameters)[0])
            except Exception as error:  # noqa: BLE001 - this row's answer says it
                failure = error
                answers.append({"error": f"the generation failed: {type(error).__name__}: "
                                f"{error}"})  # fmt: skip
        if all("error" in answer for answer in answers):
            raise failure
        return answers

    def generate(self, batch: list[Prepared], parameters: dict[str, Any]) -> list[dict]:
        """One `generate()` over the batch, its prompts left-padded."""
        import torch

        tokenizer, model = self.pipe.tokenizer, self.pipe.model
        prompts = [prepared.model_inputs[0]["input_ids"] for prepared in batch]
        width = max(len(ids) for ids in prompts)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.end_ids()[0]
        choices = parameters.get("n", 1)
        input_ids, mask = left_padded(prompts, width, pad, choices)
        kwargs = self.generate_kwargs(parameters, pad)
        if batch[0].streamer is not None:
            kwargs["streamer"] = batch[0].streamer  # the instance is alone in its batch
        if "seed" in parameters:
            torch.manual_seed(parameters["seed"])  # the model's thread is the only one sampling
        with self.model_in_use(), torch.inference_mode():
            out = model.generate(input_ids=input_ids.to(model.device),
                                 attention_mask=mask.to(model.device), **kwargs)  # fmt: skip
        stops = self.stop_strings(parameters)
        sequences = out.sequences if "logprobs" in parameters else out
        rows = [self.answer(row[width:], len(prompts[i // choices]), stops)
                for i, row in enumerate(sequences.tolist())]  # fmt: skip
        if "logprobs" in parameters:
            self.add_logprobs(rows, out.logits, sequences[:, width:], parameters["logprobs"])
        if choices == 1:
            return rows
        return [rows[start : start + choices] for start in range(0, len(rows), choices)]

    def add_logprobs(self, answers: list[dict], logits: tuple, new_ids, top: int) -> None:
        """Each answer's tokens with their log-probabilities and the `top` most likely
        (logprobs.py), from `generate()`'s raw logits of each step."""
        steps = step_logprobs(logits, new_ids, top)
        for row, ids, answer in zip(steps, new_ids.tolist(), answers, strict=True):
            answer["logprobs"] = answer_logprobs(ids, row, answer["text"], self.pipe.tokenizer)

    def generate_kwargs(self, parameters: dict[str, Any], pad: int) -> dict[str, Any]:
        """`generate()`'s arguments: the model's generation config, overridden by the request."""
        kwargs: dict[str, Any] = {"max_new_tokens": self.max_new_tokens(parameters),
                                  "pad_token_id": pad}  # fmt: skip
        temperature = parameters.get("temperature")
        if temperature == 0:
            kwargs |= {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
        elif temperature is not None or "top_p" in parameters or "top_k" in parameters:
            kwargs["do_sample"] = True
            kwargs |= {name: parameters[name] for name in ("temperature", "top_p", "top_k")
                       if name in parameters}  # fmt: skip
        stops = self.stop_strings(parameters)
        if stops:
            kwargs |= {"stop_strings": stops, "tokenizer": self.pipe.tokenizer}
        if "logprobs" in parameters:  # the raw logits of each step, for logprobs.py
            kwargs |= {"output_logits": True, "return_dict_in_generate": True}
        return kwargs

    @staticmethod
    def stop_strings(parameters: dict[str, Any]) -> list[str]:
        stop = parameters.get("stop")
        return [stop] if isinstance(stop, str) else list(stop or [])

    def max_new_tokens(self, parameters: dict[str, Any]) -> int:
        """The request's, else the model's generation_config.json's, else the default."""
        config = self.pipe.model.generation_config
        return (parameters.get("max_new_tokens") or config.max_new_tokens
                or DEFAULT_MAX_NEW_TOKENS)  # fmt: skip

    def end_ids(self) -> list[int]:
        return end_of_turn_ids(self.pipe.model, self.pipe.tokenizer)

    def answer(self, new_ids: list[int], prompt_tokens: int, stops: list[str]) -> dict:
        return continuation(new_ids, prompt_tokens, self.end_ids(), self.pipe.tokenizer, stops)

    def warm_up_input(self) -> tuple[str, bool]:
        return "Hello", False

    def warm_up(self) -> None:
        """Two tokens of one prompt: the first call's costs, not a long generation."""
        self.predict([self.prepared(self.warm_up_input())], {"max_new_tokens": 2})

    def score(self, scored: list[tuple[Any, dict]], parameters: dict) -> dict[str, float]:
        """The share of answers equal to their reference (whitespace at the ends aside), and
        the mean tokens generated."""
        answers = [answer[0] if isinstance(answer, list) else answer for _, answer in scored]
        references = [str(reference).strip() for reference, _ in scored]
        exact = [reference == answer.get("text", "").strip() and "error" not in answer
                 for reference, answer in zip(references, answers, strict=True)]  # fmt: skip
        tokens = [answer.get("completion_tokens", 0) for answer in answers]
        return {"exact_match": sum(exact) / len(exact),
                "mean_completion_tokens": sum(tokens) / len(tokens)}  # fmt: skip


def left_padded(prompts: list[list[int]], width: int, pad: int, copies: int):
    """The prompts' ids and attention mask, left-padded to `width`, each row `copies` times."""
    import torch

    input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in prompts])
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in prompts])
    return input_ids.repeat_interleave(copies, dim=0), mask.repeat_interleave(copies, dim=0)


def end_of_turn_ids(model, tokenizer) -> list[int]:
    """The token ids that end the model's turn (generation_config's, else the tokenizer's)."""
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = tokenizer.eos_token_id
    return list(eos) if isinstance(eos, list | tuple) else [eos]


def continuation(
    new_ids: list[int], prompt_tokens: int, end_ids: list[int], tokenizer, stops: list[str] = ()
) -> dict:
    """The answer for one row of `generate()`'s output past its prompt (or the continuous
    batching engine's tokens): cut at its first end-of-turn token (`end_ids`) or `stops`
    string; the padding after a row that ended before the others left out. An answer a stop
    string cut counts the tokens up to the one that wrote it, as the engine stops there
    (`generate()`'s stop strings match at a token's end, and may generate on past one inside
    a token). The server and the training run's `--do_predict` both answer so."""
    ends = set(end_ids)
    length = next((i for i, token in enumerate(new_ids) if token in ends), None)
    finish = FINISHED_BY_STOP if length is not None else FINISHED_BY_LENGTH
    kept = new_ids if length is None else new_ids[:length]
    while kept and kept[-1] == tokenizer.pad_token_id:  # a row that met a stop string early
        kept = kept[:-1]
    text = tokenizer.decode(kept, skip_special_tokens=True)
    found = [(text.find(stop), len(stop)) for stop in stops if stop in text]
    if found:
        at, stop_length = min(found)
        kept = kept[: covering(kept, text[: at + stop_length], tokenizer)]
        text, finish, length = text[:at], FINISHED_BY_STOP, None
    return generated(text, finish, prompt_tokens, len(kept) + (length is not None))


class Pieces:
    """One answer's streamer (transformers' `BaseStreamer` protocol): given the prompt first,
    then its new tokens, it hands `on_text(index, text)` each new piece of the answer's text
    (the prompt and special tokens left out; a piece ending inside a character waits for the
    rest of it), up to its first end-of-turn token (`end_ids`), where the whole answer ends
    too (`continuation`), even if the generation went on past it.

    Each step decodes only a window of the newest tokens, not the whole answer (which would
    cost more the longer it grows): the text of the tokens from `start` on, less that of
    those from `start` to `read` (handed on already). The window starts a token back, so a
    word's spacing decodes as in the whole answer (text-generation-inference's and vLLM's
    incremental detokenizing)."""

    def __init__(self, index: int, on_text: Callable[[int, str], None], tokenizer,
                 end_ids: list[int] = ()) -> None:  # fmt: skip
        self.index, self.on_text, self.tokenizer = index, on_text, tokenizer
        self.end_ids, self.ended = set(end_ids), False
        self.ids: list[int] | None = None  # None: the prompt is yet to come
        self.start = self.read = 0

    def put(self, value) -> None:
        if self.ids is None:
            self.ids = []
            return
        if self.ended:
            return
        new = value.reshape(-1).tolist()
        end = next((i for i, token in enumerate(new) if token in self.end_ids), None)
        if end is not None:
            new, self.ended = new[:end], True
        self.ids += new
        self.hand_on(partial=True)

    def end(self) -> None:
        self.hand_on(partial=False)

    def hand_on(self, partial: bool) -> None:
        ids = self.ids or []
        sent = self.tokenizer.decode(ids[self.start : self.read], skip_special_tokens=True)
        text = self.tokenizer.decode(ids[self.start :], skip_special_tokens=True)
        if len(text) > len(sent) and not (partial and text.endswith("\ufffd")):
            self.on_text(self.index, text[len(sent) :])
            self.start, self.read = self.read, len(ids)


class Rows:
    """`generate()`'s streamer for an instance's answers, one row each: the prompts it is
    handed first, then each step's tokens, split among the rows' `choices`."""

    def __init__(self, choices: list[Pieces]) -> None:
        self.choices = choices

    def put(self, value) -> None:
        for choice, row in zip(self.choices, value.reshape(len(self.choices), -1), strict=True):
            choice.put(row)

    def end(self) -> None:
        for choice in self.choices:
            choice.end()
