"""A mixture of several datasets, as TRL, open-r1 and the alignment-handbook write it, read from
text-generation's `--dataset_mixture` (a YAML or JSON mapping: `{datasets: [...], ...}`, or the
handbook's older `dataset_mixer`, `{ID: fraction}`). Only what the mixture is:
trainer/data/mixing.py loads and mixes it.

Three published meanings, kept apart because they choose different rows:
- open-r1's and the handbook's `dataset_mixture` (open_r1/utils/data.py `get_dataset`): a
  `weight` keeps that share of the dataset's own rows, drawn with `seed` (default 0); the
  concatenation is shuffled with `seed`; `test_split_size` splits it with `seed`.
- TRL 1.16's `DatasetMixtureConfig` (trl/scripts/utils.py `get_dataset`): a `fraction` is
  the dataset's share of the mixture, all fractions normalised, the mixture as large as no
  dataset needs more rows than it has, each dataset's first rows kept; no shuffle (`seed:
  null`; its unseeded test split is drawn here with `--seed`, so every rank agrees).
- the handbook's `dataset_mixer` (alignment/data.py `mix_datasets`): a fraction keeps the
  dataset's first rows of its training split; the training parts concatenated and shuffled
  with seed 42; each dataset's evaluation split whole, concatenated and shuffled with 42.
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from trainer.common.errors import UserError

ENTRY_KEYS = {"id", "path", "config", "name", "split", "columns", "weight", "fraction"}
MIXTURE_KEYS = {"datasets", "seed", "test_split_size", "streaming"}
HANDBOOK_SEED = 42
"""alignment/data.py `mix_datasets`: `shuffle(seed=42)` of both concatenations."""
STREAMS = (
    "a mixture is read whole (a weight needs each dataset's length); mix streams with "
    "--streaming true --dataset_name A,B --interleave_probabilities P,Q"
)


@dataclass(frozen=True)
class MixedDataset:
    """One dataset of a mixture: a Hub id or a local folder, as `--dataset_name` names one."""

    path: str
    config: str | None = None
    split: str = "train"
    columns: tuple[str, ...] | None = None
    """The columns kept (all: None), so that datasets of other shapes concatenate."""
    weight: float | None = None
    """The share of its own rows kept (open-r1's `weight`, the handbook's fraction)."""
    fraction: float | None = None
    """Its share of the whole mixture (TRL's `fraction`)."""


@dataclass(frozen=True)
class Mixture:
    datasets: tuple[MixedDataset, ...]
    seed: int | None = 0
    """Draws the weighted rows and shuffles the concatenation; None: neither (TRL's order)."""
    test_split_size: float | None = None
    """A part of the mixture held out for evaluation (a fraction, or a count of rows)."""
    eval_split: str = ""
    """The handbook's: each dataset's split of this name, concatenated whole, evaluates."""
    handbook: bool = False
    """The handbook's `{ID: fraction}`: a weight keeps the first rows, not rows drawn with
    the seed, and the datasets' own evaluation splits evaluate."""


def mixture_of(data, options) -> Mixture | None:
    """The mixture a run's flags name (`--dataset_mixture`, a task option), None for one
    dataset; UserError for one that cannot be read with the other flags."""
    text = getattr(options, "dataset_mixture", None)
    if not text:
        return None
    try:
        return read_mixture(text, data.dataset_config_name, data.train_split_name,
                            data.eval_split_name)  # fmt: skip
    except ValueError as error:
        raise UserError(str(error)) from None


def read_mixture(
    text: str, configs: str | None = None, train_split: str = "train", eval_split: str = ""
) -> Mixture:
    """`--dataset_mixture`: open-r1's `{datasets: [{id, config, split, columns, weight}],
    seed, test_split_size}`, with TRL's names (`path`, `name`, `fraction`) read too; or the
    handbook's `{ID: fraction}` (`read_mixer`). ValueError (one line, naming the flag) for
    anything else."""
    value = _parsed(text, "--dataset_mixture")
    if not isinstance(value, dict) or not value:
        raise ValueError(f"--dataset_mixture {text!r}: give a mapping with a datasets list.")
    if "datasets" in value:
        return _listed(value)
    if all(isinstance(share, int | float) for share in value.values()):
        return read_mixer(value, configs, train_split, eval_split)
    raise ValueError(f"--dataset_mixture: {', '.join(map(str, value))}: give datasets: [{{id, "
                     "...}}, ...], or the handbook's {ID: fraction, ...}.")  # fmt: skip


def _listed(value: dict) -> Mixture:
    """The `{datasets: [...], seed, test_split_size}` form."""
    _only(value, MIXTURE_KEYS, "--dataset_mixture")
    if value.get("streaming"):
        raise ValueError(f"--dataset_mixture streaming: {STREAMS}.")
    entries = value.get("datasets")
    if not isinstance(entries, list) or not entries:
        raise ValueError("--dataset_mixture: datasets must list one or more datasets, each "
                         "a mapping with id (or path).")  # fmt: skip
    datasets = tuple(_entry(entry, index) for index, entry in enumerate(entries))
    _check_shares(datasets)
    seed = value.get("seed", 0)
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise ValueError(f"--dataset_mixture seed {seed!r}: give a whole number (or null).")
    return Mixture(datasets, seed, _test_size(value.get("test_split_size")))


def _check_shares(datasets: tuple[MixedDataset, ...]) -> None:
    weights = [entry.weight is not None for entry in datasets]
    fractions = [entry.fraction is not None for entry in datasets]
    if any(weights) and any(fractions):
        raise ValueError("--dataset_mixture: give weight (a share of each dataset's rows, "
                         "open-r1's) or fraction (a share of the mixture, TRL's), not "
                         "both.")  # fmt: skip
    if any(fractions) and not all(fractions):
        raise ValueError("--dataset_mixture: fraction must be set for every dataset or none "
                         "(TRL's rule).")  # fmt: skip
    if all(fractions) and not sum(entry.fraction or 0 for entry in datasets) > 0:
        raise ValueError("--dataset_mixture: the fractions add up to 0.")


def read_mixer(value: dict, configs: str | None, train_split: str, eval_split: str) -> Mixture:
    """The handbook's `dataset_mixer: {ID: fraction}`, read with its `dataset_splits` (here
    --train_split_name and --eval_split_name) and `dataset_configs` (here
    --dataset_config_name, one or one per dataset, separated by commas)."""
    names = configs.split(",") if configs else [None]
    if len(names) not in (1, len(value)):
        raise ValueError(f"--dataset_config_name gives {len(names)} configs for {len(value)} "
                         "datasets of the mixture: give one, or one per dataset.")  # fmt: skip
    names = names * len(value) if len(names) == 1 else names
    datasets = tuple(
        MixedDataset(str(path), config, train_split,
                     weight=_share(share, f"--dataset_mixture {path}", "fraction"))
        for (path, share), config in zip(value.items(), names, strict=True)
    )  # fmt: skip
    return Mixture(datasets, HANDBOOK_SEED, eval_split=eval_split, handbook=True)


def _parsed(text: str, flag: str) -> object:
    try:
        return yaml.safe_load(text)  # JSON is YAML
    except yaml.YAMLError as error:
        raise ValueError(f"{flag}: not YAML or JSON ({str(error).splitlines()[0]}).") from None


def _only(value: dict, keys: set[str], where: str) -> None:
    unknown = sorted(set(value) - keys)
    if unknown:
        raise ValueError(f"{where}: {', '.join(map(str, unknown))} is not read here (it reads "
                         f"{', '.join(sorted(keys))}).")  # fmt: skip


def _entry(entry: object, index: int) -> MixedDataset:
    where = f"--dataset_mixture datasets[{index}]"
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: give a mapping with id (or path).")
    if "data_dir" in entry or "data_files" in entry:
        raise ValueError(f"{where}: data_dir and data_files are not read here; put the files in "
                         "one folder, one file per split (train.jsonl, ...), and give the folder "
                         "as path.")  # fmt: skip
    _only(entry, ENTRY_KEYS, where)
    path = entry.get("id", entry.get("path"))
    if not isinstance(path, str) or not path:
        raise ValueError(f"{where}: give the dataset as id (a Hub id or a local folder).")
    columns = entry.get("columns")
    if columns is not None and (
        not isinstance(columns, list) or not all(isinstance(c, str) for c in columns)
    ):
        raise ValueError(f"{where} columns: give a list of column names.")
    config = entry.get("config", entry.get("name"))
    return MixedDataset(
        path,
        None if config is None else str(config),
        str(entry.get("split") or "train"),
        None if columns is None else tuple(columns),
        _share(entry.get("weight"), where, "weight"),
        _fraction(entry.get("fraction"), where),
    )


def _share(value: object, where: str, key: str) -> float | None:
    """A share of a dataset's own rows: a number from 0 to 1."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ValueError(f"{where} {key} {value!r}: give a share of the dataset's rows, from 0 "
                         "to 1 (1 keeps them all).")  # fmt: skip
    return float(value)


def _fraction(value: object, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"{where} fraction {value!r}: give the dataset's share of the mixture, "
                         "a number of 0 or more (the fractions are normalised).")  # fmt: skip
    return float(value)


def _test_size(value: object) -> float | None:
    """`datasets`' `test_size`: a fraction between 0 and 1, or a count of rows."""
    if value is None:
        return None
    fraction = isinstance(value, float) and 0 < value < 1
    count = isinstance(value, int) and not isinstance(value, bool) and value > 0
    if not (fraction or count):
        raise ValueError(f"--dataset_mixture test_split_size {value!r}: give a fraction "
                         "between 0 and 1, or a count of rows.")  # fmt: skip
    return value
