"""The dataset flags every task reads: where the data is, which splits, how it streams."""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainer.common.errors import UserError
from trainer.common.flag_fields import flag

DEFAULT_MAX_BAD_EXAMPLES = "1%"
"""A handful of broken clips in a real corpus is far below 1%; a broken copy is far above."""


@dataclass(frozen=True)
class DataArguments:
    dataset_name: str | None = flag(
        None, "Hub dataset id, or a local directory (see the task's data formats)."
    )
    dataset_config_name: str | None = flag(None, "Dataset configuration, e.g. a language code.")
    train_split_name: str = flag("train", "Training split(s); join several with '+'.")
    eval_split_name: str = flag("test", "Evaluation split(s); join several with '+'.")
    test_split_name: str = flag("test", "Split for --do_predict.")
    train_val_split: float | None = flag(
        None,
        "Evaluate on this fraction of the training split (drawn with --seed), in "
        "place of --eval_split_name.",
    )
    max_train_samples: int | None = flag(None, "Keep only this many training examples (debugging).")
    max_eval_samples: int | None = flag(None, "Keep only this many evaluation examples.")
    preprocessing_num_workers: int | None = flag(None, "Processes for dataset filtering passes.")
    max_bad_examples: str = flag(
        DEFAULT_MAX_BAD_EXAMPLES,
        "Skip and count bad examples (undecodable media, missing texts) up to this "
        "many per split (a count, or a percentage).",
    )
    streaming: bool = flag(
        False,
        "Stream the training split (trainer.shards' shards, a hub dataset, a local "
        "directory); needs --max_steps.",
    )
    shuffle_buffer_size: int = flag(
        500, "Examples in the shuffle buffer of a stream (shard order is shuffled too)."
    )
    interleave_probabilities: str | None = flag(
        None,
        "Mix the streams of --dataset_name A,B with one probability each, e.g. "
        "0.7,0.3 (evaluation uses the first).",
    )
    stream_audit_dir: str | None = flag(
        None, "Append each trained example's id and step to DIR/rank-R.txt."
    )

    def __post_init__(self) -> None:
        if self.train_val_split is not None and not 0 < self.train_val_split < 1:
            raise ValueError(
                f"--train_val_split {self.train_val_split}: give a fraction between 0 and 1, "
                "e.g. 0.15."
            )
        max_bad(self.max_bad_examples, 0)  # a ValueError names the flag

    def probabilities(self) -> list[float]:
        """`--interleave_probabilities` as numbers (UserError if they are not)."""
        try:
            values = [float(part) for part in (self.interleave_probabilities or "").split(",")]
        except ValueError:
            values = []
        if not values or any(not value > 0 for value in values):
            raise UserError(
                f'--interleave_probabilities "{self.interleave_probabilities}": give positive '
                "numbers separated by commas, e.g. 0.7,0.3."
            )
        total = sum(values)
        return [value / total for value in values]


def max_bad(spec: str, total: int) -> int:
    """`--max_bad_examples` (N, or P% of the split's examples) as a count for `total`."""
    text = spec.strip()
    try:
        if text.endswith("%"):
            share = float(text[:-1])
            if not 0 <= share <= 100:
                raise ValueError(text)
            return math.floor(total * share / 100)
        count = int(text)
        if count < 0:
            raise ValueError(text)
        return count
    except ValueError:
        raise ValueError(
            f'--max_bad_examples "{spec}": give a count (e.g. 10) or a percentage of the '
            "split (e.g. 1%)."
        ) from None
