"""Trainer subclasses that tasks hand to the training program, apart from the task modules:
importing `transformers.Trainer` takes seconds, and the launcher imports the task modules (for
their flags) without ever training.
"""

from __future__ import annotations

from functools import cached_property, partial

import torch
from transformers import Seq2SeqTrainer, Trainer

from trainer.tasks.english_spelling import save_english_spelling
from trainer.tasks.speech_batches import AUDIO_BATCH_KEY, LogMelOnDevice


class ClassWeightedTrainer(Trainer):
    """Trainer whose loss is cross-entropy weighted per class (in `compute_loss`: the model and
    its config stay as they are, and DeepSpeed sees only the loss). A per-batch mean, so the
    Trainer divides it by the accumulation steps like a model's own loss."""

    loss_is_scaled_for_ga = False

    def __init__(self, *args, class_weights: torch.Tensor, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.class_weights = class_weights

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        inputs = dict(inputs)
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        logits = outputs.logits.float()
        loss = torch.nn.functional.cross_entropy(
            logits,
            labels.to(logits.device),
            weight=self.class_weights.to(logits.device),
            label_smoothing=self.args.label_smoothing_factor,
        )
        return (loss, outputs) if return_outputs else loss


class WhisperTrainer(Seq2SeqTrainer):
    """Seq2SeqTrainer for Whisper: a loss that does not grow with the process count, log-mel
    features computed on the training device, and the English spelling table saved with every
    checkpoint and the model.

    The Trainer takes a model whose `forward` has `**kwargs` for one that divides its loss by
    `num_items_in_batch` (all processes' label tokens), and multiplies the loss by the process
    count to undo DDP's averaging (`average_tokens_across_devices`, on by default). Whisper's
    `forward` has `**kwargs` but averages over this process's tokens: gradients and logged loss
    came out N times too large on N processes (Adam hardly notices a constant factor; gradient
    clipping, logged curves and comparisons across node counts do). Telling the Trainer it
    takes no loss arguments keeps DDP's mean of the processes' means.

    With `--log_mel_on device` the collator hands over padded waveforms, copied to this
    process's GPU and made features there, a batch at a time, before the batch is cast like any
    other (features in float32, then cast to bf16/fp16 for DeepSpeed). Nothing comes back to
    the host, so the GPU never waits for it. Batches already holding features pass unchanged."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.model_accepts_loss_kwargs = False

    @cached_property
    def _log_mel(self) -> LogMelOnDevice:
        return LogMelOnDevice(self.processing_class.feature_extractor, self.args.device)

    def _save(self, output_dir: str | None = None, state_dict=None) -> None:
        """Save as the Trainer does, plus the English spelling table the tokenizer's save omits
        (english_spelling.py), so every save can be evaluated and trained again."""
        super()._save(output_dir, state_dict)
        if self.args.should_save:  # every rank calls _save (ZeRO-3 gathers); one writes
            save_english_spelling(
                self.processing_class.tokenizer, output_dir or self.args.output_dir
            )

    def _prepare_inputs(self, inputs):
        if AUDIO_BATCH_KEY in inputs:
            inputs = dict(inputs)
            audio = inputs.pop(AUDIO_BATCH_KEY).to(self.args.device, non_blocking=True)
            inputs["input_features"] = self._log_mel(audio)
        return super()._prepare_inputs(inputs)


def mixed_in(mixin: type, trainer_class, **keywords):
    """`trainer_class` (a Trainer subclass, or a partial of one binding its arguments) with
    `mixin` before it in the method order, as a partial that also binds `keywords`."""
    base, bound = trainer_class, {}
    if isinstance(trainer_class, partial):
        base, bound = trainer_class.func, trainer_class.keywords
    mixed = type(f"{mixin.__name__.removesuffix('Mixin')}{base.__name__}", (mixin, base), {})
    return partial(mixed, **bound, **keywords)
