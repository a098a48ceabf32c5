"""Examples whose media cannot be decoded (a garbage, empty or missing clip or image):
skipped and counted, up to `--max_bad_examples`; past it, or when nothing decodes, one
line naming the first bad files.

Real corpora carry a few such files (Common Voice ships some clips no decoder reads), and
one among thousands should not stop a job; a set that is broken at scale (a wrong format,
a half-finished copy) should, before any training. The check is one pass over the
undecoded split before training (`screen`), whose result `datasets` caches per machine;
every process computes the same count for the whole split, and the progress lines and the
closing summary show it (`skipped_per_epoch`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainer.common.errors import UserError

if TYPE_CHECKING:
    from datasets import Dataset

DEFAULT_MAX_BAD_EXAMPLES = "1%"
"""A handful of broken clips in a real corpus is far below 1%; a broken copy is far above."""
NAMES_SHOWN = 3

_skipped: dict[str, int] = {}
"""Training split description -> examples skipped in it, in this process."""


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


def screen(
    dataset: Dataset,
    column: str,
    measure: Callable[[dict], Any],
    where: str,
    spec: str,
    num_proc: int | None,
    noun: str,
    training: bool,
) -> tuple[Dataset, list]:
    """The examples of `dataset` whose undecoded `column` value `measure` can read (it
    raises, or returns None, for one it cannot), and what it returned for each of them;
    the skipped ones of a `training` split are counted for the progress lines."""
    measured = list(
        dataset.map(
            partial_measure(measure),
            batched=True,
            input_columns=[column],
            remove_columns=dataset.column_names,
            num_proc=num_proc,
            desc=f"Checking that {noun} decode",
        )["measure"]
    )
    bad = [index for index, value in enumerate(measured) if value is None]
    if not bad:
        return dataset, measured
    names = ", ".join(_name(dataset[index][column], index) for index in bad[:NAMES_SHOWN])
    names += ", ..." if len(bad) > NAMES_SHOWN else ""
    total = len(dataset)
    if len(bad) == total:
        raise UserError(f"None of the {total} {noun} in {where} can be decoded ({names}).")
    limit = max_bad(spec, total)
    if len(bad) > limit:
        raise UserError(
            f"{len(bad)} of {total} {noun} in {where} cannot be decoded, more than "
            f"--max_bad_examples {spec} allows ({limit}); first: {names}"
        )
    if os.environ.get("LOCAL_RANK", "0") == "0":
        print(
            f"warning: skipped {len(bad)} of {total} {noun} in {where} that could not be "
            f"decoded (first: {names}); --max_bad_examples {spec} allows {limit}",
            flush=True,
        )
    if training:
        _skipped[where] = len(bad)
    good = [index for index, value in enumerate(measured) if value is not None]
    return dataset.select(good), [measured[index] for index in good]


def skipped_per_epoch() -> int:
    """Training examples this process skips each epoch as undecodable."""
    return sum(_skipped.values())


def partial_measure(measure: Callable[[dict], Any]) -> Callable[[list], dict]:
    def batch(values: list[dict]) -> dict[str, list]:
        return {"measure": [_measured(measure, value) for value in values]}

    return batch


def _measured(measure: Callable[[dict], Any], value: dict) -> Any:
    try:
        return measure(value)
    except Exception:  # noqa: BLE001 - decoders report broken files with many exception types
        return None


def _name(value: dict, index: int) -> str:
    return (value or {}).get("path") or f"example {index}"
