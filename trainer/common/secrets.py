"""What counts as a secret, and how it is kept out of every line and file.

Secrets reach a run three ways: the Trainer's `--hub_token` flag, ordinary environment
variables (`HF_TOKEN`, `WANDB_API_KEY`), and `--secret NAME=projects/P/secrets/S/versions/V`, a
Secret Manager reference the launcher resolves into the training processes' environment
(trainer/node/secret_manager.py). No value may be printed or saved: a flag's value shows as
`***` wherever flags are shown (`masked_value`), and a line that could quote one (an error, a
notice) goes through `mask` with this run's values (`secret_values`). The Trainer pickles its
`TrainingArguments` into every checkpoint and the delivered model (training_args.bin), so
`scrub_training_arguments` empties their token fields first; the Hub client reads the token
from `HF_TOKEN` instead. `looks_secret` alone decides what looks secret, for the dry run, the
error lines, the job spec generator's refusals and the scrub.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, MutableMapping

from trainer.common.errors import UserError
from trainer.common.handoff import SECRET_VARIABLES_VARIABLE

SECRET_WORDS = ("token", "key", "secret", "password", "passwd", "credential", "credentials")
"""A name (flag or environment variable) holding one of these as a word, or a word ending in
one (`apikey`, `hubtoken`), looks secret: `--hub_token`, `--hub-token`, `WANDB_API_KEY`.
Plurals like `tokens` (`--average_tokens_across_devices`) count things and do not."""

REFERENCE_FLAG = "--secret"
"""The flag that carries Secret Manager references (resource names, not values): shown as
given, and the one secret-looking flag a job spec may hold."""

MASK = "***"

MIN_MASKED_LENGTH = 4
"""Values shorter than this are not searched for in text: a one-letter "secret" would turn
every line into asterisks, and a value that short protects nothing anyway."""

HUB_TOKEN_VARIABLE = "HF_TOKEN"

SECRET_FLAG_VARIABLES = {"hub_token": HUB_TOKEN_VARIABLE}
"""Every secret-looking training flag -> the environment variable its library reads instead, in
which the launcher hands the value over, so it never travels in the run configuration
(tests/unit/test_secrets.py fails for a secret-looking flag missing here)."""

REFERENCE = re.compile(
    r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)="
    r"(?P<resource>projects/[^/\s]+/secrets/[A-Za-z0-9_-]+/versions/(?:latest|[1-9][0-9]*))"
)
"""NAME=projects/PROJECT/secrets/SECRET/versions/VERSION: an environment variable name, and
a secret version's resource name (secret ids are letters, digits, `-` and `_`; a version is
a number or `latest`)."""


SPECIAL_TOKENS = ("eos", "bos", "pad", "unk", "sep", "cls", "mask")
"""A tokenizer's special tokens (TRL's `--eos_token`, `--pad_token`): the text of a token, not
a credential, though its name ends in `token`."""


def looks_secret(name: str) -> bool:
    """Whether a flag (`--hub-token`) or variable (`HF_TOKEN`) name says its value is secret."""
    if name == REFERENCE_FLAG:
        return False
    words = re.split(r"[-_]+", name.lower().lstrip("-"))
    if len(words) == 2 and words[0] in SPECIAL_TOKENS and words[1] == "token":
        return False
    return any(word.endswith(SECRET_WORDS) for word in words)


def masked_value(name: str, value: object) -> object:
    """The value as shown to anyone: `***` for a set, secret-looking flag or variable."""
    return MASK if value not in (None, "") and looks_secret(name) else value


def secret_values(argv: Iterable[str], env: Mapping[str, str]) -> list[str]:
    """What `mask` hides: values of secret-looking flags in `argv` (`--x V`, `--x=V`) and of
    `env`'s secret-looking variables or those the launcher filled with secrets."""
    return secret_variable_values(env) + secret_flag_values(list(argv))


def secret_variable_values(env: Mapping[str, str]) -> list[str]:
    """The values of `env`'s variables that look secret by name, or that the launcher filled
    with resolved `--secret` references (any name: TRAINER_SECRET_VARIABLES lists them)."""
    filled = set(env.get(SECRET_VARIABLES_VARIABLE, "").split(","))
    return [v for name, v in env.items() if v and (looks_secret(name) or name in filled)]


def secret_flag_values(argv: list[str]) -> list[str]:
    """The values of `argv`'s secret-looking flags, given either way argparse takes them."""
    values = []
    for i, token in enumerate(argv):
        name, equals, inline = token.partition("=")
        if name.startswith("--") and looks_secret(name):
            values += [inline] if equals else separate_value(argv, i)
    return values


def separate_value(argv: list[str], i: int) -> list[str]:
    """The value of the flag `argv[i]` given as the next token (`--x V`), if one follows: a
    flag followed by another flag, or by nothing, has none to hide."""
    following = argv[i + 1] if i + 1 < len(argv) else None
    return [] if following is None or following.startswith("--") else [following]


def mask(text: str, secrets: Iterable[str]) -> str:
    """`text` with every occurrence of each secret value replaced by `***`."""
    for value in sorted({s for s in secrets if len(s) >= MIN_MASKED_LENGTH}, key=len, reverse=True):
        text = text.replace(value, MASK)
    return text


def parse_references(items: Iterable[str]) -> dict[str, str]:
    """`--secret` values -> {variable name: secret version resource name}. A malformed one
    is a UserError that quotes only the name before `=`: a user who put the secret itself
    there must not see it printed back."""
    references: dict[str, str] = {}
    for item in items:
        match = REFERENCE.fullmatch(item)
        name = item.split("=", 1)[0]
        if match is None:
            raise UserError(
                f"--secret {name}=...: expected NAME=projects/PROJECT/secrets/SECRET/versions/"
                "VERSION (a Secret Manager reference, never the secret itself; VERSION is a "
                "number or latest)."
            )
        if name in references:
            raise UserError(f"--secret {name} is given twice: give each variable once.")
        references[name] = match["resource"]
    return references


def scrub_training_arguments(arguments, env: MutableMapping[str, str]) -> None:
    """Empty every secret-looking field of `arguments` (a TrainingArguments), which the Trainer
    pickles into every checkpoint and the model and writes to TensorBoard. A token still set (a
    caller other than the launcher, which hands it over as HF_TOKEN) moves to `env`, where the
    Hub client looks (huggingface_hub's get_token reads HF_TOKEN at each call)."""
    for field in dataclasses.fields(arguments):
        value = getattr(arguments, field.name)
        if value is None or not looks_secret(field.name):
            continue
        if field.name in SECRET_FLAG_VARIABLES:
            env[SECRET_FLAG_VARIABLES[field.name]] = value
        setattr(arguments, field.name, None)
