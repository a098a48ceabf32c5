"""Reading a shard set (trainer/data/shard_index.py): its splits as a stream, or as a
map-style dataset for evaluation, read through the store a row group or a tar member at
a time, so nothing is copied to disk."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict

from trainer.common.errors import UserError
from trainer.data.checks import check_splits, split_names
from trainer.data.damaged_data import DataFault
from trainer.data.shard_index import Shard, ShardIndex
from trainer.data.shard_verify import VerifiedReader, check_shard
from trainer.data.tar_shards import TAR_SUFFIX, read_tar
from trainer.storage.store import open_store


def shard_split(location: str, index: ShardIndex, spec: str, streaming: bool):
    """The shards of `spec` (e.g. `train+validation`) at `location`: an IterableDataset with one
    data source per shard, or, for evaluation, a map-style Dataset from the same reader."""
    from datasets import Dataset, IterableDataset
    from datasets.exceptions import DatasetGenerationError

    check_splits(index.splits, spec, location)
    shards = [asdict(shard) for name in split_names(spec) for shard in index.splits[name]]
    kwargs = {"location": location, "shards": shards, "features": index.features}
    features = index.datasets_features()
    if streaming:
        return IterableDataset.from_generator(read_shards, features=features, gen_kwargs=kwargs)
    try:
        return Dataset.from_generator(read_shards, features=features, gen_kwargs=kwargs)
    except DatasetGenerationError as error:
        if isinstance(error.__cause__, DataFault):  # the builder's wrapper hides the line
            raise error.__cause__ from None
        raise


def read_shards(location: str, shards: list[dict], features: dict) -> Iterator[dict]:
    """Rows of shards (datasets gives each loader worker and process its own), streamed through
    the store: Parquet a row group, tars a member at a time, grouped into samples by
    `features`, each checked against its index entry as read (trainer/data/shard_verify.py)."""
    store = open_store(location)
    for entry in shards:
        shard = Shard(**entry)
        where = f"{location}/{shard.file}"
        try:
            handle = store.open_read(shard.file)
        except Exception as error:  # noqa: BLE001 - missing or unreadable: one line either way
            raise DataFault(
                f"shard {where} cannot be opened ({type(error).__name__}: {error})"
            ) from error
        with handle:
            reader = VerifiedReader(handle)
            rows = 0
            try:
                for example in _examples(reader, shard.file, features, where):
                    rows += 1
                    yield example
            except DataFault:
                raise
            except Exception as error:  # noqa: BLE001 - a damaged shard fails in many ways
                check_shard(reader, shard, None, where)  # says how it differs, if it does
                if isinstance(error, UserError):  # what a sample holds; it names the shard
                    raise DataFault(str(error)) from error
                raise DataFault(
                    f"shard {where} cannot be read ({type(error).__name__}: {error})"
                ) from error
            check_shard(reader, shard, rows, where)


def _examples(reader: VerifiedReader, file: str, features: dict, where: str) -> Iterator[dict]:
    import pyarrow.parquet as pq

    if file.endswith(TAR_SUFFIX):
        yield from read_tar(reader, features, where)
        return
    for batch in pq.ParquetFile(reader).iter_batches():
        yield from batch.to_pylist()
