"""A content-addressed blob store on any fsspec store (after Flink's BlobServer).

A blob's key is the sha256 of its bytes, so a key names one content forever: puts are
idempotent, readers verify what they read, and a cache never needs invalidating.
Layout: ``<root>/blobs/<first two hex digits of the key>/<key>``.
"""

from __future__ import annotations

import hashlib
import re

from blob.options import default_blob_store_url
from shuffle_api.errors import BlobCorruptedError, BlobNotFoundError, InvalidIdentifierError
from shuffle_runtime.store import Store

__all__ = ["BlobStore", "blob_key", "validate_blob_key"]

_BLOBS_DIRECTORY = "blobs"
_KEY_PATTERN = re.compile(r"[0-9a-f]{64}")


def blob_key(data: bytes) -> str:
    """The key of ``data``: its sha256 as 64 lowercase hex digits."""
    return hashlib.sha256(data).hexdigest()


def validate_blob_key(key: str) -> str:
    """Return ``key`` if it is 64 lowercase hex digits, else raise
    :class:`InvalidIdentifierError` (so no key can name a path outside the store)."""
    if not isinstance(key, str) or not _KEY_PATTERN.fullmatch(key):
        raise InvalidIdentifierError(
            f"invalid blob key {key!r}: expected a sha256 digest of 64 lowercase hex digits"
        )
    return key


class BlobStore:
    """Blobs under ``url`` (empty: :func:`~blob.options.default_blob_store_url`).

    Store failures (full disk, permissions, an unreachable object store) raise
    :class:`~shuffle_api.errors.StorageError`.
    """

    def __init__(self, url: str) -> None:
        self._store = Store(url or default_blob_store_url())

    @property
    def url(self) -> str:
        return self._store.url

    def __repr__(self) -> str:
        return f"BlobStore({self.url!r})"

    def _path(self, key: str) -> str:
        validate_blob_key(key)
        # Fan out over 256 directories: a flat directory of many blobs is slow to list on
        # some file systems.
        return self._store.path(_BLOBS_DIRECTORY, key[:2], key)

    def put(self, data: bytes) -> str:
        """Store ``data`` (atomically: readers see all of it or nothing) and return its key.

        Idempotent: if a blob of this key and size is already there, nothing is written.
        """
        key = blob_key(data)
        path = self._path(key)
        try:
            present = self._store.size(path) == len(data)
        except FileNotFoundError:
            present = False
        # A size check costs one stat, not a read, and still replaces a truncated blob.
        if not present:
            self._store.put_atomic(path, data)
        return key

    def get(self, key: str) -> bytes:
        """The bytes of blob ``key``, verified against the key.

        Raises :class:`BlobNotFoundError` if it is missing and :class:`BlobCorruptedError` if
        what was read does not hash to ``key``.
        """
        path = self._path(key)
        try:
            data = self._store.read_bytes(path)
        except FileNotFoundError as error:
            raise BlobNotFoundError(
                f"no blob with key {key} in blob store {self.url}: it was never put, was"
                " deleted, or was put to a different store"
            ) from error
        actual = blob_key(data)
        if actual != key:
            raise BlobCorruptedError(
                f"blob {key} in blob store {self.url} is corrupted: its {len(data)} bytes hash"
                f" to {actual}"
            )
        return data

    def exists(self, key: str) -> bool:
        return self._store.exists(self._path(key))

    def delete(self, key: str) -> None:
        """Remove blob ``key``; a missing blob is fine."""
        # The fan-out directory is left in place: removing it could race with a concurrent put
        # of another blob into it (there are at most 256 of them).
        self._store.delete_tree(self._path(key))
