"""The speech task's Trainer subclass, apart from its training class (training.py): importing
`transformers.Trainer` takes seconds, and the launcher builds tasks (for their flags and checks)
without ever training."""

from __future__ import annotations

from functools import cached_property

from transformers import Seq2SeqTrainer

from trainer.tasks.speech_recognition.batches import AUDIO_BATCH_KEY, LogMelOnDevice
from trainer.tasks.speech_recognition.english_spelling import save_english_spelling


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
