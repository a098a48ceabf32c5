"""The preference tuning task's spec: DPO and its variants through TRL's `DPOTrainer`, on
rows of a chosen and a rejected answer (with a `prompt`, or two whole chats sharing their
beginning); its flags, the layout of a folder of such tables, and what serves its delivered
model (the text-generation task's predictor: `serves_as`).

It claims no model: a causal language model is text generation's (the registry asks that
task); its data, `chosen` and `rejected` columns, is what selects this task when `--task` is
not given (trainer/config/task_inference.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainer.common.errors import UserError
from trainer.common.flag_fields import flag
from trainer.data.sources import LocalLayout, table_folder_layout
from trainer.tasks.causal_lm import CAUSAL_LM_LORA_TARGETS, chat_template_text
from trainer.tasks.task_spec import TaskSpec

NAME = "preference-tuning"
CHOSEN, REJECTED, PROMPT = "chosen", "rejected", "prompt"

LOSS_TYPES = (
    "sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot",
    "aot_unpaired", "apo_zero", "apo_down", "discopop", "sft", "sigmoid_norm",
)  # fmt: skip
"""TRL 1.16's `DPOConfig.loss_type` values (tests/unit/test_preference_task.py holds them to
TRL's own)."""


@dataclass(frozen=True)
class PreferenceArguments:
    beta: float = flag(
        0.1, "How far the model may move from the reference (TRL's beta; IPO's tau)."
    )
    loss_type: str = flag(
        "sigmoid",
        "TRL's loss: sigmoid (DPO), ipo, hinge, robust, ...; several, comma-separated, summed.",
    )
    label_smoothing: float = flag(
        0.0, "Robust DPO's flipped-label probability in [0, 0.5); EXO's epsilon."
    )
    rpo_alpha: float | None = flag(
        None, "RPO: add TRL's sft loss (the chosen answer's NLL) with this weight."
    )
    precompute_ref_log_probs: bool = flag(
        False, "Compute the reference's log-probabilities once before training (no 2nd model)."
    )
    max_seq_length: int = flag(
        1024, "Tokens of prompt + answer (TRL's max_length); longer pairs are cut and counted."
    )
    chat_template: str | None = flag(None, "A Jinja chat template (file or text) for the model's.")
    generation_samples: int = flag(
        0, "At each evaluation, generate from this many evaluation prompts and print them."
    )
    max_new_tokens: int = flag(64, "Tokens generated per sample.")

    def __post_init__(self) -> None:
        unknown = [name for name in self.loss_types if name not in LOSS_TYPES]
        if unknown or not self.loss_types:
            raise ValueError(f"--loss_type {self.loss_type}: choose from {', '.join(LOSS_TYPES)}.")
        wrong = next((line for bad, line in self.value_checks() if bad), None)
        if wrong:
            raise ValueError(wrong)

    def value_checks(self) -> list[tuple[bool, str]]:
        """(the value is wrong, the line that says so) for each numeric flag and the file."""
        template = self.chat_template
        return [
            (self.beta <= 0, "--beta must be positive."),
            (not 0.0 <= self.label_smoothing < 0.5, "--label_smoothing must be in [0, 0.5)."),
            (self.rpo_alpha is not None and self.rpo_alpha <= 0, "--rpo_alpha must be positive."),
            (self.max_seq_length < 2, "--max_seq_length must be at least 2."),
            (self.generation_samples < 0 or self.max_new_tokens < 1,
             "--generation_samples must be >= 0 and --max_new_tokens >= 1."),
            (template is not None and chat_template_text(template) is None,
             f"--chat_template {template}: no such file (nor a Jinja template: one has "
             "{% ... %} or {{ ... }})."),
        ]  # fmt: skip

    @property
    def loss_types(self) -> list[str]:
        return [name.strip() for name in self.loss_type.split(",") if name.strip()]

    def losses(self) -> tuple[list[str], list[float] | None]:
        """TRL's `loss_type` and `loss_weights`: --rpo_alpha adds its `sft` term with that
        weight (RPO, as TRL's docs combine it), the others weighing 1."""
        names = self.loss_types
        if self.rpo_alpha is None:
            return names, None
        return [*names, "sft"], [1.0] * len(names) + [self.rpo_alpha]


def claims_no_model(config: dict) -> bool:
    """Its models are text generation's, which claims them; the data selects this task."""
    return False


def is_preference_table(columns: frozenset[str] | set[str]) -> bool:
    return {CHOSEN, REJECTED} <= set(columns)


def detect_local_layout(directory: Path) -> LocalLayout:
    """A folder of one table file per split (JSONL, Parquet, CSV...) with `chosen` and
    `rejected` columns (and `prompt`, for an explicit prompt)."""
    layout = table_folder_layout(directory, "train.jsonl, test.jsonl")
    if not is_preference_table(layout.columns):
        raise UserError(f'{directory} holds no preference pairs: its tables need "chosen" and '
                        '"rejected" columns (and "prompt", or two chats sharing their '
                        "beginning).")  # fmt: skip
    return layout


SPEC = TaskSpec(
    name=NAME,
    flags=PreferenceArguments,
    training="trainer.tasks.preference_tuning.training:PreferenceTask",
    claims_model=claims_no_model,
    detect_layout=detect_local_layout,
    serves_as="text-generation",
    # every linear layer of the blocks, as the text-generation task's defaults
    lora_targets=CAUSAL_LM_LORA_TARGETS,
    recipes=(
        "llama-3.1-8b-dpo-qlora-l4.yaml",
        "llama-3.1-8b-dpo-full-a3.yaml",
        "llama-3.1-8b-sft-then-dpo.yaml",
        "preference-demo.yaml",
    ),
    demo="trainer.tasks.preference_tuning.demo",
    demo_recipe="preference-demo.yaml",
)
"""Preference tuning: DPO and its variants on chosen/rejected pairs, through TRL's
`DPOTrainer`; its delivered model is a text-generation model, served as one."""
