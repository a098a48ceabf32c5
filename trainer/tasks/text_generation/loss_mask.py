"""A row of chat data checked, rendered with the chat template, tokenised, and given the labels
that put the loss where it belongs: the assistant's turns of a chat, the completion of a
prompt/completion pair, or (with --assistant_only_loss false / --completion_only_loss false,
or plain text) every token.

Where the loss goes is found from the text, not from `{% generation %}` markers, which most
released templates lack (Llama 3.x, Qwen 2.5, Gemma 2 ship none; TRL swaps in its own marked
copy only for templates it knows byte for byte). For the assistant turn i of a chat, the
template renders the chat up to turn i with the generation prompt (P) and up to turn i
inclusive (Q); when each P is a prefix of Q and each Q a prefix of the whole chat's text, the
characters from len(P) to len(Q) are the assistant's: its answer and the template's end of
turn (`<|eot_id|>`, `<|im_end|>`, `<end_of_turn>`), so the model learns to stop. Each token
whose characters overlap those spans (the tokenizer's offsets) is learnt; every other label
is -100. A template that marks the assistant's output itself (`{% generation %}`) is taken at its
word: the tokenizer's `return_assistant_tokens_mask`. A template whose renderings are not
prefixes of each other (one that rewrites earlier turns, as Qwen3's drops past reasoning)
cannot be split by rendering: TRL's marked training copy of it is used where TRL has one
(`get_training_chat_template`), else the data is refused in one line naming
--assistant_only_loss false, never trained with a wrong mask.

A row that is not one (no role, empty content, wrong types, a chat with no assistant turn, a
chat the template itself refuses, such as a system turn for Gemma) is `BadRow`: skipped and
counted under --max_bad_examples by the task (training.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

IGNORED = -100
"""The label of a token without loss (PyTorch's cross-entropy `ignore_index`)."""

ROLES = ("system", "user", "assistant", "tool")
GENERATION_MARKER = re.compile(r"\{%-?\s*generation\s*-?%\}")


class BadRow(Exception):
    """This row cannot be trained on; the message says why, in a few words."""


class TemplateNotSplittable(Exception):
    """The chat template's renderings of a chat's prefixes are not prefixes of its text."""


@dataclass(frozen=True)
class Encoded:
    input_ids: list[int]
    labels: list[int]
    truncated: bool = False


def checked_messages(messages: Any, what: str = "messages") -> list[dict]:
    """The chat, each turn `{role, content}` with a known role and non-empty text content."""
    if not isinstance(messages, list) or not messages:
        raise BadRow(f"{what} is not a list of turns")
    for number, turn in enumerate(messages):
        if not isinstance(turn, dict):
            raise BadRow(f"turn {number} is not an object")
        role, content = turn.get("role"), turn.get("content")
        if not isinstance(role, str):
            raise BadRow(f"turn {number} has no role")
        if role not in ROLES:
            raise BadRow(f"turn {number} has role {role!r}")
        if not isinstance(content, str):
            raise BadRow(f"turn {number} has no text content")
        if not content.strip():
            raise BadRow(f"turn {number} is empty")
    return [{"role": turn["role"], "content": turn["content"]} for turn in messages]


def render(tokenizer, messages: list[dict], generation_prompt: bool = False) -> str:
    try:
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt
        )
    except Exception as error:  # noqa: BLE001 - jinja's TemplateError, raise_exception()
        raise BadRow(f"the chat template refuses it ({' '.join(str(error).split())})") from None


def assistant_spans(tokenizer, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    """The chat's text and the character spans of its assistant turns (see the module)."""
    text = render(tokenizer, messages)
    spans = []
    for i, turn in enumerate(messages):
        if turn["role"] != "assistant":
            continue
        before = render(tokenizer, messages[:i], generation_prompt=True) if i else ""
        through = render(tokenizer, messages[: i + 1])
        if not (through.startswith(before) and text.startswith(through)):
            raise TemplateNotSplittable(
                "the chat template renders a chat's earlier turns differently once later "
                "turns follow, so its assistant turns cannot be told apart from the text"
            )
        spans.append((len(before), len(through)))
    return text, spans


def marked_template(template: Any) -> str | None:
    """The template, when it marks the assistant's output with `{% generation %}`."""
    if isinstance(template, dict):
        template = template.get("default")
    return template if isinstance(template, str) and GENERATION_MARKER.search(template) else None


def training_template(tokenizer) -> str | None:
    """TRL's marked copy of the tokenizer's template, for templates it knows; None otherwise."""
    from trl.chat_template_utils import get_training_chat_template

    try:
        return get_training_chat_template(tokenizer) or marked_template(tokenizer.chat_template)
    except ValueError:
        return None


def masked_by_markers(tokenizer, messages: list[dict], template: str) -> tuple[list, list]:
    """Token ids and labels of a chat whose `template` marks the assistant's output."""
    try:
        out = tokenizer.apply_chat_template(
            messages, chat_template=template, tokenize=True, return_dict=True,
            return_assistant_tokens_mask=True,
        )  # fmt: skip
    except Exception as error:  # noqa: BLE001 - jinja's TemplateError, raise_exception()
        raise BadRow(f"the chat template refuses it ({' '.join(str(error).split())})") from None
    ids = list(out["input_ids"])
    return ids, [t if m else IGNORED for t, m in zip(ids, out["assistant_masks"], strict=True)]


def completion_span(tokenizer, prompt: Any, completion: Any) -> tuple[str, list[tuple[int, int]]]:
    """A prompt/completion pair's text and the completion's span: plain strings joined as they
    are (the end-of-sequence token added), or two lists of turns rendered as one chat."""
    if isinstance(prompt, str) and isinstance(completion, str):
        if not prompt.strip() or not completion.strip():
            raise BadRow("an empty prompt or completion")
        text = prompt + completion + (tokenizer.eos_token or "")
        return text, [(len(prompt), len(text))]
    if isinstance(prompt, list) and isinstance(completion, list):
        prompt = checked_messages(prompt, "prompt")
        completion = checked_messages(completion, "completion")
        before = render(tokenizer, prompt, generation_prompt=True)
        text = render(tokenizer, prompt + completion)
        if not text.startswith(before):
            raise TemplateNotSplittable("the chat template renders a prompt differently once "
                                        "its completion follows")  # fmt: skip
        return text, [(len(before), len(text))]
    raise BadRow("prompt and completion are not two texts, nor two lists of turns")


def chat_spans(tokenizer, messages: list[dict], assistant_only: bool):
    """A chat's text and its spans with loss: the assistant's turns, or all of it."""
    if assistant_only:
        return assistant_spans(tokenizer, messages)
    text = render(tokenizer, messages)
    return text, [(0, len(text))]


def plain_text(tokenizer, text: Any) -> tuple[str, list[tuple[int, int]]]:
    """A text with the end-of-sequence token after it, and the beginning-of-sequence token
    before it where the tokenizer has one (as its own special tokens would add it)."""
    if not isinstance(text, str) or not text.strip():
        raise BadRow("no text")
    text = text + (tokenizer.eos_token or "")
    start = tokenizer.bos_token or ""
    if start and text.startswith(start):
        start = ""
    return start + text, [(len(start), len(start) + len(text))]


def labelled(tokenizer, text: str, spans: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """Token ids of `text` (its special tokens as the template wrote them) and their labels:
    the id where a token's characters overlap a span, else IGNORED."""
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = encoding["input_ids"], encoding["offset_mapping"]
    labels = [
        token if any(end > a and start < b for a, b in spans) else IGNORED
        for token, (start, end) in zip(ids, offsets, strict=True)
    ]
    return ids, labels


def encode_row(
    tokenizer, row: dict, data_format: str, options, marked: str | None = None
) -> Encoded:
    """One row as token ids and labels, cut to `options.max_seq_length`; BadRow for a row that
    is none, TemplateNotSplittable for a template the mask cannot be found in. `marked`: a
    template marking the assistant's output, to mask chats by (see the module)."""
    if data_format == "conversational":
        messages = checked_messages(row.get("messages"))
        if not any(turn["role"] == "assistant" for turn in messages):
            raise BadRow("a chat without an assistant turn")
        if options.assistant_only_loss and marked is not None:
            ids, labels = masked_by_markers(tokenizer, messages, marked)
            return cut(ids, labels, options.max_seq_length)
        text, spans = chat_spans(tokenizer, messages, options.assistant_only_loss)
    elif data_format == "prompt-completion":
        text, spans = completion_span(tokenizer, row.get("prompt"), row.get("completion"))
        if not options.completion_only_loss:
            spans = [(0, len(text))]
    else:
        text, spans = plain_text(tokenizer, row.get(options.dataset_text_field))
    ids, labels = labelled(tokenizer, text, spans)
    return cut(ids, labels, options.max_seq_length)


def cut(ids: list[int], labels: list[int], limit: int) -> Encoded:
    return Encoded(ids[:limit], labels[:limit], truncated=len(ids) > limit)
