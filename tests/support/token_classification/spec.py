"""The tagging task's spec: its flags, the models and data folders it claims, its `TaskSpec`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.support.token_classification.serving import TaggingPredictor
from trainer.common.errors import UserError
from trainer.common.flag_fields import flag
from trainer.data.sources import LocalLayout
from trainer.tasks.model_config import has_head
from trainer.tasks.task_spec import TaskSpec

NAME = "token-classification"


@dataclass(frozen=True)
class TaggingArguments:
    tags_column_name: str = flag("tags", "Column with each word's tag, separated by spaces.")


def is_tagger(config: dict) -> bool:
    return has_head(config, "ForTokenClassification")


def detect_tagged_texts(directory: Path) -> LocalLayout:
    """A folder of `SPLIT.conll` files."""
    files = sorted(directory.glob("*.conll"))
    if not files:
        raise UserError(f"{directory} holds no .conll files")
    return LocalLayout(builder="text", splits={path.stem: [path] for path in files},
                       columns=frozenset({"tokens", "tags"}))  # fmt: skip


SPEC = TaskSpec(
    name=NAME,
    flags=TaggingArguments,
    training="tests.support.token_classification.training:TaggingTask",
    claims_model=is_tagger,
    detect_layout=detect_tagged_texts,
    predictor=TaggingPredictor,
    lora_targets={"bert": ("key",)},
)
