"""A shard's bytes checked against its index entry while a stream reads them: CRC32C over the
bytes as they pass (no second download), size and example count compared at the shard's end. A
shard that disagrees stops the run with one line naming it (`DataFault`): damaged audio is not
trained on, and a short shard makes no silently short epoch.

Readers do not always read front to back: Parquet reads the footer first, then row group after
row group. The checksum runs over the bytes in file order; a read starting a little past the
checked prefix (Parquet's 4-byte magic) has the gap read in, one far ahead (the footer) is left
for `finish`, which reads what is still unchecked (Parquet's footer again, a few KB; a tar's
end-of-archive padding).
"""

from __future__ import annotations

import base64
from typing import BinaryIO

import google_crc32c

from trainer.data.damaged_data import DataFault
from trainer.data.shard_index import INDEX, Shard

GAP_READ_LIMIT = 1 << 20
"""A read starting at most this far past the checked prefix has the gap read in at once."""
CHUNK = 8 << 20


class VerifiedReader:
    """A file-like reader (read, seek, tell) over `raw` that checksums what passes."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._checksum = google_crc32c.Checksum()
        self._checked = 0
        """Bytes from the start whose CRC32C is in `_checksum`."""

    def read(self, size: int = -1) -> bytes:
        start = self._raw.tell()
        data = self._raw.read(size)
        if self._checked < start <= self._checked + GAP_READ_LIMIT:
            self._raw.seek(self._checked)
            self._absorb(self._checked, self._raw.read(start - self._checked))
            self._raw.seek(start + len(data))
        self._absorb(start, data)
        return data

    def _absorb(self, start: int, data: bytes) -> None:
        if start <= self._checked < start + len(data):
            self._checksum.update(data[self._checked - start :])
            self._checked = start + len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._raw.seek(offset, whence)

    def tell(self) -> int:
        return self._raw.tell()

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    @property
    def closed(self) -> bool:
        return self._raw.closed

    def close(self) -> None:
        """The store's handle is closed by its owner (a `with` block)."""

    def finish(self) -> tuple[int, str]:
        """Read what is still unchecked; the file's size and CRC32C (base64, big-endian)."""
        self._raw.seek(self._checked)
        for chunk in iter(lambda: self._raw.read(CHUNK), b""):
            self._absorb(self._checked, chunk)
        return self._checked, base64.b64encode(self._checksum.digest()).decode()


def check_shard(reader: VerifiedReader, shard: Shard, rows: int | None, where: str) -> None:
    """`shard`'s bytes, and its `rows` when it was read to its end, as its index entry says."""
    size, crc = reader.finish()
    if size != shard.bytes:
        raise DataFault(
            f"shard {where} holds {size} bytes but {INDEX} says {shard.bytes}: it changed "
            "after indexing (truncated or replaced); write or index the shard set again"
        )
    if shard.crc32c and crc != shard.crc32c:
        raise DataFault(
            f"shard {where} has CRC32C {crc} but {INDEX} says {shard.crc32c}: its bytes "
            "are damaged; write or index the shard set again"
        )
    if rows is not None and rows != shard.rows:
        raise DataFault(
            f"shard {where} held {rows} examples but {INDEX} says {shard.rows}; write or "
            "index the shard set again"
        )
