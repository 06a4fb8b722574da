"""Options of the blob store and the consumer-side blob cache (keys under ``blob.``)."""

from __future__ import annotations

from typing import Any, Final

from shuffle_api.config import ConfigOption, Configuration, memory_option, str_option
from shuffle_runtime.store import default_store_url

__all__ = [
    "BLOB_CACHE_MAX_SIZE",
    "BLOB_OPTIONS",
    "BLOB_STORE_URL",
    "blob_store_url",
    "default_blob_store_url",
]

BLOB_STORE_URL = str_option(
    "blob.store-url",
    "",
    "fsspec URL of the content-addressed blob store; empty: a directory in the temp dir (local"
    " only). In a cluster it must be a store every process can read: a shared file system or an"
    " object store.",
)
BLOB_CACHE_MAX_SIZE = memory_option(
    "blob.cache.max-size",
    100 << 20,
    "Bytes of blob contents each Python worker process keeps in its LRU cache; a blob larger"
    " than this is read every time it is asked for.",
    minimum=1,
)

BLOB_OPTIONS: Final[tuple[ConfigOption[Any], ...]] = (BLOB_STORE_URL, BLOB_CACHE_MAX_SIZE)


def default_blob_store_url() -> str:
    """``<default partition store>-blobs``: a local directory beside the default partition
    store."""
    return f"{default_store_url()}-blobs"


def blob_store_url(configuration: Configuration) -> str:
    """The configured blob store URL, or :func:`default_blob_store_url` when it is empty."""
    return configuration.get(BLOB_STORE_URL) or default_blob_store_url()
