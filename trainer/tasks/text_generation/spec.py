"""The text generation task's spec: supervised fine-tuning of causal language models (Gemma,
Llama, Qwen, Mistral, Phi...) on chats, prompt/completion pairs or plain text, through TRL's
`SFTTrainer`; its flags, which models it claims, the layout of a folder of tables, and how a
delivered model serves (the training code: training.py; the rows and their loss
mask: loss_mask.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainer.common.errors import UserError
from trainer.common.flag_fields import flag
from trainer.data.sources import LocalLayout, table_folder_layout
from trainer.settings.mixtures import read_mixture
from trainer.tasks.causal_lm import CAUSAL_LM_LORA_TARGETS, chat_template_text
from trainer.tasks.model_config import (
    CAUSAL_LMS,
    MASKED_LMS,
    SEQ2SEQ_LMS,
    architectures,
    has_head,
    model_types,
)
from trainer.tasks.task_spec import TaskSpec
from trainer.tasks.text_generation.serving import GenerationPredictor

NAME = "text-generation"

CAUSAL_HEADS = ("ForCausalLM", "LMHeadModel")
"""Architecture names of decoder-only language models (`LlamaForCausalLM`, `GPT2LMHeadModel`)."""

CONVERSATIONAL = "messages"
PROMPT, COMPLETION = "prompt", "completion"


@dataclass(frozen=True)
class ChatArguments:
    dataset_text_field: str = flag(
        "text", "Column of plain text (language modelling), when the data has no messages."
    )
    max_seq_length: int = flag(
        1024, "Tokens per example (TRL's --max_length); longer ones are truncated and counted."
    )
    refuse_long_examples: bool = flag(
        False, "Refuse the data (one line) when an example is longer than --max_seq_length."
    )
    packing: bool = flag(
        False,
        "Pack examples into --max_seq_length sequences; no token attends across examples.",
    )
    assistant_only_loss: bool = flag(
        True, "Chats: loss on the assistant's turns only; false: on the whole chat."
    )
    completion_only_loss: bool = flag(
        True, "Prompt/completion: loss on the completion only; false: on the whole text."
    )
    chat_template: str | None = flag(
        None,
        "A Jinja chat template (file or text) for the model's.",
    )
    eos_token: str | None = flag(None, "End-of-sequence token in place of the tokenizer's.")
    train_file: str | None = flag(None, "run_clm.py's training file.")
    validation_file: str | None = flag(None, "run_clm.py's evaluation file.")
    dataset_mixture: str | None = flag(None, "Datasets mixed (TRL's YAML).")
    generation_samples: int = flag(
        0, "At each evaluation, generate from this many evaluation prompts and log them."
    )
    max_new_tokens: int = flag(64, "Tokens generated per sample and per --do_predict example.")

    def __post_init__(self) -> None:
        if self.max_seq_length < 2:
            raise ValueError("--max_seq_length must be at least 2.")
        if self.generation_samples < 0 or self.max_new_tokens < 1:
            raise ValueError("--generation_samples must be >= 0 and --max_new_tokens >= 1.")
        if self.chat_template is not None and chat_template_text(self.chat_template) is None:
            raise ValueError(f"--chat_template {self.chat_template}: no such file (nor a Jinja "
                             "template: one has {% ... %} or {{ ... }}).")  # fmt: skip
        if self.dataset_mixture:
            read_mixture(self.dataset_mixture)  # a ValueError names the flag

    def data_files(self) -> dict[str, Path]:
        """Split name -> file, for the files given by flag (run_clm.py's; empty for
        --dataset_name)."""
        files = {"train": self.train_file, "validation": self.validation_file}
        return {split: Path(path).expanduser() for split, path in files.items() if path}


def is_causal_lm(config: dict) -> bool:
    """A decoder-only language model: its architecture ends ForCausalLM (or LMHeadModel), or,
    naming none, its type is one transformers has only causal language models of (a Llama
    config without `architectures`; never BERT, whose type also has a causal head)."""
    if architectures(config):
        return has_head(config, *CAUSAL_HEADS)
    kind = config.get("model_type")
    return (
        kind in model_types(CAUSAL_LMS)
        and kind not in model_types(MASKED_LMS)
        and kind not in model_types(SEQ2SEQ_LMS)
    )


def data_format(columns: set[str] | frozenset[str], text_field: str = "text") -> str | None:
    """conversational, prompt-completion or text, from a split's columns; None for none."""
    if CONVERSATIONAL in columns:
        return "conversational"
    if {PROMPT, COMPLETION} <= set(columns):
        return "prompt-completion"
    if text_field in columns:
        return "text"
    return None


FORMATS_LINE = (
    'a "messages" column (a list of {role, content}), "prompt" and "completion" columns, '
    "or a text column (--dataset_text_field)"
)


def detect_local_layout(directory: Path) -> LocalLayout:
    """A folder of one table file per split (JSONL, Parquet, CSV...) holding chats, prompt and
    completion pairs, or texts without labels (a `label` column is a classifier's data)."""
    layout = table_folder_layout(directory, "train.jsonl, test.jsonl")
    if data_format(layout.columns) is None or "label" in layout.columns:
        raise UserError(f"{directory} holds no chats: its tables need {FORMATS_LINE}.")
    return layout


SPEC = TaskSpec(
    name=NAME,
    flags=ChatArguments,
    training="trainer.tasks.text_generation.training:ChatTask",
    claims_model=is_causal_lm,
    detect_layout=detect_local_layout,
    predictor=GenerationPredictor,
    # every linear layer of the blocks, as QLoRA (Dettmers et al. 2023, sec. 4) found best
    lora_targets=CAUSAL_LM_LORA_TARGETS,
    recipes=(
        "llama-3.1-8b-qlora-l4.yaml",
        "llama-3.1-8b-full-a3.yaml",
        "llama-3.1-70b-full-a3.yaml",
        "chat-demo.yaml",
    ),
    demo="trainer.tasks.text_generation.demo",
    demo_recipe="chat-demo.yaml",
)
