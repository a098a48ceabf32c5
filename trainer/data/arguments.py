"""The dataset flags every task reads: where the data is, which splits, how it streams."""

from __future__ import annotations

from dataclasses import dataclass, field

from trainer.common.errors import UserError
from trainer.data.bad_examples import DEFAULT_MAX_BAD_EXAMPLES, max_bad


@dataclass
class DataArguments:
    dataset_name: str | None = field(
        default=None,
        metadata={"help": "Hub dataset id, or a local directory (see the task's data formats)."},
    )
    dataset_config_name: str | None = field(
        default=None, metadata={"help": "Dataset configuration, e.g. a language code."}
    )
    train_split_name: str = field(
        default="train", metadata={"help": "Training split(s); join several with '+'."}
    )
    eval_split_name: str = field(
        default="test", metadata={"help": "Evaluation split(s); join several with '+'."}
    )
    train_val_split: float | None = field(
        default=None,
        metadata={
            "help": "Evaluate on this fraction of the training split, split off with --seed "
            "(the same examples on every process and every run): for datasets with only a "
            "train split, as run_image_classification.py does. Leave --eval_split_name out."
        },
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "Keep only this many training examples (debugging)."}
    )
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "Keep only this many evaluation examples."}
    )
    preprocessing_num_workers: int | None = field(
        default=None, metadata={"help": "Processes for dataset filtering passes."}
    )
    max_bad_examples: str = field(
        default=DEFAULT_MAX_BAD_EXAMPLES,
        metadata={
            "help": "Undecodable clips or images (garbage, empty, missing files) are skipped "
            "and counted, up to this many per split: a count (10), or a share of the split "
            "as a number with a percent sign (the default: one percent); past it, or when "
            "none decodes, the run stops before training, naming the first bad files. A "
            "streamed training split is checked as it is read, at every progress line: "
            "distinct files skipped by all processes, a share being of the shard index's "
            "example count, or without an index of the examples read so far (at least "
            "1000)."
        },
    )
    streaming: bool = field(
        default=False,
        metadata={
            "help": "Stream the training split instead of copying it to every node: from a "
            "shard set (python -m trainer.shards; local, gs:// or /gcs/), a hub dataset or a "
            "local directory. Needs --max_steps. Evaluation splits are still loaded whole."
        },
    )
    shuffle_buffer_size: int = field(
        default=500,
        metadata={
            "help": "Examples in the shuffle buffer of a stream (shard order is shuffled too)."
        },
    )
    interleave_probabilities: str | None = field(
        default=None,
        metadata={
            "help": "Mix several streamed datasets: --dataset_name A,B (and optionally "
            "--dataset_config_name X,Y) with one probability each, e.g. 0.7,0.3. Each "
            "example of each dataset is read once per epoch; evaluation uses the first."
        },
    )
    stream_audit_dir: str | None = field(
        default=None,
        metadata={
            "help": "Append the id (__key__) of every training example each process trains "
            "on, with its step, to DIR/rank-R.txt: an audit of what a stream delivered."
        },
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
