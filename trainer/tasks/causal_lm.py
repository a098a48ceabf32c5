"""What the tasks that train causal language models share (text generation, preference
tuning): the `--chat_template` they take, written inline or as a file, how the model and its
tokenizer are loaded, the run's arguments as their TRL trainer's config, and their demos' tiny
Qwen2 and the invented countries they ask about."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from trainer.tasks.lora_adapters import eight_bit_loading

if TYPE_CHECKING:
    from transformers import PreTrainedModel


CAUSAL_LM_LORA_TARGETS = {
    **{
        kind: ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
        for kind in ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text")
    },
    "phi3": ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"),
}
"""Model type -> the modules that get LoRA adapters by default: every linear layer of the
blocks, as QLoRA (Dettmers et al. 2023, sec. 4) found best."""


def chat_template_text(value: str | None) -> str | None:
    """The chat template `--chat_template` gives: written inline (as the alignment-handbook's and
    open-r1's recipes do, or `--chat_template "$(cat t.jinja)"`), or a file's text; None when
    it is neither (or not given)."""
    if value is None:
        return None
    if is_inline_template(value):
        return value
    path = Path(value)
    return path.read_text() if _a_file_name(value) and path.is_file() else None


def is_inline_template(value: str) -> bool:
    """A Jinja template, not a file name: it has a statement or an expression."""
    return "{%" in value or "{{" in value


def _a_file_name(value: str) -> bool:
    """Short enough, and on one line, to name a file (a longer one is no name the system takes:
    errno 36, file name too long)."""
    return "\n" not in value and all(len(part) <= 255 for part in value.split("/"))


class CausalLanguageModel:
    """The model side of a `Task` that trains a causal language model: its class, its loading
    (fp32 master weights, bf16 beside 4-bit frozen ones as QLoRA does), the full-precision copy
    an adapter merges into, and its tokenizer with the run's chat template and a pad token."""

    def model_class(self):
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM

    def load_model(self, quantized: bool = True) -> PreTrainedModel:
        import torch

        kwargs = eight_bit_loading(self.model_args) if quantized else {}
        return self.model_class().from_pretrained(
            self.model_args.model_name_or_path,
            cache_dir=self.model_args.cache_dir,
            attn_implementation=self.model_args.attn_implementation,
            # fp32 master weights (--bf16 computes in 16 bits); with 4-bit frozen weights the
            # rest (embeddings, norms, head) in bf16, as QLoRA does
            dtype=torch.bfloat16 if self.model_args.load_in_4bit else torch.float32,
            **kwargs,
        )

    def model_to_merge_into(self) -> PreTrainedModel:
        return self.load_model(quantized=False)

    def templated_tokenizer(self):
        """The model's tokenizer, with `--chat_template` in place of its own where given."""
        from transformers import AutoTokenizer

        path = self.model_args.model_name_or_path
        tokenizer = AutoTokenizer.from_pretrained(path, cache_dir=self.model_args.cache_dir)
        if self.options.chat_template:
            tokenizer.chat_template = chat_template_text(self.options.chat_template)
        return tokenizer


def decoder_layer_values(config, positions: int) -> int:
    """Activation values one decoder layer keeps for `positions` positions of width h with
    fused attention (Korthikanti et al. 2022, sec. 4.1: 34 s b h bytes at 16 bits, counted in
    values: 17 s h, the MLP's two intermediate tensors at its own width)."""
    h = config.hidden_size
    mlp = getattr(config, "intermediate_size", 4 * h) or 4 * h
    return positions * (10 * h + 2 * mlp + 2 * h)


def retyped_arguments(args, config_class: type):
    """`args` (the run's TrainingArguments, as built and checked) as a TrainingArguments subclass
    (TRL's SFTConfig, DPOConfig): the same object's values, copied, with the subclass's own
    fields at their defaults for the task to set. Not `config_class(**args.to_dict())`: that
    builds the arguments again, DeepSpeed's config and the process's distributed state with
    them, and the rebuilt DeepSpeed batch sizes no longer agreed with the world size (ZeRO-3,
    2 processes)."""
    config = copy.copy(args)
    config.__class__ = config_class
    for field in dataclasses.fields(config_class):
        if not hasattr(config, field.name):
            factory = field.default_factory
            default = field.default if factory is dataclasses.MISSING else factory()
            setattr(config, field.name, default)
    return config


QWEN_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


COUNTRIES = ("Zorvia", "Quelland", "Marnok", "Tivessa", "Brolt", "Yendra", "Culpa", "Osgard",
             "Pellan", "Rusk", "Vantor", "Ilbeth")  # fmt: skip
CAPITALS = ("Velt", "Arrin", "Pesk", "Lumo", "Drace", "Nirra", "Sollo", "Kett", "Obrin",
            "Tarsk", "Emmet", "Quoll")  # fmt: skip
QUESTIONS = ("What is the capital of {country}?", "Which city is the capital of {country}?",
             "Name the capital of {country}.")  # fmt: skip
"""The demos' world: invented countries and capitals (nothing a model can know beforehand)
and the questions their chats ask about them."""


def save_tiny_qwen2(model_dir: Path, corpus: list[str]) -> None:
    """The causal-LM demos' model: a tiny Qwen2 (the real `Qwen2Config`, width 128, 2 layers,
    about 0.5 M parameters) with a byte-level BPE tokenizer trained on `corpus`, Qwen 2.5's
    special tokens and its released chat template (as TRL ships it); made offline."""
    import importlib.resources

    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=512, special_tokens=list(QWEN_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    ))  # fmt: skip
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>",
                                        pad_token="<|endoftext|>")  # fmt: skip
    tokenizer.add_special_tokens({"additional_special_tokens": list(QWEN_SPECIAL_TOKENS)})
    template = importlib.resources.files("trl") / "chat_templates" / "qwen2_5.jinja"
    tokenizer.chat_template = template.read_text()
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )  # fmt: skip
    config.architectures = ["Qwen2ForCausalLM"]
    Qwen2ForCausalLM(config).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
