"""Reading a shard set (trainer/data/shard_index.py): its splits as a stream, or as a
map-style dataset for evaluation, read through the store a row group or a tar member at
a time, so nothing is copied to disk."""

from __future__ import annotations

from collections.abc import Iterator

from trainer.common.errors import UserError
from trainer.data.checks import split_names
from trainer.data.shard_index import ShardIndex
from trainer.data.tar_shards import TAR_SUFFIX, read_tar
from trainer.storage.store import open_store


def shard_split(location: str, index: ShardIndex, spec: str, streaming: bool):
    """The shards of `spec` (e.g. `train+validation`) of the shard set at `location`: an
    IterableDataset with one data source per shard, or, for evaluation, a map-style
    Dataset built from the same reader (cached by `datasets` like any other)."""
    from datasets import Dataset, IterableDataset

    files = []
    for name in split_names(spec):
        if name not in index.splits:
            available = ", ".join(sorted(index.splits))
            raise UserError(f'Split "{name}" not found in {location}: it has {available}.')
        files += [shard.file for shard in index.splits[name]]
    kwargs = {"location": location, "files": files, "features": index.features}
    features = index.datasets_features()
    if streaming:
        return IterableDataset.from_generator(read_shards, features=features, gen_kwargs=kwargs)
    return Dataset.from_generator(read_shards, features=features, gen_kwargs=kwargs)


def read_shards(location: str, files: list[str], features: dict) -> Iterator[dict]:
    """Rows of shards, read as streams through the store: Parquet a row group at a time,
    WebDataset tars (`.tar`) a member at a time, grouped into samples with the index's
    `features` (datasets passes each DataLoader worker and each process its own `files`)."""
    import pyarrow.parquet as pq

    store = open_store(location)
    for name in files:
        with store.open_read(name) as handle:
            if name.endswith(TAR_SUFFIX):
                yield from read_tar(handle, features, f"{location}/{name}")
                continue
            for batch in pq.ParquetFile(handle).iter_batches():
                yield from batch.to_pylist()
