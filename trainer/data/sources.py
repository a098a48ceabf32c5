"""Where a dataset comes from: the Hugging Face hub, or a local directory in a known layout.

`--dataset_name` names either. A value that looks like a path (absolute, relative with
./ or ../, gs://, or an existing directory) is a local dataset and must exist; anything
else is a hub id. A path holding an `index.json` is a shard set (trainer/data/shard_index.py:
Parquet or WebDataset tars), read through trainer/data/streams.py. Split specs such as
`train+validation` work for all.
"""

from __future__ import annotations

import ast
import codecs
import csv
import dataclasses
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from trainer.common.cache import cache_dir
from trainer.common.errors import UserError
from trainer.data.checks import check_columns, check_splits, evaluation_hint, split_names
from trainer.data.shard_index import KEY_COLUMN, ShardIndex, check_listing, read_index
from trainer.data.shard_reader import shard_split
from trainer.storage.store import open_store

if TYPE_CHECKING:
    from datasets import Dataset, IterableDataset


@dataclass(frozen=True)
class LocalLayout:
    """A recognised local dataset directory and how to hand it to `load_dataset`."""

    builder: str
    """The `datasets` builder: "audiofolder", "csv", ..."""
    splits: dict[str, list[Path]]
    """Split name -> files or folders that hold it."""
    columns: frozenset[str]
    """The columns an example will have (read from headers, not from the data)."""
    load_kwargs: dict = field(default_factory=dict)
    split_columns: dict[str, frozenset[str]] = field(default_factory=dict)
    """Split name -> its own columns, where splits may differ (one table per split: a test
    file without labels, which `load_dataset` reads as it is); empty: each has `columns`."""

    def columns_of(self, splits: Iterable[str]) -> frozenset[str]:
        """The columns every one of `splits` has."""
        own = [self.split_columns[name] for name in splits if name in self.split_columns]
        return frozenset.intersection(*own) if own else self.columns


FILES = "the data files (--train_file ...)"
"""How messages name a dataset given as files instead of --dataset_name."""


def looks_like_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~", "gs://")) or Path(name).is_dir()


def local_directory(name: str) -> Path:
    """The dataset directory named by `--dataset_name`: it must exist (gs:// is fetched)."""
    if name.startswith("gs://"):
        return fetch_directory(name)
    path = Path(name).expanduser()
    if not path.is_dir():
        raise UserError(f"Dataset directory {name} not found.")
    return path


def fetch_directory(uri: str) -> Path:
    """A gs:// dataset directory, copied (once per machine) into the local cache: decoders read
    local files, and every epoch reads every file again, so one verified copy per node beats
    streaming each read. A marker beside the copy records the listing it was made from; an
    unchanged listing means the copy is complete and current, and nothing is sent again."""
    store = open_store(uri)
    entries = sorted(store.list_files().values(), key=lambda entry: entry.path)
    if not entries:
        raise UserError(f"Dataset {uri} holds no files (or its bucket does not exist).")
    target = cache_dir() / "datasets" / uri.removeprefix("gs://").rstrip("/")
    marker = target.with_name(target.name + ".complete.json")
    listing = json.dumps([dataclasses.asdict(entry) for entry in entries])
    if not (marker.is_file() and marker.read_text() == listing):
        store.download(target, entries)
        marker.write_text(listing)
    return target


def check_shard_set(
    index: ShardIndex,
    location: str,
    train_spec: str,
    eval_spec: str,
    wanted: dict[str, str],
    hint: Callable[[str, list[str]], str] | None = None,
) -> None:
    """A shard set's splits and columns, from its index, and its shards' sizes (and
    Cloud Storage's checksums) from a listing: no shard is opened. `hint`: see
    `check_columns`."""
    check_splits(index.splits, train_spec, location)
    if eval_spec:
        check_splits(index.splits, eval_spec, location, evaluation_hint(index.splits))
    check_columns(index.columns, wanted, location, hint)
    names = split_names(train_spec) + split_names(eval_spec)
    check_listing(index, open_store(location), sorted(set(names)))


def select_source_columns(
    dataset: Dataset | IterableDataset,
    flags: dict[str, str],
    renames: dict[str, str],
    where: str,
    hint: Callable[[str, list[str]], str] | None = None,
) -> Dataset | IterableDataset:
    """The columns a task reads, under the names it reads them by (`renames`: source column ->
    task column), plus a shard set's example ids (`__key__`, for `--stream_audit_dir`). `flags`
    (flag name -> column) are checked first where the dataset knows its columns before it is
    read; a Hub stream may not, and then fails on its first example. `hint`: see
    `check_columns`."""
    columns = dataset.column_names
    if columns is not None:
        check_columns(columns, flags, where, hint)
    keys = [KEY_COLUMN] if KEY_COLUMN in (columns or []) else []
    dataset = dataset.select_columns([*renames, *keys])
    return dataset.rename_columns({old: new for old, new in renames.items() if old != new})


def first_examples(
    dataset: Dataset | IterableDataset, max_samples: int | None
) -> Dataset | IterableDataset:
    """`--max_train_samples` / `--max_eval_samples`: the first examples of a split or stream."""
    from datasets import IterableDataset

    if max_samples is None:
        return dataset
    if isinstance(dataset, IterableDataset):
        return dataset.take(max_samples)
    return dataset.select(range(min(max_samples, len(dataset))))


def split_off_evaluation(
    train: Dataset, fraction: float, seed: int, where: str
) -> tuple[Dataset, Dataset]:
    """`--train_val_split`: (the rest of `train`, `fraction` of it for evaluation), drawn
    with `seed`, so every process and every restart gets the same two parts."""
    from datasets import IterableDataset

    if isinstance(train, IterableDataset):
        raise UserError("--train_val_split needs the whole training split; a stream has no "
                        "length: leave --streaming out, or give --eval_split_name.")  # fmt: skip
    try:
        parts = train.train_test_split(test_size=fraction, seed=seed)
    except ValueError as error:
        raise UserError(f"--train_val_split {fraction} of {where}: {error}") from None
    return parts["train"], parts["test"]


def table_header(path: Path) -> list[str]:
    """Column names of a CSV, TSV or JSON Lines file, read from its first line once the
    whole file is known to be UTF-8 (`check_utf8`); a Parquet file's from its schema; a
    `.json` array's from its first object."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_schema(path).names
    check_utf8(path)
    with path.open(newline="", encoding="utf-8") as handle:
        first_line = handle.readline()
    if path.suffix == ".json" and first_line.lstrip().startswith("["):
        rows = json.loads(path.read_text(encoding="utf-8"))
        return list(rows[0]) if rows else []
    if path.suffix in (".jsonl", ".json"):
        return list(json.loads(first_line)) if first_line.strip() else []
    delimiter = "\t" if path.suffix == ".tsv" else ","
    return next(csv.reader([first_line], delimiter=delimiter), [])


TABLE_FORMATS = {
    ".csv": ("csv", {}),
    ".tsv": ("csv", {"delimiter": "\t"}),
    ".jsonl": ("json", {}),
    ".json": ("json", {}),
    ".parquet": ("parquet", {}),
}
"""Local file suffix -> `datasets` builder and its arguments: the tables a folder of them (text
classification's, text generation's) or `--train_file` may hold."""


def table_folder_layout(directory: Path, example: str) -> LocalLayout:
    """A folder of one table file per split, all in one format (`table_layout`); UserError
    naming the formats, with `example` files, when it holds none."""
    files = sorted(p for p in directory.iterdir() if p.is_file() and p.suffix in TABLE_FORMATS)
    if not files:
        raise UserError(f"{directory} holds no data files: put one {', '.join(TABLE_FORMATS)} "
                        f"file per split in it ({example}, ...).")  # fmt: skip
    return table_layout({path.stem: path for path in files}, str(directory))


def table_layout(files: dict[str, Path], where: str) -> LocalLayout:
    """Split name -> table file, all in one format; the columns all of them have."""
    suffixes = sorted({path.suffix for path in files.values()})
    if len(suffixes) > 1:
        raise UserError(f"{where}: {' and '.join(suffixes)} files mixed; use one format.")
    builder, load_kwargs = TABLE_FORMATS[suffixes[0]]
    headers = {split: frozenset(table_header(path)) for split, path in files.items()}
    return LocalLayout(
        builder=builder,
        splits={split: [path] for split, path in files.items()},
        columns=frozenset.intersection(*headers.values()),
        load_kwargs=load_kwargs,
        split_columns=headers,
    )


def table_column(path: Path, column: str) -> list | None:
    """The values of one column of a table file, as `datasets` reads them (an empty CSV cell
    is None); None when they cannot be read here, which leaves the judgement to the
    training processes' reader. Only that column is parsed (a Parquet file's is read alone)."""
    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            return pq.read_table(path, columns=[column]).column(0).to_pylist()
        if path.suffix in (".csv", ".tsv"):
            from pyarrow import csv as arrow_csv

            table = arrow_csv.read_csv(
                path,
                parse_options=arrow_csv.ParseOptions(
                    delimiter="\t" if path.suffix == ".tsv" else ",", newlines_in_values=True
                ),
                convert_options=arrow_csv.ConvertOptions(
                    include_columns=[column], strings_can_be_null=True
                ),
            )
            return table.column(0).to_pylist()
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".json" and text.lstrip().startswith("["):
            rows = json.loads(text)
        else:
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        return [row.get(column) for row in rows]
    except Exception:  # noqa: BLE001 - any failure: not known here
        return None


FOLDER_METADATA = ("metadata.csv", "metadata.jsonl")
"""The tables `datasets`' audiofolder and imagefolder builders join to the media by
`file_name`, found at any depth of a split's folder."""


def check_metadata_files(layout: LocalLayout) -> None:
    """Every metadata table of a folder layout, in every split (`load_dataset` prepares all
    the splits declared, not only those asked for), is UTF-8 (`check_utf8`): one bad byte
    otherwise fails every training process after launch, naming no file."""
    if layout.builder not in ("audiofolder", "imagefolder"):
        return
    for folder in (path for paths in layout.splits.values() for path in paths):
        for path in sorted(p for name in FOLDER_METADATA for p in folder.rglob(name)):
            check_utf8(path)


UTF8_CHUNK = 4 << 20


def check_utf8(path: Path) -> None:
    """A table file must be UTF-8, as `datasets`' CSV and JSON readers read it: one stray byte (a
    Latin-1 "é" from a spreadsheet) otherwise fails every training process inside the reader,
    with a traceback naming neither file nor place. One pass at launch (about 1 GB/s)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with path.open("rb") as handle:
        for chunk in [*iter(lambda: handle.read(UTF8_CHUNK), b""), b""]:
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as error:
                # the decoder's input is the bytes it held back from the last chunk + chunk
                at = offset - (len(error.object) - len(chunk)) + error.start
                bad = error.object[error.start : error.start + 1].hex()
                raise UserError(
                    f"{path} is not UTF-8: byte 0x{bad} at offset {at} ({error.reason}); "
                    "save it as UTF-8 (e.g. iconv -f latin1 -t utf-8)."
                ) from None
            offset += len(chunk)


def shard_index_of(name: str | None) -> ShardIndex | None:
    """The index of the shard set `--dataset_name` names (local, gs:// or /gcs/), or None
    when it names something else (a hub id, a plain dataset directory)."""
    if name is None or not looks_like_path(name):
        return None
    return read_index(open_store(name))


def load_split(
    data_args,
    cache_dir: str | None,
    spec: str,
    detect_layout: Callable[[Path], LocalLayout],
    streaming: bool = False,
    files: LocalLayout | None = None,
) -> tuple[Dataset | IterableDataset, Path | None]:
    """One split spec (e.g. `train+validation`) from a shard set, the hub or a local directory
    (`files`: a layout of named files, `--train_file` ..., read instead of `--dataset_name`);
    with `streaming`, as an IterableDataset that copies nothing whole. Returns the dataset and,
    for a local directory, the directory. Every local split's files are declared, not only the
    requested ones, so labels inferred from folder names agree across splits. Streams of
    several splits are concatenated, as `split="a+b"` concatenates map-style splits."""
    if files is not None:
        check_splits(files.splits, spec, FILES)
        return load_layout(FILES, files, spec, streaming), None
    name = data_args.dataset_name
    index = shard_index_of(name)
    if index is not None:
        split = shard_split(name, index, spec, streaming)
        return (undecoded(split) if streaming else split), None
    if not looks_like_path(name):
        return load_hub_split(data_args, cache_dir, spec, streaming), None
    if streaming and name.startswith("gs://"):
        raise UserError(
            f"--streaming reads gs:// data from shard sets, and {name} holds no index.json: "
            f"make one with python -m trainer.shards SRC {name.rstrip('/')}-shards --task ..., "
            f"or index the WebDataset tars it holds with python -m trainer.shards {name} "
            "--index_only --task ..."
        )
    directory = local_directory(name)
    layout = detect_layout(directory)
    check_splits(layout.splits, spec, directory)
    return load_layout(name, layout, spec, streaming), directory


def load_hub_split(
    data_args, cache_dir: str | None, spec: str, streaming: bool
) -> Dataset | IterableDataset:
    """`load_split` of a hub dataset (see there). Its splits are known only here: a missing
    evaluation split is named with the one it has, as the launcher names a local dataset's."""
    from datasets import concatenate_datasets, load_dataset

    name, config = data_args.dataset_name, data_args.dataset_config_name
    hint = evaluation_hint if spec == data_args.eval_split_name else None
    if streaming or data_args.streaming:
        parts = [
            undecoded(load_or_explain(name, lambda split=split: load_dataset(
                name, config, split=split, cache_dir=cache_dir, streaming=True), hint))
            for split in split_names(spec)
        ]  # fmt: skip
        stream = concatenate_datasets(parts)
        if streaming:
            return stream
        return split_from_stream(stream, name, config, spec, cache_dir)
    return load_or_explain(
        name, lambda: load_dataset(name, config, split=spec, cache_dir=cache_dir), hint
    )


def undecoded(stream: IterableDataset) -> IterableDataset:
    """A stream with its media left undecoded, for the task to decode where a bad file is
    skipped and counted (trainer/data/bad_examples.py `mark_undecodable`): otherwise the
    first `map` over it (renaming a column) decodes them and raises inside the stream on a
    bad file, and so do the threads that decode a Hub folder's media."""
    return stream if stream.features is None else stream.decode(False)


def load_layout(
    name: str, layout: LocalLayout, spec: str, streaming: bool
) -> Dataset | IterableDataset:
    """A split spec of a local layout, every split's files declared (see `load_split`)."""
    from datasets import concatenate_datasets, load_dataset

    data_files = {
        split: [str(path / "**") if path.is_dir() else str(path) for path in paths]
        for split, paths in layout.splits.items()
    }
    if streaming:
        parts = [
            load_or_explain(name, lambda split=split: load_dataset(
                layout.builder, data_files=data_files, split=split, streaming=True,
                **layout.load_kwargs))
            for split in split_names(spec)
        ]  # fmt: skip
        return undecoded(concatenate_datasets(parts))
    return load_or_explain(
        name,
        lambda: load_dataset(layout.builder, data_files=data_files, split=spec,
                             **layout.load_kwargs),
    )  # fmt: skip


def split_from_stream(
    stream: IterableDataset, name: str, config: str | None, spec: str, cache_dir: str | None
) -> Dataset:
    """A map-style split of a hub dataset (an evaluation split of a streaming run), written from
    its stream to the `datasets` cache: a map-style `load_dataset` of a hub dataset prepares
    every split, copying the streamed training split to every node's disk. Media are stored
    undecoded, as they came. The copy is named after the dataset's commit, so every process of
    a node, and every later run, reuses it until the dataset changes."""
    from datasets import Dataset
    from datasets.fingerprint import Hasher
    from huggingface_hub import HfApi

    revision = HfApi().dataset_info(name).sha
    return Dataset.from_generator(
        _examples_of,
        features=stream.features,
        gen_kwargs={"stream": stream.decode(False)},
        cache_dir=cache_dir,
        fingerprint=Hasher.hash([name, config, spec, revision]),
    )


def _examples_of(stream: IterableDataset) -> Iterable[dict]:
    yield from stream


UNKNOWN_SPLIT = re.compile(
    r'Unknown split "(?P<split>[^"]*)"\. Should be one of (?P<splits>\[.*\])'
    r"|Bad split: (?P<streamed>\S+)\. Available splits: (?P<available>\[.*\])"
)
"""`datasets`' ValueError for a split the dataset does not have, with the ones it has (a
prepared dataset's wording; a stream's)."""


def load_or_explain(
    name: str, load: Callable[[], Dataset], hint: Callable[[list[str]], str] | None = None
) -> Dataset:
    """Run a `load_dataset` call; a dataset that is missing or unreadable becomes one line,
    and a split it lacks the line a local dataset's gets (`check_splits`), ended by
    `hint(splits it has)`."""
    from datasets.exceptions import DatasetNotFoundError

    try:
        return load()
    except (DatasetNotFoundError, FileNotFoundError, ConnectionError, ValueError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        missing, splits = unknown_split(first_line)
        if missing and splits:
            check_splits(splits, missing, name, hint(splits) if hint else "")
        raise UserError(f"Could not load dataset {name}: {first_line}") from None


def unknown_split(message: str) -> tuple[str | None, list[str] | None]:
    """The split `datasets`' unknown-split message names, and the splits it lists; (None,
    None) for another message."""
    unknown = UNKNOWN_SPLIT.match(message)
    if unknown is None:
        return None, None
    try:
        splits = ast.literal_eval(unknown["splits"] or unknown["available"])
    except (ValueError, SyntaxError):  # a listing this reader does not know
        return None, None
    return unknown["split"] or unknown["streamed"], [str(split) for split in splits]
