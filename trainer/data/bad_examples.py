"""Examples whose media cannot be decoded (a garbage, empty or missing clip or image): skipped and
counted, up to `--max_bad_examples`; past it, or when nothing decodes, one line naming the
first bad files.

Real corpora carry a few such files (Common Voice ships some clips no decoder reads), and one
among thousands should not stop a job; a set broken at scale (a wrong format, a half-finished
copy) should, before any training. A map-style split is checked in one pass over it, undecoded,
before training (`screen`, cached by `datasets` per machine); every process computes the same
count for the whole split, shown on the progress lines and the summary (`skipped_per_epoch`).

A stream cannot be checked before it is read. Its media are decoded as read, in the loader's
workers (`mark_undecodable`); an example that does not decode is kept, empty and named, until
trainer/data/streams.py drops it and carries its name to the training process in the next batch
(a worker is another process: nothing else reaches the Trainer). There `StreamSkips` counts the
names, and all processes agree on the count at each progress line, where the limit applies.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from trainer.common.errors import UserError
from trainer.common.log_lines import MAX_LINE
from trainer.data.shard_index import KEY_COLUMN
from trainer.settings.data_flags import max_bad

if TYPE_CHECKING:
    from datasets import Dataset, IterableDataset

NAMES_SHOWN = 3
UNDECODABLE = "__undecodable__"
"""Stream column: the name of an example whose media did not decode (None for the others)."""
MIN_STREAM_BASIS = 1000
"""A percentage limit on a stream without a shard index counts the examples read so far as
at least this many: a stream's length is unknown until it ends, and 1% of its first few
examples would allow none."""

_skipped: dict[str, int] = {}
"""Training split description -> examples skipped in it, in this process."""


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
    names = first_names(dataset, column, bad)
    limit = check_limit(len(bad), len(dataset), f"{noun} in {where}", spec, names)
    head = f"{noun} in {where} that could not be decoded (first: "
    room = MAX_LINE - len(skip_line(bad, len(dataset), f"{head})", spec, limit))
    skipped = f"{head}{first_names(dataset, column, bad, room)})"
    good = skip_counted(len(dataset), bad, skipped, spec, limit, where if training else None)
    return dataset.select(good), [measured[index] for index in good]


def skip_counted(
    total: int, bad: list[int], skipped: str, spec: str, limit: int, training: str | None
) -> list[int]:
    """The indices of the `total` examples to keep without the `bad` ones (fewer than
    `limit`, checked): one warning line naming what was `skipped`, and their count kept for
    the progress lines when they belong to the `training` split (its description)."""
    if os.environ.get("LOCAL_RANK", "0") == "0":
        print(f"warning: {skip_line(bad, total, skipped, spec, limit)}", flush=True)
    if training is not None:
        _skipped[training] = len(bad)
    return sorted(set(range(total)) - set(bad))


def skip_line(bad: list[int], total: int, skipped: str, spec: str, limit: int) -> str:
    return f"skipped {len(bad)} of {total} {skipped}; --max_bad_examples {spec} allows {limit}"


def first_names(dataset: Dataset, column: str, bad: list[int], room: int | None = None) -> str:
    """The first bad examples' file names (or row numbers), for the line about them."""
    names = [_name(dataset[index][column], index) for index in bad[:NAMES_SHOWN]]
    return shown(names, len(bad) > NAMES_SHOWN, room)


LONG_FOLDER = 30
"""A common folder at least this long is named once, after the names."""


def shown(names: list[str], more: bool, room: int | None = None) -> str:
    """`names` for a line, their common folder named once: `a.wav, b.wav, ... in /data/clips/`
    (files of a dataset share long folders: three full paths made a line of 377 characters);
    the folder's start is cut (`…/clips/`) where the names would not fit `room` otherwise."""
    prefix = os.path.commonprefix(names) if len(names) > 1 else ""
    folder = prefix[: prefix.rfind("/") + 1]
    if len(folder) < LONG_FOLDER:  # a shard's `train/`: the names as they are
        folder = ""
    listed = ", ".join(name[len(folder) :] for name in names) + (", ..." if more else "")
    if not folder:
        return listed
    over = len(f"{listed} in {folder}") - room if room is not None else 0
    if over > 0:  # its last two folders kept at least
        least = len(folder) - folder.rstrip("/").rsplit("/", 2)[0].__len__()
        folder = "…" + folder[-max(len(folder) - over - 1, least) :]
    return f"{listed} in {folder}"


def check_limit(
    bad: int,
    total: int,
    what: str,
    spec: str,
    names: str,
    fault: str = "cannot be decoded",
    sound: str = "can be decoded",
) -> int:
    """The limit --max_bad_examples sets for `total` examples; UserError past it, or when
    every one is bad (the bad ones `fault`, the good ones `sound`: undecodable media by
    default, texts missing for the text task)."""
    if bad == total:
        raise UserError(f"None of the {total} {what} {sound} ({names}).")
    limit = max_bad(spec, total)
    if bad > limit:
        raise UserError(
            f"{bad} of {total} {what} {fault}, more than --max_bad_examples "
            f"{spec} allows ({limit}); first: {names}"
        )
    return limit


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


def _name(value: dict, index: int | str) -> str:
    return (value or {}).get("path") or f"example {index}"


def mark_undecodable(
    stream: IterableDataset, column: str, measure: Callable[[Any], Any]
) -> IterableDataset:
    """`stream` with `column` decoded as its feature says (as `datasets` would, but without
    raising inside the stream on a bad file). An example whose value does not decode, or that
    `measure` (given the decoded value) rejects by raising or returning None, keeps None there
    and its file's name in `UNDECODABLE`. The decoding is a `map` declaring the decoded
    features: `datasets` 5 decodes a stream's media only where nothing before typed its
    examples, so after a `filter` or `map` on undecoded media (the sources leave media
    undecoded: trainer/data/sources.py `undecoded`) casting the column back to decoding does
    nothing."""
    from datasets import Features, Value

    feature = replace(stream.features[column], decode=True)
    decoded = Features({**stream.features, column: feature, UNDECODABLE: Value("string")})
    return stream.decode(False).map(DecodedOrNamed(column, feature, measure), features=decoded)


DECODER_MODULES = {"Audio": "torchcodec.decoders", "Video": "torchcodec.decoders",
                   "Image": "PIL.Image"}  # fmt: skip
"""The module each `datasets` media feature decodes with."""


@dataclass
class DecodedOrNamed:
    """The stream's `map` function of `mark_undecodable`; it imports its feature's decoder
    wherever it is made or unpickled, before the stream is read. Why: `datasets` 5 reads a
    stream's sources in a thread each, and for every example checks twice whether the decoder's
    module (torchcodec, PIL) is imported, binding its class after the first check only. A first
    decode in one thread between another's two checks raises `UnboundLocalError: cannot access
    local variable 'VideoDecoder'` in a loader worker (one run in four of two processes with
    two workers each, on two busy cores). Imported beforehand, in the training process (whose
    loader workers fork from it) or in a spawned worker as this is unpickled, both checks
    agree."""

    column: str
    feature: Any
    measure: Callable[[Any], Any]

    def __post_init__(self) -> None:
        self._import_decoder()

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._import_decoder()

    def _import_decoder(self) -> None:
        module = DECODER_MODULES.get(type(self.feature).__name__)
        if module is not None:
            importlib.import_module(module)

    def __call__(self, example: dict) -> dict:
        value = example[self.column]
        try:
            decoded = self.feature.decode_example(value)
            if self.measure(decoded) is None:
                raise ValueError("no measure")
        except Exception:  # noqa: BLE001 - decoders report broken files with many exception types
            return {self.column: None, UNDECODABLE: _name(value, example.get(KEY_COLUMN, "?"))}
        return {self.column: decoded, UNDECODABLE: None}


@dataclass
class StreamSkips:
    """Undecodable examples a training stream skipped, as the training process learns of them
    (each batch carries the names its worker dropped), merged with every process's at each
    progress line (`agree`, called by every rank at the same step). Names, not counts, are
    merged: a shuffled stream gives an example to another process next epoch, so a file counts
    once however often read. The examples read (trained on or skipped) are summed."""

    spec: str
    """`--max_bad_examples`."""
    where: str
    """The training split, for the error line."""
    rows: int | None = None
    """Examples per epoch when the shard index says (the basis of a percentage)."""
    names: dict[str, None] = field(default_factory=dict)
    """Every process's skipped files as of the last agreement, the same in each process."""
    read: int = 0
    """Examples every process has read, as of the last agreement."""
    _new_names: list[str] = field(default_factory=list)
    _new_read: int = 0

    def trained(self, examples: int, skipped: list[str]) -> None:
        """A batch of `examples`, whose worker dropped `skipped` before them."""
        self._new_names += skipped
        self._new_read += examples + len(skipped)

    def agree(self, gather: Callable[[list], list]) -> bool:
        """Merge all processes' news (`gather`: their lists in rank order); whether it brought the
        first skipped names. UserError in every process alike past the allowed count."""
        first = not self.names
        for names, read in gather([(self._new_names, self._new_read)]):
            self.names.update(dict.fromkeys(names))
            self.read += read
        self._new_names, self._new_read = [], 0
        if len(self.names) > self.limit():
            raise UserError(
                f"{len(self.names)} of the {self.read} examples read from the training stream "
                f"({self.where}) cannot be decoded, more than --max_bad_examples {self.spec} "
                f"allows ({self.limit()}{self._basis()}); first: {self.first_names()}"
            )
        return first and bool(self.names)

    def limit(self) -> int:
        return max_bad(self.spec, self.rows or max(self.read, MIN_STREAM_BASIS))

    def state(self) -> dict:
        """What a checkpoint keeps, so that a resumed run counts on (a file it skipped before the
        checkpoint is not read again): the agreed names and reads, the same in every process
        (saves come after the step's progress line), and this process's since."""
        return {"names": list(self.names), "read": self.read,
                "new_names": self._new_names, "new_read": self._new_read}  # fmt: skip

    def resume(self, state: dict) -> None:
        """Go on from a checkpoint's `state` (empty: one saved before streams counted)."""
        self.names = dict.fromkeys(state.get("names", []))
        self.read = state.get("read", 0)
        self._new_names, self._new_read = state.get("new_names", []), state.get("new_read", 0)

    def _basis(self) -> str:
        if not self.spec.strip().endswith("%"):
            return ""
        if self.rows:
            return f" of the shard index's {self.rows}"
        return f" of {max(self.read, MIN_STREAM_BASIS)}: those read, at least {MIN_STREAM_BASIS}"

    def first_warning(self) -> str:
        """The line when the first undecodable examples are skipped (at a progress line,
        which counts them from then on)."""
        head = f"skipped undecodable examples in the training stream ({self.where}): "
        tail = f"; --max_bad_examples {self.spec} allows {self.limit()}"
        names = self.first_names(MAX_LINE - len(head) - len(tail))
        return f"warning: {head}{names}{tail}"

    def first_names(self, room: int | None = None) -> str:
        names = list(self.names)
        return shown(names[:NAMES_SHOWN], len(names) > NAMES_SHOWN, room)
