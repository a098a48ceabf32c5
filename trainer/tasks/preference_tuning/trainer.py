"""TRL's `DPOTrainer` as the preference tuning task trains with it, apart from the task module
(importing TRL takes seconds, and the launcher imports task modules for their flags only).

The training program builds every task's Trainer the same way (trainer/training/assemble.py:
its `TrainingArguments`, the keep-work mixin and callbacks); here those arguments become TRL's
`DPOConfig` (the same object's values, as text generation makes its `SFTConfig`) with the
task's flags: --beta, --loss_type (and --rpo_alpha's `sft` term), --label_smoothing,
--precompute_ref_log_probs, --max_seq_length. TRL tokenises the checked rows
(`_prepare_dataset`); the pairs longer than --max_seq_length, which its collator cuts, are counted
here in one line. With `--generation_samples N`, each evaluation generates greedily from N
evaluation prompts and prints prompt, chosen answer and output (one line each, cut).

With `--peft lora` the model arrives with its adapter; TRL would add a frozen copy of that
adapter as the reference ("ref"); a fresh adapter's copy is the base itself, so the copy is
dropped and the reference is the base with the adapter disabled, as TRL does without it.
"""

from __future__ import annotations

import json
import os

import torch
from trl import DPOConfig, DPOTrainer

from trainer.common.errors import UserError
from trainer.tasks.causal_lm import retyped_arguments
from trainer.tasks.preference_tuning.spec import PreferenceArguments


def dpo_config(args, preference: PreferenceArguments) -> DPOConfig:
    """`args` as TRL's config (`retyped_arguments`: not rebuilt), DPOConfig's own fields set
    from the task's flags."""
    config = retyped_arguments(args, DPOConfig)
    config.loss_type, config.loss_weights = preference.losses()
    config.beta = preference.beta
    config.label_smoothing = preference.label_smoothing
    config.precompute_ref_log_probs = preference.precompute_ref_log_probs
    config.max_length = preference.max_seq_length
    config.truncation_mode = "keep_start"
    config.pad_to_multiple_of = None  # DPOConfig's "auto" outside Neuron
    config.padding_free = False
    config.dataset_num_proc = None
    return config


class PreferenceTrainer(DPOTrainer):
    def __init__(self, *positional, preference: PreferenceArguments, where: str = "",
                 samples: list | None = None, args=None, **kwargs):  # fmt: skip
        """`where`: the dataset, for the lines about its pairs; `samples`: (prompt, chosen)
        of the evaluation pairs generated from at each evaluation (--generation_samples)."""
        self.preference = preference
        self.where = where
        self.samples = samples or []
        super().__init__(*positional, args=dpo_config(args, preference), **kwargs)
        model = self.accelerator.unwrap_model(self.model)
        if "ref" in (getattr(model, "peft_config", None) or {}):
            model.delete_adapter("ref")  # the base, adapter disabled, is the reference

    def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
        before = len(dataset)
        prepared = super()._prepare_dataset(dataset, processing_class, args, dataset_name)
        self.report_long(prepared, before, dataset_name)
        return prepared

    def report_long(self, prepared, before: int, name: str) -> None:
        """One line for the pairs TRL's collator cuts to --max_seq_length (prompt and the longer
        answer), and those it dropped because their prompt alone fills it."""
        limit = self.preference.max_seq_length
        prompts, chosen, rejected = (prepared[c] for c in ("prompt_ids", "chosen_ids",
                                                             "rejected_ids"))  # fmt: skip
        cut = sum(len(p) + max(len(c), len(r)) > limit
                  for p, c, r in zip(prompts, chosen, rejected, strict=True))  # fmt: skip
        dropped = before - len(prepared)
        if before and not len(prepared):
            raise UserError(f"every pair of the {name} split ({self.where}) has a prompt of "
                            f"--max_seq_length {limit} tokens or more: raise it.")  # fmt: skip
        if (cut or dropped) and os.environ.get("LOCAL_RANK", "0") == "0":
            gone = f" ({dropped} whose prompt fills it: dropped)" if dropped else ""
            print(f"warning: cut {cut + dropped} of {before} pairs of the {name} split "
                  f"({self.where}) to --max_seq_length {limit} tokens{gone}",
                  flush=True)  # fmt: skip

    def evaluate(self, *args, **kwargs):
        metrics = super().evaluate(*args, **kwargs)
        if self.samples:
            self.show_samples()
        return metrics

    @torch.no_grad()
    def show_samples(self) -> None:
        """Greedy answers to the sample prompts, on every rank alike (under ZeRO-3 each forward
        pass gathers weights from all ranks); the first process prints prompt, chosen answer
        and output, one line each, cut."""
        from transformers.integrations import is_deepspeed_zero3_enabled

        model = self.accelerator.unwrap_model(self.model)
        tokenizer = self.processing_class
        was_training = model.training
        model.eval()
        step = self.state.global_step
        for number, (prompt, chosen) in enumerate(self.samples):
            ids = prompt_ids(tokenizer, prompt).to(self.args.device)
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                 max_new_tokens=self.preference.max_new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id,
                                 synced_gpus=is_deepspeed_zero3_enabled())  # fmt: skip
            output = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
            if self.is_world_process_zero():
                print(f"sample {number} at step {step}: prompt: {_cut(prompt)}\n"
                      f"sample {number} at step {step}: chosen: {_cut(chosen)}\n"
                      f"sample {number} at step {step}: output: {_cut(output)}",
                      flush=True)  # fmt: skip
        if was_training:
            model.train()


def prompt_ids(tokenizer, prompt) -> torch.Tensor:
    """A text prompt's token ids, or a chat's through the template with the generation prompt."""
    if isinstance(prompt, str):
        return tokenizer(prompt, return_tensors="pt").input_ids
    return tokenizer.apply_chat_template(prompt, add_generation_prompt=True, return_tensors="pt",
                                         return_dict=True)["input_ids"]  # fmt: skip


SHOWN_CHARACTERS = 160


def _cut(value) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= SHOWN_CHARACTERS else text[: SHOWN_CHARACTERS - 3] + "..."
