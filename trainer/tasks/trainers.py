"""The classification tasks' Trainer subclass, apart from their training code (importing
`transformers.Trainer` takes seconds, and the launcher builds tasks without ever training), and
`mixed_in`, how the training program puts its own mixins before a task's Trainer class."""

from __future__ import annotations

from functools import partial

import torch
from transformers import Trainer


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


def mixed_in(mixin: type, trainer_class, **keywords):
    """`trainer_class` (a Trainer subclass, or a partial of one binding its arguments) with
    `mixin` before it in the method order, as a partial that also binds `keywords`."""
    base, bound = trainer_class, {}
    if isinstance(trainer_class, partial):
        base, bound = trainer_class.func, trainer_class.keywords
    mixed = type(f"{mixin.__name__.removesuffix('Mixin')}{base.__name__}", (mixin, base), {})
    return partial(mixed, **bound, **keywords)
