"""`TrainingArguments` from the resolved flags: what every training process builds, here in
the config layer so that the launcher can build the same object to check it before launch."""

from __future__ import annotations

from trainer.common.errors import UserError
from trainer.config.flags import ParsedFlags


def build_training_arguments(flags: ParsedFlags, gradient_checkpointing: bool | None = None):
    """TrainingArguments from the resolved flags; `gradient_checkpointing`, when decided
    here (`decide_gradient_checkpointing`), instead of the flag's value."""
    values = vars(flags.training)
    if gradient_checkpointing is not None:
        values = {**values, "gradient_checkpointing": gradient_checkpointing}
    try:
        return flags.task.training_arguments_class(**values)
    except ValueError as error:
        raise UserError(" ".join(str(error).split())) from None
