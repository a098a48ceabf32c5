"""Checks of what a dataset holds, shared by the local, Hub and shard-set readers: split
specs such as `train+validation`, and the columns the task's flags name."""

from __future__ import annotations

from collections.abc import Iterable

from trainer.common.errors import UserError


def split_names(spec: str) -> list[str]:
    return [part.strip() for part in spec.split("+") if part.strip()]


def check_splits(splits: Iterable[str], spec: str, where: object, hint: str = "") -> None:
    """Every split of `spec` is among `splits`; `hint` ends the error line."""
    for name in split_names(spec):
        if name not in splits:
            available = ", ".join(sorted(splits))
            raise UserError(f'Split "{name}" not found in {where}: it has {available}.{hint}')


def check_columns(
    available: Iterable[str], wanted: dict[str, str | tuple[str, ...]], where: str
) -> None:
    """`wanted` maps flag name -> column name (or names: a sentence pair); each must be
    among `available`."""
    available = sorted(available)
    for flag, columns in wanted.items():
        for column in (columns,) if isinstance(columns, str) else columns:
            if column in available:
                continue
            raise UserError(
                f'Column "{column}" (--{flag}) not found in {where}; '
                f"its columns are: {', '.join(available)}."
            )
