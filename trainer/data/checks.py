"""Checks of what a dataset holds, shared by the local, Hub and shard-set readers: split
specs such as `train+validation`, and the columns the task's flags name."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from trainer.common.errors import UserError

EVALUATION_SPLITS = ("validation", "valid", "val", "dev", "eval", "validation_matched", "test")
"""Split names datasets give their held-out examples, the most usual first."""


def split_names(spec: str) -> list[str]:
    return [part.strip() for part in spec.split("+") if part.strip()]


def check_splits(splits: Iterable[str], spec: str, where: object, hint: str = "") -> None:
    """Every split of `spec` is among `splits`; `hint` ends the error line."""
    for name in split_names(spec):
        if name not in splits:
            available = ", ".join(sorted(splits))
            raise UserError(f'Split "{name}" not found in {where}: it has {available}.{hint}')


def evaluation_hint(splits: Iterable[str]) -> str:
    """How to evaluate when the evaluation split asked for is missing: on the dataset's own
    held-out split if it has one by a usual name (a dataset with `validation` but no
    `test` is common, and `--eval_split_name` defaults to test), else on a part of the
    training split, or not at all."""
    held_out = next((name for name in EVALUATION_SPLITS if name in set(splits)), None)
    others = (
        "--train_val_split 0.15 takes one from the training split; "
        "--eval_strategy no trains without"
    )
    if held_out is None:
        return f" (no evaluation split? {others})"
    return f" (--eval_split_name {held_out} evaluates on its {held_out} split; {others})"


def check_columns(
    available: Iterable[str],
    wanted: dict[str, str | tuple[str, ...]],
    where: str,
    hint: Callable[[str, list[str]], str] | None = None,
) -> None:
    """`wanted` maps flag name -> column name (or names: a sentence pair); each must be
    among `available`. `hint(flag, available)` ends the error line (how to name them)."""
    available = sorted(available)
    for flag, columns in wanted.items():
        for column in (columns,) if isinstance(columns, str) else columns:
            if column in available:
                continue
            raise UserError(
                f'Column "{column}" (--{flag}) not found in {where}; '
                f"its columns are: {', '.join(available)}.{hint(flag, available) if hint else ''}"
            )
