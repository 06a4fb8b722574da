"""A process-side LRU cache of blob contents, bounded by bytes (after Flink's
PermanentBlobCache): reduce tasks in one Python worker read a shared blob once."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from concurrent.futures import Future

from blob.options import default_blob_store_url
from blob.store import BlobStore, validate_blob_key
from shuffle_api.errors import ConfigError

__all__ = ["BlobCache", "process_blob_cache"]


class BlobCache:
    """Blob contents by key, least recently used evicted first once over ``max_bytes``.

    Thread-safe; concurrent gets of a key that is not cached read the store once. A blob
    larger than ``max_bytes`` is returned but not kept. Keys name their content, so an entry
    is never stale; and :meth:`BlobStore.get` verifies what it reads, so entries are trusted.
    """

    def __init__(self, store: BlobStore, max_bytes: int) -> None:
        self._store = store
        self._max_bytes = _checked_max_bytes(max_bytes)
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, bytes] = OrderedDict()  # least recently used first
        self._size = 0
        self._in_flight: dict[str, Future[bytes]] = {}
        self._hits = 0
        self._misses = 0

    @property
    def store(self) -> BlobStore:
        return self._store

    @property
    def max_bytes(self) -> int:
        return self._max_bytes

    @property
    def size_bytes(self) -> int:
        """Total bytes of the cached blobs."""
        with self._lock:
            return self._size

    @property
    def hits(self) -> int:
        """Gets answered without reading the store (including those that waited for another
        thread's read of the same key)."""
        with self._lock:
            return self._hits

    @property
    def misses(self) -> int:
        """Gets that read the store."""
        with self._lock:
            return self._misses

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is cached (does not count as a use)."""
        with self._lock:
            return key in self._entries

    def get(self, key: str) -> bytes:
        """The bytes of blob ``key``, from the cache or else from the store.

        Raises what :meth:`BlobStore.get` raises; failures are not cached.
        """
        validate_blob_key(key)
        with self._lock:
            cached = self._entries.get(key)
            if cached is not None:
                self._entries.move_to_end(key)
                self._hits += 1
                return cached
            pending = self._in_flight.get(key)
            if pending is not None:
                self._hits += 1
            else:
                fetch: Future[bytes] = Future()
                self._in_flight[key] = fetch
                self._misses += 1
        if pending is not None:
            # Another thread is reading this blob: share its result (or its error).
            return pending.result()
        try:
            data = self._store.get(key)
        except BaseException as error:
            # Waiters are woken first, then the key is free for a fresh read by a later get.
            fetch.set_exception(error)
            with self._lock:
                del self._in_flight[key]
            raise
        fetch.set_result(data)
        with self._lock:
            del self._in_flight[key]
            self._keep(key, data)
        return data

    def evict(self, key: str) -> None:
        """Drop ``key`` from the cache (an uncached key is fine)."""
        validate_blob_key(key)
        with self._lock:
            data = self._entries.pop(key, None)
            if data is not None:
                self._size -= len(data)

    def clear(self) -> None:
        """Drop every entry (the hit and miss counts are kept)."""
        with self._lock:
            self._entries.clear()
            self._size = 0

    def resize(self, max_bytes: int) -> None:
        """Set a new bound, evicting least recently used entries beyond it."""
        max_bytes = _checked_max_bytes(max_bytes)
        with self._lock:
            self._max_bytes = max_bytes
            self._trim()

    def _keep(self, key: str, data: bytes) -> None:
        # Caller holds the lock. An oversized blob is not kept: caching it would evict
        # everything else and then itself.
        if len(data) > self._max_bytes:
            return
        # Only the thread that read the key from the store keeps it, so it is not cached yet.
        self._entries[key] = data
        self._size += len(data)
        self._trim()

    def _trim(self) -> None:
        while self._size > self._max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self._size -= len(evicted)


def _checked_max_bytes(max_bytes: int) -> int:
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
        raise ConfigError(f"blob cache max_bytes must be an int >= 0, got {max_bytes!r}")
    return max_bytes


class _ProcessCaches:
    """The caches of this process by (pid, store url)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.caches: dict[tuple[int, str], BlobCache] = {}

    def reset(self) -> None:
        # Spark forks Python workers: a child must not reuse the parent's caches, nor a lock
        # that a parent thread may have held at the moment of the fork.
        self.lock = threading.Lock()
        self.caches = {}


_PROCESS_CACHES = _ProcessCaches()
os.register_at_fork(after_in_child=_PROCESS_CACHES.reset)


def process_blob_cache(url: str, max_bytes: int) -> BlobCache:
    """This process's cache of the blob store at ``url``, created on first use.

    Later calls return the same cache; a different ``max_bytes`` resizes it.
    """
    url = url or default_blob_store_url()
    # The pid in the key guards forks that bypass Python's fork hooks (a fork() from C code).
    key = (os.getpid(), url)
    with _PROCESS_CACHES.lock:
        cache = _PROCESS_CACHES.caches.get(key)
        if cache is None:
            cache = BlobCache(BlobStore(url), max_bytes)
            _PROCESS_CACHES.caches[key] = cache
            return cache
    if cache.max_bytes != max_bytes:
        cache.resize(max_bytes)
    return cache
