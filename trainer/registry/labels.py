"""Vertex AI's rules for a model's display name and labels, checked before any request.

Labels, as the API documents `Model.labels` (google.cloud.aiplatform.v1 Model, field 17):
"Label keys and values can be no longer than 64 characters (Unicode codepoints), can only
contain lowercase letters, numeric characters, underscores and dashes. International
characters are allowed." It points at Google Cloud's general label rules (goo.gl/xmQnxf,
"Creating and managing labels"), which add: keys start with a lowercase letter, at most 63
characters for keys and values, at most 64 labels a resource. Both hold here: at most 63
characters, ASCII only (international characters are allowed but would buy nothing for the
values this project writes), keys start with a letter, at most 64 labels.

Display names, as the API documents `Model.display_name`: "can be up to 128 characters long
and can consist of any UTF-8 characters" (`whisper demo` is one). Version aliases, as it
documents `Model.version_aliases`: `[a-z][a-zA-Z0-9-]{0,126}[a-z0-9]` (told apart from version
ids, which are numbers), unique within a model.

Our label values come from model ids, metric values and image tags (`openai/whisper-small`,
`0.1234`, `sha256:...`), so values are made to fit (lowercased, any other character turned
into `_`, cut at 63); keys and names are the caller's words, and are refused when they break
the rules.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from trainer.common.errors import UserError

MAX_LABEL_CHARS = 63
MAX_LABELS = 64
MAX_NAME_CHARS = 128

LABEL_KEY = re.compile(rf"[a-z][a-z0-9_-]{{0,{MAX_LABEL_CHARS - 1}}}")
NOT_IN_A_LABEL = re.compile(r"[^a-z0-9_-]")
VERSION_ALIAS = re.compile(r"[a-z][a-zA-Z0-9-]{0,126}[a-z0-9]")


def check_version_aliases(aliases: tuple[str, ...]) -> None:
    """UserError for an alias the registry would refuse: its pattern, or given twice."""
    for alias in aliases:
        if not VERSION_ALIAS.fullmatch(alias):
            raise UserError(
                f"--version_alias {alias!r} is not a Vertex AI version alias: "
                "[a-z][a-zA-Z0-9-]{0,126}[a-z0-9] (a lowercase letter first, a lowercase letter "
                "or digit last, 2 to 128 characters)"
            )
    if len(set(aliases)) != len(aliases):
        raise UserError("--version_alias: each alias once")


def label_value(text: str) -> str:
    """`text` as a valid label value: lowercased, other characters `_`, at most 63 long."""
    return NOT_IN_A_LABEL.sub("_", text.lower())[:MAX_LABEL_CHARS]


def check_name_and_labels(name: str, labels: Mapping[str, str]) -> dict[str, str]:
    """The labels, their values made valid (`label_value`), or UserError naming what breaks
    Vertex AI's rules: the display name, a key, or too many labels. Cheap and offline: the
    training chief calls it at launch, long before the model exists."""
    if not name.strip() or len(name) > MAX_NAME_CHARS:
        raise UserError(
            f"--name {name!r} is not a Vertex AI model name: any UTF-8 characters, not all "
            f"blank, at most {MAX_NAME_CHARS} (this one has {len(name)})"
        )
    bad_keys = [key for key in labels if not LABEL_KEY.fullmatch(key)]
    if bad_keys:
        raise UserError(
            f"label key {bad_keys[0]!r} breaks Vertex AI's label rules: lowercase letters, "
            f"digits, '-' and '_', starting with a letter, at most {MAX_LABEL_CHARS} characters"
        )
    if len(labels) > MAX_LABELS:
        raise UserError(f"{len(labels)} labels: Vertex AI takes at most {MAX_LABELS} a model")
    return {key: label_value(value) for key, value in labels.items()}
