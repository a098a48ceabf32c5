"""Command lines written for something else, read in this trainer's spelling.

Users arrive with command lines from the transformers examples, from transformers 4 blog
posts, from torchrun / accelerate / DeepSpeed launches and from the seed recipes. Their
flags that are not ours are in one table, trainer/command_line/foreign_flags.py, each with its
answer; this module applies it: renamed, switched and mapped flags are rewritten, ignored
ones dropped with one notice line each, refused ones stopped with one `error:` line that
names what to use instead. It also finds flags given twice, counting the flags a foreign
one stands for (`--evaluation_strategy steps --eval_strategy no` asks two things at once).
No message carries a flag's value: values can be secrets (`--push_to_hub_token`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from itertools import takewhile

from trainer.command_line.foreign_flags import FOREIGN_FLAGS, ForeignFlag, canonical
from trainer.command_line.recipes import CONFIG_SUFFIXES, REPEATABLE_FLAGS
from trainer.common.errors import UserError

LIST_FLAGS = {"--lora_target_modules", "--report_to"}
"""Our comma-separated flags that TRL's parsers take as a list (`nargs="+"`): `--lora_target_modules
q_proj v_proj`, as `trl sft` reads it, is `--lora_target_modules q_proj,v_proj` here."""

BOOL_WORDS = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}

WHISPER_TASKS = ("transcribe", "translate")
"""run_speech_recognition_seq2seq.py's --task is Whisper's; ours selects the training task."""


def translate_example_flags(argv: list[str]) -> tuple[list[str], list[str]]:
    """(argv in this trainer's spelling, one notice per ignored or rewritten flag);
    UserError for a refused flag or a value a mapped flag does not take."""
    out: list[str] = []
    notices: list[str] = []
    for token, name, value, foreign in _flags(argv):
        if foreign is None:
            out += token
        elif foreign == "whisper_task":
            out += ["--whisper_task", value]
        else:
            tokens, notice = _answer(name, value, foreign)
            out += tokens
            notices += [notice] if notice else []
    return out, notices


def typed_spellings(argv: list[str]) -> dict[str, str]:
    """Our flag -> the foreign flag of `argv` that set it (`--max_seq_length` -> `--max_length`):
    an error about a flag must name what the user typed, not what it was read as."""
    return {
        ours: name
        for _, name, value, foreign in _flags(argv)
        if isinstance(foreign, ForeignFlag)
        for ours in _sets(name, value, foreign)
        if ours != name
    }


def check_repeated_flags(argv: list[str]) -> None:
    """A flag given twice, also as a foreign spelling of the other (or set by a foreign flag), is
    an error: argparse would silently keep the last, and the user meant one. Lists are one flag
    with several values (`--report_to tensorboard wandb`); only the launcher's collecting flags
    (`--secret A=... --secret B=...`) may repeat."""
    given: dict[str, list[str]] = defaultdict(list)
    for _, name, value, foreign in _flags(argv):
        for effective in _sets(name, value, foreign):
            given[effective].append(name)
    for effective, names in given.items():
        if len(names) < 2 or effective in REPEATABLE_FLAGS:
            continue
        if set(names) == {effective}:
            raise UserError(f"{effective} is given {len(names)} times: give it once.")
        shown = " and ".join(dict.fromkeys(names))
        raise UserError(f"{shown} both set {effective}: give one of them.")


FlagRead = tuple[list[str], str, str | None, ForeignFlag | str | None]
"""A flag as `_flags` reads it; its table entry may also be "whisper_task"."""


def _flags(argv: list[str]) -> Iterator[FlagRead]:
    """(tokens, canonical name, value, table entry or None) per flag of `argv`; tokens that
    are no flag's value pass through on their own."""
    i = 0
    while i < len(argv):
        flag, used = _flag_at(argv, i)
        yield flag
        i += used


def _flag_at(argv: list[str], i: int) -> tuple[FlagRead, int]:
    """The flag that starts at `argv[i]`, and how many tokens it spans: its value may be the
    token after it, and a list flag's values run up to the next flag."""
    token = argv[i]
    if not token.startswith("--"):
        return ([token], token, None, None), 1
    raw, inline = token.split("=", 1) if "=" in token else (token, None)
    name = canonical(raw)
    following = argv[i + 1] if i + 1 < len(argv) else None
    if name == "--task" and (whisper := _whisper_task(token, inline, following)):
        return whisper
    if name in LIST_FLAGS and inline is None:
        return _list_flag(token, name, argv[i + 1 :])
    foreign = FOREIGN_FLAGS.get(name)
    if foreign is None:
        return ([token], name, inline, None), 1
    value, used = _value(foreign, inline, following)
    return (argv[i : i + used], name, value, foreign), used


def _whisper_task(
    token: str, inline: str | None, following: str | None
) -> tuple[FlagRead, int] | None:
    """`--task transcribe` or `translate`: run_speech_recognition_seq2seq.py's Whisper task,
    not ours (which selects the training task); None for any other value."""
    value = inline if inline is not None else following
    if value not in WHISPER_TASKS:
        return None
    return ([token], "--task", value, "whisper_task"), 1 if inline is not None else 2


def _list_flag(token: str, name: str, rest: list[str]) -> tuple[FlagRead, int]:
    """A list flag as TRL's parsers take it (`--f a b`): its values up to the next flag or
    recipe, joined by commas as ours takes them."""
    values = list(takewhile(_list_value, rest))
    joined = [token, ",".join(values)] if values else [token]
    return (joined, name, joined[-1] if values else None, None), 1 + len(values)


def _list_value(token: str) -> bool:
    """A value of a list flag: not a flag, nor a recipe file (which is only ever first)."""
    return not token.startswith("-") and not token.endswith(CONFIG_SUFFIXES)


def _value(foreign: ForeignFlag, inline: str | None, following: str | None) -> tuple[str, int]:
    """The flag's value and how many tokens it spans: `--f=v` 1, `--f v` 2, a bare switch
    (or one followed by another flag) 1, with the value "true"."""
    if inline is not None:
        return inline, 1
    if following is None or following.startswith("--"):
        return "true", 1
    if foreign.takes_value or following.lower() in BOOL_WORDS:
        return following, 2
    return "true", 1


def _answer(name: str, value: str, foreign: ForeignFlag) -> tuple[list[str], str | None]:
    """The flag's replacement tokens and its notice line, by the table's kind."""
    false = BOOL_WORDS.get(value.lower()) is False and not foreign.takes_value
    if false and foreign.kind in ("switch", "refused"):
        return [], None  # a switch set false asks for nothing
    return ANSWERS[foreign.kind](name, value, foreign)


def _renamed(name: str, value: str, foreign: ForeignFlag) -> tuple[list[str], str]:
    instead = foreign.check and foreign.check(value)
    if instead:
        raise UserError(f"{name}: {instead}.")
    return [foreign.answer, value], f"{name} read as {foreign.answer}{_note(foreign)}"


def _switch(name: str, value: str, foreign: ForeignFlag) -> tuple[list[str], str]:
    return list(foreign.tokens), f"{name} read as {' '.join(foreign.tokens)}{_note(foreign)}"


def _note(foreign: ForeignFlag) -> str:
    """What else the flag may have meant (`--num_workers` is Ray's worker count there)."""
    return f" ({foreign.note})" if foreign.note else ""


def _mapped(name: str, value: str, foreign: ForeignFlag) -> tuple[list[str], str]:
    instead = foreign.check and foreign.check(value)
    if instead:
        raise UserError(f"{name}: {instead}.")
    tokens = foreign.values.get(value)
    if tokens is None and foreign.passes_others:
        return [name, value], None
    if tokens is None:
        note = f" ({foreign.answer})" if foreign.answer else ""
        raise UserError(f"{name} takes one of {', '.join(foreign.values)}{note}.")
    if not tokens:
        return [], f"{name} {value} ignored: {foreign.answer}"
    return list(tokens), f"{name} {value} read as {' '.join(tokens)}"


def _ignored(name: str, value: str, foreign: ForeignFlag) -> tuple[list[str], str]:
    return [], f"{name} ignored: {foreign.answer}"


def _refused(name: str, value: str, foreign: ForeignFlag) -> tuple[list[str], str]:
    raise UserError(f"{name} is not a flag of this trainer ({foreign.source}): "
                    f"{foreign.answer} (docs/launching.md).")  # fmt: skip


ANSWERS = {"renamed": _renamed, "switch": _switch, "mapped": _mapped, "ignored": _ignored,
           "refused": _refused}  # fmt: skip
"""The table's kinds (trainer/command_line/foreign_flags.py) -> how a flag of the kind is
answered: (its replacement tokens, its notice line), or a UserError."""


def _sets(name: str, value: str | None, foreign) -> list[str]:
    """The flags of this trainer that a given flag sets (itself, when it is ours)."""
    if foreign is None:
        return [name] if name.startswith("--") else []
    if foreign == "whisper_task":
        return ["--whisper_task"]
    tokens = {"renamed": (foreign.answer,), "switch": foreign.tokens,
              "mapped": foreign.values.get(value) or ()}.get(foreign.kind, ())  # fmt: skip
    return [token for token in tokens if token.startswith("--")] or [name]
