"""Per-token log-probabilities of a generated answer (OpenAI's `logprobs`, `top_logprobs`):
from the model's raw logits at each step of `generate()` (`output_logits`), before any
temperature or top-p, as vLLM reports them by default; each step's log-softmax is reduced to
the chosen token's and the `top` most likely at once, so no step's whole vocabulary is kept."""

from __future__ import annotations

from typing import Any

MAX_TOP_LOGPROBS = 20
"""OpenAI's limit on `top_logprobs` (a completion's `logprobs` is at most 5 there)."""


def step_logprobs(logits: tuple, chosen, top: int) -> list[list[tuple[float, list]]]:
    """For each row of `generate()`'s output, each step's (the chosen token's log-probability,
    [(token id, log-probability)] of the `top` most likely). `logits`: `generate()`'s
    `output_logits` (a [rows, vocab] tensor a step); `chosen`: the new tokens, [rows, steps]."""
    import torch

    rows: list[list[tuple[float, list]]] = [[] for _ in range(chosen.shape[0])]
    for step, step_logits in enumerate(logits):
        logprobs = torch.log_softmax(step_logits.float(), dim=-1)
        picked = logprobs.gather(1, chosen[:, step : step + 1]).squeeze(1).tolist()
        best = logprobs.topk(top, dim=-1) if top else None
        ids = best.indices.tolist() if best is not None else [[] for _ in picked]
        values = best.values.tolist() if best is not None else [[] for _ in picked]
        for row, value in enumerate(picked):
            rows[row].append((value, list(zip(ids[row], values[row], strict=True))))
    return rows


def answer_logprobs(new_ids: list[int], steps: list, text: str, tokenizer) -> list[dict]:
    """The answer's tokens with their log-probabilities: those whose text the answer keeps
    (up to an end-of-turn token or a stop string), each `{"token", "logprob",
    "top_logprobs": [{"token", "logprob"}]}` with the token's own text."""
    kept = covering(new_ids, text, tokenizer)
    return [{"token": tokenizer.decode([token]), "logprob": value,
             "top_logprobs": [{"token": tokenizer.decode([other]), "logprob": lp}
                              for other, lp in most]}
            for token, (value, most) in zip(new_ids[:kept], steps, strict=False)]  # fmt: skip


def covering(new_ids: list[int], text: str, tokenizer) -> int:
    """The fewest leading tokens whose decoded text is as long as the answer's (the rest are
    its end-of-turn token, padding, or past a stop string): a binary search, a few decodes on
    the model's thread, not one per token."""
    low, high = 0, len(new_ids)
    while low < high:
        middle = (low + high) // 2
        if len(tokenizer.decode(new_ids[:middle], skip_special_tokens=True)) >= len(text):
            high = middle
        else:
            low = middle + 1
    return low


def chat_logprobs(tokens: list[dict[str, Any]]) -> dict:
    """OpenAI's chat `choices[].logprobs`: each token with its UTF-8 bytes."""

    def written(entry: dict) -> dict:
        return {"token": entry["token"], "logprob": entry["logprob"],
                "bytes": list(entry["token"].encode())}  # fmt: skip

    return {"content": [written(entry) | {"top_logprobs": [written(other) for other in
                                                           entry["top_logprobs"]]}
                        for entry in tokens], "refusal": None}  # fmt: skip


def completion_logprobs(tokens: list[dict[str, Any]]) -> dict:
    """OpenAI's completion `choices[].logprobs`: parallel lists, offsets into the answer."""
    offsets, at = [], 0
    for entry in tokens:
        offsets.append(at)
        at += len(entry["token"])
    tops = []
    for entry in tokens:  # keyed by text: of two tokens of one text, the likelier is kept
        most: dict[str, float] = {}
        for other in entry["top_logprobs"]:
            most.setdefault(other["token"], other["logprob"])
        tops.append(most)
    return {"tokens": [entry["token"] for entry in tokens],
            "token_logprobs": [entry["logprob"] for entry in tokens],
            "top_logprobs": tops if any(tops) else None, "text_offset": offsets}  # fmt: skip
