"""A mixture of several datasets (trainer/settings/mixtures.py), made with `datasets`' own
`select`, `shuffle` and `concatenate_datasets` as TRL, open-r1 and the alignment-handbook make
it: every step is seeded or positional, so every rank builds the same rows."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from trainer.common.errors import UserError
from trainer.settings.mixtures import MixedDataset, Mixture

if TYPE_CHECKING:
    from datasets import Dataset


def mixed_splits(
    mixture: Mixture,
    load: Callable[[MixedDataset, str], Dataset],
    keep: Iterable[str],
    seed: int,
) -> tuple[Dataset, Dataset | None]:
    """(the training mixture, its evaluation split or None). `load(entry, split)`: one
    dataset's split; `keep`: the columns kept of a dataset whose entry names none, where
    the handbook's mixer keeps only those (its `columns_to_keep`); `seed`: `--seed`, for a
    test split a mixture without a seed draws (TRL's draws it unseeded)."""
    drawn = seed if mixture.seed is None else mixture.seed
    parts = [_columns(load(entry, entry.split), entry, mixture, keep) for entry in mixture.datasets]
    train = _concatenated(_weighted(parts, mixture, drawn), mixture)
    if mixture.test_split_size is not None:
        try:
            split = train.train_test_split(test_size=mixture.test_split_size, seed=drawn)
        except ValueError as error:
            raise UserError(f"--dataset_mixture test_split_size: {error}") from None
        return split["train"], split["test"]
    if not mixture.eval_split:
        return train, None
    evaluation = [_columns(load(entry, mixture.eval_split), entry, mixture, keep)
                  for entry in mixture.datasets]  # fmt: skip
    return train, _concatenated(evaluation, mixture)


def _columns(dataset: Dataset, entry: MixedDataset, mixture: Mixture, keep: Iterable[str]):
    if entry.columns is None and not mixture.handbook:
        return dataset
    wanted = list(entry.columns) if entry.columns is not None else list(keep)
    missing = [column for column in wanted if column not in dataset.column_names]
    if entry.columns is not None and missing:
        raise UserError(f"--dataset_mixture {entry.path}: no column {', '.join(missing)} (it "
                        f"has {', '.join(dataset.column_names)}).")  # fmt: skip
    return dataset.select_columns([column for column in wanted if column not in missing])


def _weighted(parts: list[Dataset], mixture: Mixture, seed: int) -> list[Dataset]:
    """Each dataset's rows the mixture keeps (see trainer/settings/mixtures.py); `seed` draws
    weighted rows."""
    entries = mixture.datasets
    if all(entry.fraction is not None for entry in entries):
        # trl/scripts/utils.py get_dataset: shares of the largest mixture no dataset oversamples
        total_share = sum(entry.fraction for entry in entries)
        shares = [entry.fraction / total_share for entry in entries]
        pairs = list(zip(parts, shares, strict=True))
        total = min(len(part) / share for part, share in pairs if share > 0)
        return [part.select(range(round(share * total))) for part, share in pairs]
    kept = []
    for part, entry in zip(parts, entries, strict=True):
        if entry.weight is not None:
            if not mixture.handbook:  # open-r1: rows drawn with the seed
                part = part.shuffle(seed=seed)
            part = part.select(range(int(len(part) * entry.weight)))
        kept.append(part)
    return kept


def _concatenated(parts: list[Dataset], mixture: Mixture) -> Dataset:
    from datasets import concatenate_datasets

    try:
        mixed = concatenate_datasets(parts)
    except ValueError as error:
        first = str(error).strip().splitlines()[0]
        raise UserError(f"The mixture's datasets do not concatenate ({first}): give each one "
                        "the same columns (columns: [messages], say).") from None  # fmt: skip
    return mixed if mixture.seed is None else mixed.shuffle(seed=mixture.seed)
