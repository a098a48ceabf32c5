"""Preference tuning: DPO and its variants through TRL's `DPOTrainer` (trainer.py), with this
project's keep-work machinery around it as for every task (the training program mixes it into
the Trainer class the task names).

Rows are checked here (pairs.py) and bad ones skipped and counted under --max_bad_examples in
one line; TRL then extracts an implicit prompt, renders chats with the chat template and
tokenises the rows, its own way (`DPOTrainer._prepare_dataset`), and the trainer counts the
pairs longer than --max_seq_length (cut by TRL's collator) in one line.

The reference model: with `--peft lora` the base with the adapter disabled (no second copy);
in full fine-tuning a frozen second model that TRL loads and DeepSpeed shards like the policy
under ZeRO-3; with --precompute_ref_log_probs its log-probabilities computed once before
training. The plan counts it (`reference_parameters`, the `reference` of the FLOPs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from trainer.common.errors import UserError
from trainer.common.step_time import encoder_forward_flops
from trainer.data.bad_examples import NAMES_SHOWN, check_limit, skip_counted
from trainer.data.sources import FILES, first_examples, load_split, split_off_evaluation
from trainer.data.streams import is_stream
from trainer.tasks.base import Task
from trainer.tasks.causal_lm import CausalLanguageModel, decoder_layer_values
from trainer.tasks.preference_tuning.pairs import BadPair, check_pair, prompt_and_chosen
from trainer.tasks.preference_tuning.spec import (
    CHOSEN,
    PROMPT,
    REJECTED,
    SPEC,
    PreferenceArguments,
    is_preference_table,
)

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedModel

METRICS = ("rewards/accuracies", "rewards/margins", "rewards/chosen", "rewards/rejected",
           "logps/chosen", "logps/rejected")  # fmt: skip
"""What TRL's DPOTrainer logs at each evaluation (with `eval_`), as its docs name them."""


class PreferenceTask(CausalLanguageModel, Task):
    spec = SPEC
    default_metric = "rewards/accuracies"  # the share of pairs whose chosen answer wins
    metric_names = METRICS
    reference_free_flag = "--precompute_ref_log_probs true"
    options: PreferenceArguments

    _samples: list[tuple[Any, Any]] = []

    # -- before launch ------------------------------------------------------------------------

    def column_flags(self) -> dict[str, str]:
        return {}

    def check_inputs(self) -> list[str]:
        if self.data_args.streaming:
            raise UserError(STREAMING_LINE)
        return super().check_inputs()

    def column_warning(self, columns: list[str]) -> str | None:
        """Not a warning: a training split without both sides is refused before launch."""
        if columns and not is_preference_table(set(columns)):
            raise UserError(f"The training split has columns {', '.join(columns)}: "
                            f"{SPEC.name} needs {PAIRS_LINE}.")  # fmt: skip
        return None

    @classmethod
    def check_training_values(cls, training: Mapping[str, Any]) -> None:
        if training.get("do_predict"):
            raise UserError("--do_predict: a preference-tuned model is a text-generation model; "
                            "predict its test split with python -m trainer.predict MODEL "
                            "TEST.jsonl OUT.jsonl after training.")  # fmt: skip

    @classmethod
    def required_training_arguments(cls, training: Mapping[str, Any]) -> dict[str, Any]:
        # the loss and TRL's logged rewards are what an evaluation keeps
        return {"prediction_loss_only": True}

    # -- the model -----------------------------------------------------------------------------

    def build_model_and_processor(self) -> tuple[PreTrainedModel, Any]:
        return self.load_model(quantized=True), self.load_tokenizer()

    def load_tokenizer(self):
        tokenizer = self.templated_tokenizer()
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        return tokenizer

    def activation_values_per_sample(self, model: PreTrainedModel) -> tuple[int, int]:
        """A pair is two sequences of up to --max_seq_length (chosen and rejected, one batch): each
        decoder layer keeps about 17 s h values per sequence (text generation's count); TRL's
        fused LM head computes the log-probabilities in tiles, so no vocabulary-wide logits
        are kept (on a GPU; its torch fallback on a CPU makes several fp32 copies of a tile of
        up to 4,096 tokens x the vocabulary: bench/preference_memory.py); with checkpointing,
        each layer's input plus one layer recomputed."""
        config = model.config.get_text_config()
        s, h = 2 * self.options.max_seq_length, config.hidden_size
        layer = decoder_layer_values(config, s)
        return config.num_hidden_layers * layer, config.num_hidden_layers * s * h + layer

    def forward_flops_per_sample(self, model: PreTrainedModel):
        """Both sequences of a pair through the policy, and through the reference unless its
        log-probabilities were computed before training (the base under LoRA, a second model
        in full: the same FLOPs, without gradients)."""
        flops = encoder_forward_flops(model, 2 * self.options.max_seq_length)
        if self.options.precompute_ref_log_probs:
            return flops
        reference = flops.weights + flops.attention
        return dataclasses.replace(flops, reference=reference)

    def reference_parameters(self, model: PreTrainedModel) -> int:
        """A frozen copy of the model in full fine-tuning; none with LoRA (the adapter
        disabled) or with --precompute_ref_log_probs (freed before training)."""
        if self.model_args.peft == "lora" or self.options.precompute_ref_log_probs:
            return 0
        return sum(parameter.numel() for parameter in model.parameters())

    # -- the data ------------------------------------------------------------------------------

    def load_source(self, spec: str, streaming: bool = False):
        if streaming:
            raise UserError(STREAMING_LINE)
        dataset, _ = load_split(self.data_args, self.model_args.cache_dir, spec,
                                self.detect_local_layout, streaming)  # fmt: skip
        return dataset

    def load_datasets(self, processor) -> tuple[Dataset, Dataset | None]:
        data = self.data_args
        spec = data.train_split_name
        train = self.interleaved(lambda source: source.load_source(spec, data.streaming))
        evaluation, eval_spec = None, data.eval_split_name
        if data.train_val_split is not None:
            where = f"split {spec} of {data.dataset_name}"
            train, evaluation = split_off_evaluation(train, data.train_val_split, self.seed, where)
            eval_spec = f"{spec} (--train_val_split part)"
        elif eval_spec:
            evaluation = self.sources()[0].load_source(eval_spec)
        train = self.checked(first_examples(train, data.max_train_samples), spec, True)
        if evaluation is not None:
            evaluation = first_examples(evaluation, data.max_eval_samples)
            evaluation = self.checked(evaluation, eval_spec, False)
            shown = evaluation.select(range(min(self.options.generation_samples, len(evaluation))))
            self._samples = [prompt_and_chosen(row) for row in shown]
        return train, evaluation

    def checked(self, dataset: Dataset, spec: str, training: bool) -> Dataset:
        """The split's pairs, with only TRL's columns; bad rows skipped and counted."""
        where = f"split {spec} of {self.data_args.dataset_name or FILES}"
        if is_stream(dataset):
            raise UserError(f"{where} is a stream: {SPEC.name} reads its splits whole.")
        columns = set(dataset.column_names)
        if not is_preference_table(columns):
            raise UserError(f"{where} has columns {', '.join(sorted(columns))}: {SPEC.name} "
                            f"needs {PAIRS_LINE}.")  # fmt: skip
        kept = [name for name in (PROMPT, CHOSEN, REJECTED) if name in columns]
        dataset = dataset.select_columns(kept)
        verdicts = [verdict(row, PROMPT in columns) for row in dataset]
        return dataset.select(self.without_bad_rows(verdicts, where, training))

    def without_bad_rows(self, verdicts: list[str], where: str, training: bool) -> list[int]:
        bad = [(index, why) for index, why in enumerate(verdicts) if why]
        if not bad:
            return list(range(len(verdicts)))
        names = ", ".join(f"row {index} ({why})" for index, why in bad[:NAMES_SHOWN])
        names += ", ..." if len(bad) > NAMES_SHOWN else ""
        allowed = self.data_args.max_bad_examples
        limit = check_limit(len(bad), len(verdicts), f"rows of {where}", allowed, names,
                            "are no preference pairs", "is one")  # fmt: skip
        skipped = f"rows of {where} (first: {names})"
        return skip_counted(len(verdicts), [i for i, _ in bad], skipped, allowed, limit,
                            where if training else None)  # fmt: skip

    def load_test_split(self, processor) -> Dataset:
        raise UserError("--do_predict: predict with python -m trainer.predict (text-generation).")

    def references(self, dataset: Dataset) -> list:
        return []

    def predicted_values(self, predictions: Any, processor: Any) -> list[dict]:
        return []

    def data_collator(self, processor: Any):
        return None  # TRL's DataCollatorForPreference

    def compute_metrics(self, processor: Any) -> Callable | None:
        return None  # TRL logs the rewards and log-probabilities itself

    @property
    def trainer_class(self):
        from trainer.tasks.preference_tuning.trainer import PreferenceTrainer

        where = str(self.data_args.dataset_name or FILES)
        return partial(
            PreferenceTrainer, preference=self.options, where=where, samples=self._samples
        )


STREAMING_LINE = (
    f"--streaming true: {SPEC.name} reads its splits whole (TRL tokenises them before "
    "training, and precomputes the reference over them); leave it out."
)
PAIRS_LINE = ('"chosen" and "rejected" columns (with "prompt", or two chats or texts sharing '
              "their beginning)")  # fmt: skip


def verdict(row: dict, explicit: bool) -> str:
    """Why a row is no preference pair; empty for one."""
    try:
        check_pair(row, explicit)
    except BadPair as error:
        return str(error)
    return ""
