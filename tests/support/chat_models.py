"""Tiny causal language models of real families, built offline: the family's real configuration
class (shrunk), a byte-level BPE tokenizer trained here on a few sentences that carries the
family's special tokens, and the family's real chat template (tests/support/chat_templates/:
the released Jinja files, as TRL keeps them to recognise each family: Llama 3.1, Qwen 2.5,
Gemma 2 (the same as Gemma's), Qwen3).

`FAMILIES` names, for each, what one assistant turn ends with in its template, so that a test
can say exactly which text carries the loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TEMPLATES = Path(__file__).parent / "chat_templates"

CORPUS = [
    "The capital of France is Paris. The capital of Japan is Tokyo.",
    "What is two plus two? Two plus two is four.",
    "You are a helpful assistant. Answer briefly and politely.",
    "Hello! How can I help you today? Tell me a joke about cats.",
    "Cutting Knowledge Date: December 2023 Today Date: 26 Jul 2024",
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
    "system user assistant model tool",
    "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,;:!?'\"-()[]{}",
]


@dataclass(frozen=True)
class Family:
    name: str
    config_class: str
    architecture: str
    template: str
    special: tuple[str, ...]
    bos: str | None
    eos: str
    pad: str | None
    turn_end: str
    """What the template writes after an assistant turn's text (the loss covers it too)."""
    takes_system: bool = True
    config: tuple[tuple[str, object], ...] = ()


FAMILIES = {
    "llama": Family(
        "llama", "LlamaConfig", "LlamaForCausalLM", "llama3_1.jinja",
        ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
         "<|eot_id|>"),
        bos="<|begin_of_text|>", eos="<|eot_id|>", pad=None, turn_end="<|eot_id|>",
    ),
    "qwen2": Family(
        "qwen2", "Qwen2Config", "Qwen2ForCausalLM", "qwen2_5.jinja",
        ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        bos=None, eos="<|im_end|>", pad="<|endoftext|>", turn_end="<|im_end|>\n",
    ),
    "gemma2": Family(
        "gemma2", "Gemma2Config", "Gemma2ForCausalLM", "gemma2.jinja",
        ("<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"),
        bos="<bos>", eos="<eos>", pad="<pad>", turn_end="<end_of_turn>\n", takes_system=False,
        config=(("head_dim", 8), ("query_pre_attn_scalar", 8), ("sliding_window", 64)),
    ),
    "qwen3": Family(
        "qwen3", "Qwen3Config", "Qwen3ForCausalLM", "qwen3.jinja",
        ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"),
        bos=None, eos="<|im_end|>", pad="<|endoftext|>", turn_end="<|im_end|>\n",
        config=(("head_dim", 8),),
    ),
}  # fmt: skip


def family_tokenizer(family: Family, corpus: list[str] | None = None):
    """A byte-level BPE tokenizer trained on `corpus` (and CORPUS), with the family's special
    tokens and real chat template, as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=list(family.special),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    bpe.train_from_iterator([*CORPUS, *(corpus or [])], trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token=family.bos, eos_token=family.eos,
        pad_token=family.pad or family.eos, model_max_length=4096,
    )  # fmt: skip
    tokenizer.add_special_tokens({"additional_special_tokens": list(family.special)})
    tokenizer.chat_template = (TEMPLATES / family.template).read_text()
    return tokenizer


def family_model(family: Family, tokenizer, seed: int = 0):
    """The family's causal LM from its real config class, shrunk (width 32, 2 layers)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    config = getattr(transformers, family.config_class)(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id, tie_word_embeddings=False, **dict(family.config),
    )  # fmt: skip
    config.architectures = [family.architecture]
    return getattr(transformers, family.architecture)(config)


def save_family_model(family: Family, folder: Path, corpus: list[str] | None = None) -> Path:
    """Model, tokenizer and chat template of a tiny `family` model in `folder`."""
    tokenizer = family_tokenizer(family, corpus)
    model = family_model(family, tokenizer)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


RELEASED_SIZES = {
    # meta-llama/Llama-3.1-8B-Instruct and -70B-Instruct's config.json dimensions
    "llama-3.1-8b": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256},
    "llama-3.1-70b": {"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
                      "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256},
}  # fmt: skip


def save_sized_config(name: str, folder: Path) -> Path:
    """A released Llama's config.json (no weights: the plan builds the model on the meta
    device) and a tokenizer config naming a chat template, in `folder`."""
    import json

    import transformers

    config = transformers.LlamaConfig(**RELEASED_SIZES[name], max_position_embeddings=131072)
    config.architectures = ["LlamaForCausalLM"]
    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(folder)
    template = (TEMPLATES / "llama3_1.jinja").read_text()
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    return folder
