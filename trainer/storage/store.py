"""The only module that talks to Cloud Storage.

A `Store` is a directory-like place: a `gs://bucket/prefix` URI, or a local directory; a
`/gcs/BUCKET/...` path (Vertex AI's FUSE mount) is opened as the `gs://BUCKET/...` it mirrors
(`open_store`). The rest of the project works on local paths and hands whole directories to a
store. Transfers to GCS run in parallel (the client's transfer manager), are retried with
backoff and verified by size and CRC32C afterwards; a file that does not verify is sent again,
and an error is raised if it never does.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import shutil
import time
import uuid
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import BinaryIO

import google_crc32c

from trainer.common.errors import StorageUnavailable, UserError
from trainer.storage.failure_kinds import brief, permanent, refused, unavailable
from trainer.storage.file_modes import make_files_readable

logger = logging.getLogger(__name__)

TRANSFER_ATTEMPTS = 5
TRANSFER_THREADS = 8
READ_CHUNK = 8 << 20
"""Bytes one ranged GET fetches when a stream reads an object (a Parquet row group of
audio is a few MB): large enough that requests cost little, small enough to hold."""


@dataclass(frozen=True)
class FileEntry:
    """A file as a manifest records it: path relative to the store, size, CRC32C."""

    path: str
    size: int
    crc32c: str
    """Base64 of the big-endian CRC32C, the form Cloud Storage reports."""


class TransferError(RuntimeError):
    """Files that still failed to transfer or verify after every retry."""


class StoredFilesDiffer(TransferError):
    """The stored files are proven not to be what their manifest lists (missing, or another
    size or CRC32C), or the manifest itself does not parse: the only reasons to give up on a
    checkpoint that has a manifest. `why` says which, briefly, for a user's line."""

    def __init__(self, message: str, why: str) -> None:
        super().__init__(message)
        self.why = why


def differing(expected: list[FileEntry], found: dict[str, FileEntry]) -> list[str]:
    """Paths of `expected` whose stored entry (`found`, by path) is missing or differs in
    size or CRC32C: what a listing proves wrong, with no byte read."""
    return [entry.path for entry in expected if found.get(entry.path) != entry]


def differing_why(paths: list[str], found: dict[str, FileEntry]) -> str:
    """`paths` (from `differing`) in brief: the first of those of another size or CRC32C and
    of those missing, with how many more (`model.safetensors differs from its manifest`)."""

    def first_of(some: list[str]) -> str:
        return some[0] if len(some) == 1 else f"{some[0]} and {len(some) - 1} more"

    missing = [path for path in paths if path not in found]
    other = [path for path in paths if path in found]
    parts = [f"{first_of(other)} {'differs' if len(other) == 1 else 'differ'} from its "
             "manifest"] if other else []  # fmt: skip
    if missing:
        parts.append(f"{first_of(missing)} {'is' if len(missing) == 1 else 'are'} missing")
    return ", ".join(parts)


def crc32c_of(path: Path) -> str:
    checksum = google_crc32c.Checksum()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(4 << 20), b""):
            checksum.update(chunk)
    return base64.b64encode(checksum.digest()).decode()


def describe_local(root: Path, files: list[str]) -> list[FileEntry]:
    with ThreadPoolExecutor(TRANSFER_THREADS) as pool:
        checksums = list(pool.map(lambda name: crc32c_of(root / name), files))
    return [
        FileEntry(name, (root / name).stat().st_size, crc)
        for name, crc in zip(files, checksums, strict=True)
    ]


def relative_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root).as_posix()) for p in root.rglob("*") if p.is_file())


class Store(ABC):
    uri: str

    @abstractmethod
    def child(self, name: str) -> Store: ...

    @abstractmethod
    def list_files(self) -> dict[str, FileEntry]:
        """Every file below this store, by relative path."""

    @abstractmethod
    def list_dirs(self) -> list[str]:
        """Names of the immediate sub-directories."""

    @abstractmethod
    def read_text(self, name: str) -> str | None:
        """A small file's content, or None if it does not exist."""

    @abstractmethod
    def write_text(self, name: str, text: str) -> None: ...

    @abstractmethod
    def create_text(self, name: str, text: str) -> bool:
        """Write `name` only if it does not exist, atomically (two writers racing: exactly
        one succeeds); False when it already existed. A claim is made this way: a read
        followed by a write would let two writers both see nothing and both write."""

    @abstractmethod
    def open_read(self, name: str) -> BinaryIO:
        """A seekable binary reader of one file that fetches only the ranges read (a
        stream reads Parquet row groups this way: nothing lands on local disk)."""

    @abstractmethod
    def delete(self) -> None:
        """Remove everything below this store."""

    @abstractmethod
    def _put(self, local_root: Path, files: list[str]) -> None: ...

    @abstractmethod
    def _get(self, names: list[str], local_root: Path) -> None: ...

    def upload(self, local_root: Path, files: list[str] | None = None) -> list[FileEntry]:
        """Copy files (relative to `local_root`) here; return them as verified entries."""
        files = relative_files(local_root) if files is None else files
        expected = describe_local(local_root, files)
        pending = list(files)
        for attempt in range(1, TRANSFER_ATTEMPTS + 1):
            self._transfer(lambda names: self._put(local_root, names), pending, attempt)
            remote = self.list_files()
            pending = differing(expected, remote)
            if not pending:
                return expected
        raise TransferError(f"upload to {self.uri} failed for: {', '.join(pending)}")

    def download(self, local_root: Path, expected: list[FileEntry] | None = None) -> None:
        """Fetch files here into `local_root`, skipping those present and intact. Files whose
        stored size or CRC32C differs from `expected` are corrupt or missing in the store,
        which no retry fixes: `StoredFilesDiffer` at once. Any other failure (a refusal, an
        outage, a full local disk) proves nothing about the stored files."""
        remote = self.list_files()
        expected = list(remote.values()) if expected is None else expected
        damaged = differing(expected, remote)
        if damaged:
            raise StoredFilesDiffer(
                f"{self.uri} does not hold what its manifest lists: {damaged}",
                differing_why(damaged, remote),
            )
        pending = [e.path for e in expected if not _matches(local_root / e.path, e)]
        for attempt in range(1, TRANSFER_ATTEMPTS + 1):
            if not pending:
                return
            self._transfer(lambda names: self._get(names, local_root), pending, attempt)
            pending = [e.path for e in expected if not _matches(local_root / e.path, e)]
        raise TransferError(f"download from {self.uri} failed for: {', '.join(pending)}")

    def bucket_gone(self) -> bool:
        """Whether this store's bucket was deleted mid-run: every later write must fail, so a
        caller stops retrying. A local directory is recreated by any write: never gone."""
        return False

    def check_writable(self) -> None:
        """Write and delete a probe file, so a bad location fails before training."""
        probe = self.child(f".write-probe-{uuid.uuid4().hex}")
        try:
            probe.write_text("probe", "")
            probe.delete()
        except UserError:
            raise
        except Exception as error:  # noqa: BLE001 - any failure means "cannot write here"
            if unavailable(error) and not refused(error):
                raise StorageUnavailable(
                    f"{self.uri} did not answer the launcher's write probe ({brief(error)}): "
                    "storage is unavailable, not misconfigured; a restart tries again"
                ) from None
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
            raise UserError(
                f"Cannot write to {self.uri}: {type(error).__name__} {first_line}".rstrip()
            ) from None

    def _transfer(self, run, names: list[str], attempt: int) -> None:
        if attempt > 1:
            delay = min(2 ** (attempt - 2), 30)
            logger.warning("retrying %d file(s) for %s in %ss", len(names), self.uri, delay)
            time.sleep(delay)
        try:
            run(names)
        except Exception as error:  # noqa: BLE001 - verification decides what to resend
            if permanent(error):
                raise  # refused, or no local space: the same request would fail again
            logger.warning("transfer with %s failed (%s); will retry", self.uri, error)


def _matches(path: Path, entry: FileEntry) -> bool:
    return path.is_file() and path.stat().st_size == entry.size and crc32c_of(path) == entry.crc32c


class LocalStore(Store):
    """A local directory. Files are written in place; completeness is decided by the
    manifest written last, not by the file system."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.uri = str(root)

    def child(self, name: str) -> LocalStore:
        return LocalStore(self.root / name)

    def list_files(self) -> dict[str, FileEntry]:
        if not self.root.is_dir():
            return {}
        return {e.path: e for e in describe_local(self.root, relative_files(self.root))}

    def list_dirs(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir())

    def read_text(self, name: str) -> str | None:
        path = self.root / name
        return path.read_text() if path.is_file() else None

    def write_text(self, name: str, text: str) -> None:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def create_text(self, name: str, text: str) -> bool:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        draft = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
        draft.write_text(text)  # whole before it gets its name: no reader sees it half-written
        try:
            os.link(draft, path)  # fails if the name exists, however close the race
        except FileExistsError:
            return False
        finally:
            draft.unlink()
        return True

    def open_read(self, name: str) -> BinaryIO:
        return (self.root / name).open("rb")

    def delete(self) -> None:
        if self.root.is_dir():
            shutil.rmtree(self.root)
        elif self.root.exists():
            self.root.unlink()

    def _put(self, local_root: Path, files: list[str]) -> None:
        for name in files:
            source, target = local_root / name, self.root / name
            if target.exists() and os.path.samefile(source, target):
                continue  # the store is where the files already are (e.g. a hard link)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
        make_files_readable(self.root, files)  # whatever the umask: trainer/storage/file_modes.py

    def _get(self, names: list[str], local_root: Path) -> None:
        for name in names:
            target = local_root / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.root / name, target)


class GcsStore(Store):
    def __init__(self, bucket: str, prefix: str) -> None:
        self.bucket_name = bucket
        self.prefix = prefix.strip("/")
        self.uri = f"gs://{bucket}/{self.prefix}".rstrip("/")

    def child(self, name: str) -> GcsStore:
        return GcsStore(self.bucket_name, f"{self.prefix}/{name}".strip("/"))

    @property
    def _bucket(self):
        return _client().bucket(self.bucket_name)

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}".strip("/") if name else self.prefix

    def list_files(self) -> dict[str, FileEntry]:
        start = f"{self.prefix}/" if self.prefix else ""
        return {
            blob.name[len(start) :]: FileEntry(blob.name[len(start) :], blob.size, blob.crc32c)
            for blob in _client().list_blobs(self.bucket_name, prefix=start, retry=_retry())
        }

    def list_dirs(self) -> list[str]:
        start = f"{self.prefix}/" if self.prefix else ""
        iterator = _client().list_blobs(
            self.bucket_name, prefix=start, delimiter="/", retry=_retry()
        )
        list(iterator)  # prefixes are filled in while pages are read
        return sorted(p[len(start) :].rstrip("/") for p in iterator.prefixes)

    def read_text(self, name: str) -> str | None:
        from google.api_core.exceptions import NotFound

        try:
            return self._bucket.blob(self._key(name)).download_as_text(retry=_retry())
        except NotFound:
            return None

    def write_text(self, name: str, text: str) -> None:
        self._bucket.blob(self._key(name)).upload_from_string(text, retry=_retry())

    def create_text(self, name: str, text: str) -> bool:
        """`ifGenerationMatch=0`: Cloud Storage creates the object only if it has no live
        version ("Request preconditions"), else answers 412."""
        from google.api_core.exceptions import PreconditionFailed

        blob = self._bucket.blob(self._key(name))
        try:
            blob.upload_from_string(text, if_generation_match=0, retry=_retry())
        except PreconditionFailed:
            return False
        return True

    def open_read(self, name: str) -> BinaryIO:
        return self._bucket.blob(self._key(name)).open("rb", chunk_size=READ_CHUNK, retry=_retry())

    def delete(self) -> None:
        from google.api_core.exceptions import NotFound

        names = list(self.list_files())
        blobs = [self._bucket.blob(self._key(name)) for name in names]
        if self.prefix and not names:
            blobs = [self._bucket.blob(self.prefix)]

        def delete(blob) -> None:
            with contextlib.suppress(NotFound):  # already gone: that is what we wanted
                blob.delete(retry=_retry())

        with ThreadPoolExecutor(TRANSFER_THREADS) as pool:  # a request each: side by side
            list(pool.map(delete, blobs))

    def _put(self, local_root: Path, files: list[str]) -> None:
        from google.cloud.storage import transfer_manager

        results = transfer_manager.upload_many_from_filenames(
            self._bucket,
            files,
            source_directory=str(local_root),
            blob_name_prefix=f"{self.prefix}/" if self.prefix else "",
            upload_kwargs={"retry": _retry()},
            worker_type=transfer_manager.THREAD,
            max_workers=TRANSFER_THREADS,
        )
        _raise_first(results)

    def _get(self, names: list[str], local_root: Path) -> None:
        from google.cloud.storage import transfer_manager

        results = transfer_manager.download_many_to_path(
            self._bucket,
            names,
            destination_directory=str(local_root),
            blob_name_prefix=f"{self.prefix}/" if self.prefix else "",
            download_kwargs={"retry": _retry()},
            worker_type=transfer_manager.THREAD,
            max_workers=TRANSFER_THREADS,
        )
        _raise_first(results)

    def bucket_gone(self) -> bool:
        return not self._bucket.exists(retry=_retry())

    def check_writable(self) -> None:
        try:
            super().check_writable()
        except UserError as error:
            if "NotFound" in str(error):
                raise UserError(f"Bucket gs://{self.bucket_name} does not exist.") from None
            raise


def _raise_first(results: list) -> None:
    for result in results:
        if isinstance(result, Exception):
            raise result


def _client():
    """One client per process: a forked DataLoader worker (which reads stream shards) must
    not share its parent's connections."""
    return _process_client(os.getpid())


@cache
def _process_client(pid: int):
    """The client of process `pid`; the emulator (STORAGE_EMULATOR_HOST) needs no credentials."""
    from google.cloud import storage

    if os.environ.get("STORAGE_EMULATOR_HOST"):
        from google.auth.credentials import AnonymousCredentials

        return storage.Client(project="emulator", credentials=AnonymousCredentials())
    from google.auth.exceptions import DefaultCredentialsError

    try:
        return storage.Client()
    except DefaultCredentialsError:
        raise UserError(
            "No Google Cloud credentials for Cloud Storage: on Vertex AI the job's service "
            "account provides them; elsewhere run `gcloud auth application-default login`."
        ) from None


def _retry():
    """Exponential backoff on 429/5xx and dropped connections, for writes too: ours are idempotent
    (the same bytes to the same name)."""
    from google.cloud.storage.retry import DEFAULT_RETRY

    return DEFAULT_RETRY.with_deadline(120)


FUSE_MOUNT = "gcs"
"""Vertex AI mounts every bucket the job can read at /gcs/BUCKET (Cloud Storage FUSE)."""


def bucket_uri(location: str) -> str:
    """`/gcs/BUCKET/x` as `gs://BUCKET/x`; any other location unchanged. Through FUSE a store
    would read every uploaded byte back for its CRC32C, without atomic rename; Cloud Storage
    reports each object's size and CRC32C, and the client retries uploads."""
    parts = Path(location).parts
    if len(parts) < 3 or parts[:2] != ("/", FUSE_MOUNT):
        return location
    return "gs://" + "/".join(parts[2:])


def open_store(location: str) -> Store:
    """The store for a gs:// URI, a /gcs/ path (as its gs:// URI) or a local directory."""
    location = bucket_uri(location)
    if location.startswith("gs://"):
        bucket, _, prefix = location.removeprefix("gs://").partition("/")
        if not bucket:
            raise UserError(f"{location} names no bucket (expected gs://BUCKET/PATH).")
        return GcsStore(bucket, prefix)
    return LocalStore(Path(location).expanduser())
