"""Content-addressed blobs on an fsspec store, and a per-process LRU cache of them.

After Flink's BlobServer and PermanentBlobCache: large payloads shared by many tasks (such as
zstd-compressed descriptor lists) are put once under their sha256 key, shipped as that key, and
read once per Python worker process.
"""

from blob.cache import BlobCache, process_blob_cache
from blob.options import BLOB_CACHE_MAX_SIZE, BLOB_OPTIONS, BLOB_STORE_URL, blob_store_url
from blob.store import BlobStore, blob_key

__all__ = [
    "BLOB_CACHE_MAX_SIZE",
    "BLOB_OPTIONS",
    "BLOB_STORE_URL",
    "BlobCache",
    "BlobStore",
    "blob_key",
    "blob_store_url",
    "process_blob_cache",
]
