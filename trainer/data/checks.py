"""Checks of what a dataset holds, shared by the local, Hub and shard-set readers: split
specs such as `train+validation`, and the columns the task's flags name."""

from __future__ import annotations

from collections.abc import Iterable

from trainer.common.errors import UserError


def split_names(spec: str) -> list[str]:
    return [part.strip() for part in spec.split("+") if part.strip()]


def check_columns(available: Iterable[str], wanted: dict[str, str], where: str) -> None:
    """`wanted` maps flag name -> column name; each must be among `available`."""
    available = sorted(available)
    for flag, column in wanted.items():
        if column not in available:
            raise UserError(
                f'Column "{column}" (--{flag}) not found in {where}; '
                f"its columns are: {', '.join(available)}."
            )
