"""An instance's media (a clip, an image) as bytes, from every form a Vertex AI request
carries it in: `{"b64": ...}` (the convention for binary values, and how batch prediction's
`file-list` input sends each file), a bare base64 string, a `data:` URI, or a `gs://` URI
read with the server's own credentials through the project's storage layer, only under the
prefixes the server allows (a caller could otherwise read anything its account can)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote_to_bytes

from trainer.common.errors import UserError


class InstanceError(ValueError):
    """This instance cannot be predicted; the message says why, for the response."""


def media_bytes(value: object, gcs_read_prefixes: tuple[str, ...] | None = None) -> bytes:
    """The bytes `value` holds or names; a gs:// URI only under `gcs_read_prefixes` (None:
    any)."""
    if isinstance(value, dict) and set(value) == {"b64"} and isinstance(value["b64"], str):
        return _base64(value["b64"])
    if not isinstance(value, str) or not value:
        raise InstanceError(
            'media must be {"b64": ...}, a base64 string, a data: URI or a gs:// URI'
        )
    if value.startswith("data:"):
        header, comma, data = value.partition(",")
        if not comma:
            raise InstanceError("a data: URI needs a comma before its data")
        return _base64(data) if header.endswith(";base64") else unquote_to_bytes(data)
    if value.startswith("gs://"):
        return _gcs_object(value, gcs_read_prefixes)
    return _base64(value)


def readable(uri: str, prefixes: tuple[str, ...]) -> bool:
    """Whether gs:// `uri` lies under one of `prefixes` (each a bucket or a folder, read as
    ending in `/`); a URI with a `.` or `..` segment never does."""
    segments = uri.removeprefix("gs://").split("/")
    if any(segment in (".", "..") for segment in segments):
        return False
    return any(uri.startswith(prefix.rstrip("/") + "/") for prefix in prefixes)


def file_instance(path: Path) -> Callable[[], dict]:
    """A file as the instance batch prediction's `file-list` sends (`{"b64": ...}`), read when
    called; InstanceError when it cannot be read."""

    def read() -> dict:
        try:
            return {"b64": base64.b64encode(path.read_bytes()).decode()}
        except OSError as error:
            raise InstanceError(f"cannot read the file ({error.strerror})") from None

    return read


def failing_instance(reason: str) -> Callable[[], object]:
    """An instance that cannot be read: InstanceError(`reason`) when called."""

    def read() -> object:
        raise InstanceError(reason)

    return read


def _base64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InstanceError("not valid base64") from None


def _gcs_object(uri: str, gcs_read_prefixes: tuple[str, ...] | None) -> bytes:
    from trainer.storage.store import open_store

    if gcs_read_prefixes is not None and not readable(uri, gcs_read_prefixes):
        raise InstanceError(
            f"{uri} is not under a prefix this server reads for its callers (--gcs_read_prefixes)"
        )
    parent, _, name = uri.rpartition("/")
    if not name or parent == "gs:/":
        raise InstanceError(f"{uri} names no object")
    try:
        with open_store(parent).open_read(name) as stream:
            return stream.read()
    except UserError as error:
        raise InstanceError(str(error)) from None
    except Exception as error:  # noqa: BLE001 - a missing or unreadable object, for the response
        raise InstanceError(f"cannot read {uri}: {type(error).__name__}") from None
