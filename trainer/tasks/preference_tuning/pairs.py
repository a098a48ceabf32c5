"""A preference row checked before TRL tokenises it, in TRL's formats: standard (texts) or
conversational (lists of `{role, content}` turns), with an explicit prompt (`prompt`,
`chosen`, `rejected`) or an implicit one (`chosen` and `rejected` two whole texts or chats that
share their beginning, which TRL's `extract_prompt` takes as the prompt).

A row that is not one is `BadPair` (the task skips and counts it under --max_bad_examples): a
side missing or empty, sides of different formats, a turn without a role or text, chosen equal
to rejected, or an implicit prompt they do not share (two chats whose first turns differ, two
texts with nothing in common)."""

from __future__ import annotations

from typing import Any

ROLES = ("system", "user", "assistant", "tool")


class BadPair(Exception):
    """This row cannot be trained on; the message says why, in a few words."""


def checked_turns(turns: Any, what: str) -> None:
    if not isinstance(turns, list) or not turns:
        raise BadPair(f"{what} is empty")
    for number, turn in enumerate(turns):
        if not isinstance(turn, dict) or turn.get("role") not in ROLES:
            raise BadPair(f"{what} turn {number} has no known role")
        content = turn.get("content")
        if not isinstance(content, str) or not content.strip():
            raise BadPair(f"{what} turn {number} has no text")


def checked_side(value: Any, what: str) -> str:
    """'text' or 'chat'; BadPair for a side missing or empty."""
    if value is None or value == "" or value == []:
        raise BadPair(f"no {what}")
    if isinstance(value, str):
        if not value.strip():
            raise BadPair(f"{what} is empty")
        return "text"
    checked_turns(value, what)
    return "chat"


def shared_beginning(chosen: Any, rejected: Any) -> int:
    """How many leading characters (texts) or turns (chats) the two sides share."""
    count = 0
    for a, b in zip(chosen, rejected, strict=False):
        if a != b:
            break
        count += 1
    return count


def check_pair(row: dict, explicit: bool) -> None:
    """BadPair when `row` is no preference pair (see the module); `explicit`: its split has a
    `prompt` column (TRL then takes every row's prompt from it)."""
    chosen, rejected, prompt = row.get("chosen"), row.get("rejected"), row.get("prompt")
    kinds = {checked_side(chosen, "chosen"), checked_side(rejected, "rejected")}
    if explicit:
        kinds.add(checked_side(prompt, "prompt"))
    if len(kinds) > 1:
        raise BadPair("texts and chats mixed")
    if chosen == rejected:
        raise BadPair("chosen equals rejected")
    if explicit:
        return
    shared = shared_beginning(chosen, rejected)
    if shared == 0 or shared in (len(chosen), len(rejected)):
        raise BadPair("chosen and rejected share no prompt")


def prompt_and_chosen(row: dict) -> tuple[Any, Any]:
    """A checked row's prompt (text or turns) and chosen answer, an implicit prompt split off
    where the two sides stop sharing (as TRL's `extract_prompt` does)."""
    if row.get("prompt") is not None:
        return row["prompt"], row["chosen"]
    shared = shared_beginning(row["chosen"], row["rejected"])
    return row["chosen"][:shared], row["chosen"][shared:]
