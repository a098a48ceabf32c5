"""What a model's config.json says, read as JSON: its architectures, whether one has a given head,
and which kinds of model transformers has for a task (its auto classes' tables of model types).

Every task is asked whether a model is for it (`TaskSpec.claims_model`: the resolution, the
server, the registry), so asking must cost nothing: importing transformers loads torch (2.5 s
or more in a fresh process). The auto classes' tables are read from transformers' own
`modeling_auto.py`, parsed (not imported), so they stay those of the installed transformers
(tests/unit/test_task_folders.py compares them with the imported ones)."""

from __future__ import annotations

import ast
import importlib.util
from functools import cache
from pathlib import Path

CAUSAL_LMS = "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"
MASKED_LMS = "MODEL_FOR_MASKED_LM_MAPPING_NAMES"
SEQ2SEQ_LMS = "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"
IMAGE_CLASSIFIERS = "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"
TEXT_CLASSIFIERS = "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"
"""The auto tables the tasks' recognisers ask."""


def architectures(config: dict) -> list[str]:
    return list(config.get("architectures") or [])


def has_head(config: dict, *heads: str) -> bool:
    """Whether one of the config's architectures ends with one of `heads`."""
    return any(name.endswith(heads) for name in architectures(config))


def model_types(table: str) -> frozenset[str]:
    """The model types in one of transformers' auto tables, by its name in
    transformers/models/auto/modeling_auto.py (`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`...)."""
    return _auto_tables()[table]


@cache
def _auto_tables() -> dict[str, frozenset[str]]:
    """Every `*_MAPPING_NAMES = OrderedDict([(model type, class name(s)), ...])` of
    modeling_auto.py written out as literals (a table built from another's items is left
    out), found where the installed transformers is, without importing it."""
    package = importlib.util.find_spec("transformers")
    if package is None or package.origin is None:
        raise ModuleNotFoundError("transformers is not installed")
    source = Path(package.origin).parent / "models" / "auto" / "modeling_auto.py"
    tables = (_literal_table(node) for node in ast.parse(source.read_text()).body)
    return {name: types for name, types in filter(None, tables)}


def _literal_table(node: ast.stmt) -> tuple[str, frozenset[str]] | None:
    """(name, model types) of a statement `NAME_MAPPING_NAMES = OrderedDict([...literal...])`."""
    if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and node.value.args):
        return None
    names = [target.id for target in node.targets if isinstance(target, ast.Name)]
    if len(names) != 1 or not names[0].endswith("_MAPPING_NAMES"):
        return None
    try:
        pairs = ast.literal_eval(node.value.args[0])
    except ValueError:
        return None
    return names[0], frozenset(model_type for model_type, _ in pairs)
