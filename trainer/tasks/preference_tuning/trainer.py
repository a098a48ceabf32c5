"""TRL's `DPOTrainer` as the preference tuning task trains with it, apart from the task module
(importing TRL takes seconds, and the launcher imports task modules for their flags only).

The training program builds every task's Trainer the same way (trainer/training/assemble.py:
its `TrainingArguments`, the keep-work mixin and callbacks); here those arguments become TRL's
`DPOConfig` (the same object's values, as text generation makes its `SFTConfig`) with the
task's flags: --beta, --loss_type (and --rpo_alpha's `sft` term), --label_smoothing,
--precompute_ref_log_probs, --max_seq_length. TRL tokenises the checked rows
(`_prepare_dataset`); the pairs longer than --max_seq_length, which its collator cuts, are counted
here in one line.

With `--peft lora` the model arrives with its adapter; TRL would add a frozen copy of that
adapter as the reference ("ref"); a fresh adapter's copy is the base itself, so the copy is
dropped and the reference is the base with the adapter disabled, as TRL does without it.
"""

from __future__ import annotations

import copy
import dataclasses
import os

from trl import DPOConfig, DPOTrainer

from trainer.common.errors import UserError
from trainer.tasks.preference_tuning.spec import PreferenceArguments


def dpo_config(args, preference: PreferenceArguments) -> DPOConfig:
    """`args` (the run's TrainingArguments, as built and checked) as TRL's config: the same
    object's values, copied, with DPOConfig's own fields at their defaults and the task's
    flags set (not `DPOConfig(**args.to_dict())`: that builds DeepSpeed's state again)."""
    config = copy.copy(args)
    config.__class__ = DPOConfig
    for field in dataclasses.fields(DPOConfig):
        if not hasattr(config, field.name):
            factory = field.default_factory
            default = field.default if factory is dataclasses.MISSING else factory()
            setattr(config, field.name, default)
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
                 args=None, **kwargs):  # fmt: skip
        """`where`: the dataset, for the lines about its pairs."""
        self.preference = preference
        self.where = where
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
