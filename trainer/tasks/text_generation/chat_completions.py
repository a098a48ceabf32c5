"""OpenAI's chat completions and completions bodies, as the generation server takes and
answers them: on `/v1/chat/completions` and `/v1/completions` (trainer/serve/openai_routes.py)
and as a predict instance with `"@requestFormat": "chatCompletions"`, as Model Garden's
containers take it.

A request's fields map onto the task's parameters (`max_tokens` or `max_completion_tokens`,
`temperature`, `top_p`, `top_k`, `n`, `stop`, `seed`; a chat's `logprobs` and `top_logprobs`,
a completion's `logprobs` count, as the task's `logprobs`: trainer/tasks/text_generation/
logprobs.py); fields that would change the answer in a way this server does not compute
(penalties, `echo`, `best_of`, `suffix`) are taken at their neutral values only, and any
other field is refused by name, never ignored.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from trainer.tasks.instance_media import InstanceError
from trainer.tasks.text_generation.logprobs import chat_logprobs, completion_logprobs

REQUEST_FORMAT = "@requestFormat"
CHAT = "chatCompletions"
COMPLETIONS = "completions"
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
"""OpenAI's (and vLLM's) default length of a completion; a chat's is the model's own."""

SAMPLING = ("temperature", "top_p", "top_k", "n", "stop", "seed")
LOGPROBS = ("logprobs", "top_logprobs")
COMPLETION_MAX_LOGPROBS = 5
"""OpenAI's limit on a completion's `logprobs` (a chat's `top_logprobs`: 20)."""
NEUTRAL: dict[str, Callable[[object], bool]] = {
    "frequency_penalty": lambda v: v in (None, 0),
    "presence_penalty": lambda v: v in (None, 0),
    "echo": lambda v: v in (None, False),
    "best_of": lambda v: v in (None, 1),
    "suffix": lambda v: v is None,
    "user": lambda v: v is None or isinstance(v, str),
    "stream": lambda v: v in (None, False, True),
    "stream_options": lambda v: v is None or isinstance(v, dict),
    "logit_bias": lambda v: v in (None, {}),
    "response_format": lambda v: v in (None, {"type": "text"}),
    "tools": lambda v: v in (None, []),
    "tool_choice": lambda v: v in (None, "none", "auto"),
    "parallel_tool_calls": lambda v: v in (None, False, True),
    "functions": lambda v: v in (None, []),
    "function_call": lambda v: v in (None, "none", "auto"),
    "store": lambda v: v in (None, False),
    "metadata": lambda v: v is None or isinstance(v, dict),
    "modalities": lambda v: v in (None, ["text"]),
}
"""Fields taken at these values only: what a client sends as null, or at a value that changes
nothing here (no tools, plain text), is taken; another value is a 400 naming it. `user` and
`metadata` describe the caller, `stream` is the route's; with no tools, a `tool_choice` of
`auto` calls none."""
FIELDS = {
    CHAT: {
        "model",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        *SAMPLING,
        *NEUTRAL,
        *LOGPROBS,
    },
    COMPLETIONS: {"model", "prompt", "max_tokens", "logprobs", *SAMPLING, *NEUTRAL},
}


def openai_request(body: object, form: str) -> tuple[object, dict[str, Any]]:
    """(the chat's messages or the completion's prompt, the generation parameters it asks
    for, unchecked), or InstanceError naming the first field this server cannot honour."""
    checked_fields(body, form)
    parameters = {name: body[name] for name in SAMPLING if body.get(name) is not None}
    parameters |= length(body, form) | asked_logprobs(body, form)
    if form == CHAT:
        return body.get("messages"), parameters
    return completion_prompt(body.get("prompt")), parameters


def checked_fields(body: object, form: str) -> None:
    """InstanceError for a body that is no object, an unknown field, or a field at a value
    this server does not compute."""
    if form not in FIELDS:
        raise InstanceError(f"{REQUEST_FORMAT} must be {CHAT!r} or {COMPLETIONS!r}")
    if not isinstance(body, dict):
        raise InstanceError("the body must be a JSON object")
    unknown = sorted(set(body) - FIELDS[form])
    if unknown:
        known = ", ".join(sorted(FIELDS[form]))
        raise InstanceError(f"unknown field {unknown[0]!r} (known: {known})")
    for name, neutral in NEUTRAL.items():
        if name in body and not neutral(body[name]):
            raise InstanceError(f"{name}={body[name]!r} is not supported by this server")


def length(body: dict, form: str) -> dict[str, Any]:
    """`{"max_tokens": N}` from `max_tokens` or `max_completion_tokens`; a completion's
    default, OpenAI's 16; a chat's: none (the model's own)."""
    given = [body[name] for name in ("max_tokens", "max_completion_tokens")
             if body.get(name) is not None]  # fmt: skip
    if len(given) == 2:
        raise InstanceError("give max_tokens or max_completion_tokens, not both")
    if given:
        return {"max_tokens": given[0]}
    return {"max_tokens": COMPLETIONS_DEFAULT_MAX_TOKENS} if form == COMPLETIONS else {}


def asked_logprobs(body: dict, form: str) -> dict[str, Any]:
    """`{"logprobs": K}` (K most likely tokens beside each one's own) when the body asks for
    log-probabilities: a chat's `logprobs: true` with `top_logprobs: K`, a completion's
    `logprobs: K`; `{}` when it does not."""
    wanted, top = body.get("logprobs"), body.get("top_logprobs")
    if form == COMPLETIONS:
        return {} if wanted is None else {"logprobs": completion_logprobs_count(wanted)}
    if wanted not in (None, False, True):
        raise InstanceError("logprobs must be true or false")
    if top is not None and not wanted:
        raise InstanceError("top_logprobs needs logprobs: true")
    return {"logprobs": 0 if top is None else top} if wanted else {}


def completion_logprobs_count(wanted: object) -> int:
    if isinstance(wanted, bool) or wanted not in range(COMPLETION_MAX_LOGPROBS + 1):
        raise InstanceError(f"logprobs must be an integer from 0 to {COMPLETION_MAX_LOGPROBS}")
    return wanted


def completion_prompt(prompt: object) -> str:
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise InstanceError('"prompt" must be a non-empty string (one prompt a request)')
    return prompt


CONTENT_SHAPE = ('a message\'s "content" must be a string or a list of {"type": "text", '
                 '"text": ...} parts')  # fmt: skip


def message_text(content: object) -> str:
    """A message's content as text: a string, or OpenAI's array of text parts, joined with
    newlines."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        raise InstanceError(CONTENT_SHAPE)
    return "\n".join(part_text(part) for part in content)


def part_text(part: object) -> str:
    if not isinstance(part, dict):
        raise InstanceError(CONTENT_SHAPE)
    if part.get("type") != "text":
        raise InstanceError(f"this model takes text parts only, not {part.get('type')!r}")
    if not isinstance(part.get("text"), str):
        raise InstanceError(CONTENT_SHAPE)
    return part["text"]


def reply(form: str, model: object) -> Callable[[dict | list[dict]], dict]:
    """What writes the task's answers (one, or `n`) as OpenAI's response body."""
    created = int(time.time())
    name = model if isinstance(model, str) else None

    def written(answers: dict | list[dict]) -> dict:
        answers = answers if isinstance(answers, list) else [answers]
        completion = sum(answer["completion_tokens"] for answer in answers)
        prompt = answers[0]["prompt_tokens"]
        if form == CHAT:
            identity = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion"}
            choices = [{"index": i, "message": {"role": "assistant", "content": a["text"]},
                        "logprobs": chat_logprobs(a["logprobs"]) if "logprobs" in a else None,
                        "finish_reason": a["finish_reason"]}
                       for i, a in enumerate(answers)]  # fmt: skip
        else:
            identity = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion"}
            choices = [{"index": i, "text": a["text"],
                        "logprobs": completion_logprobs(a["logprobs"]) if "logprobs" in a
                        else None, "finish_reason": a["finish_reason"]}
                       for i, a in enumerate(answers)]  # fmt: skip
        return {**identity, "created": created, "model": name, "choices": choices,
                "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                          "total_tokens": prompt + completion}}  # fmt: skip

    return written
