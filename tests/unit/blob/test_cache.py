"""The per-process LRU blob cache: counters, eviction by bytes, threads, one cache per process."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from blob import BlobCache, BlobStore, blob_key, process_blob_cache
from shuffle_api import BlobNotFoundError, ConfigError, InvalidIdentifierError
from shuffle_runtime.store import Store


class CountingBlobStore(BlobStore):
    """A real blob store that counts the reads of each key, each taking at least ``delay``."""

    def __init__(self, url: str, delay: float = 0.0) -> None:
        super().__init__(url)
        self.delay = delay
        self.fetches: Counter[str] = Counter()
        self._count_lock = threading.Lock()

    def get(self, key: str) -> bytes:
        with self._count_lock:
            self.fetches[key] += 1
        # Widens the window in which other threads ask for the same key.
        time.sleep(self.delay)
        return super().get(key)


@pytest.fixture(params=["local", "memory"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A real store URL: a local tmp_path directory, or a memory:// root unique to the test."""
    if request.param == "local":
        yield str(tmp_path / "blobs-root")
        return
    memory_url = f"memory://pyshuffle-blob-cache-unit-{uuid.uuid4().hex}"
    yield memory_url
    raw = Store(memory_url)
    raw.delete_tree(raw.path())


@pytest.fixture
def store(url: str) -> CountingBlobStore:
    return CountingBlobStore(url)


def blob_of(size: int, tag: str) -> bytes:
    """``size`` bytes that differ for each tag."""
    return (tag.encode() * size)[:size]


def test_first_get_is_a_miss_and_later_gets_are_hits(store: CountingBlobStore) -> None:
    key = store.put(b"descriptors")
    cache = BlobCache(store, max_bytes=1000)

    assert cache.get(key) == b"descriptors"
    assert (cache.hits, cache.misses) == (0, 1)
    assert cache.get(key) == b"descriptors"
    assert cache.get(key) == b"descriptors"

    assert (cache.hits, cache.misses) == (2, 1)
    assert store.fetches[key] == 1
    assert cache.size_bytes == len(b"descriptors")


def test_least_recently_used_entry_is_evicted_first(store: CountingBlobStore) -> None:
    a, b, c, d = (store.put(blob_of(100, tag)) for tag in "abcd")
    cache = BlobCache(store, max_bytes=300)
    for key in (a, b, c):
        cache.get(key)
    cache.get(a)  # a is now more recently used than b and c

    cache.get(d)

    assert [key in cache for key in (a, b, c, d)] == [True, False, True, True]
    assert cache.size_bytes == 300
    assert len(cache) == 3


def test_a_large_entry_evicts_as_many_old_entries_as_its_bytes_need(
    store: CountingBlobStore,
) -> None:
    small = [store.put(blob_of(100, tag)) for tag in "abc"]
    large = store.put(blob_of(250, "L"))
    cache = BlobCache(store, max_bytes=400)
    for key in small:
        cache.get(key)

    cache.get(large)

    assert [key in cache for key in small] == [False, False, True]
    assert large in cache
    assert cache.size_bytes == 350


def test_an_evicted_entry_is_read_from_the_store_again(store: CountingBlobStore) -> None:
    first = store.put(blob_of(60, "1"))
    second = store.put(blob_of(60, "2"))
    cache = BlobCache(store, max_bytes=100)
    cache.get(first)
    cache.get(second)  # evicts first

    assert cache.get(first) == blob_of(60, "1")

    assert store.fetches[first] == 2
    assert cache.misses == 3


def test_an_entry_larger_than_the_cache_is_returned_but_not_kept(
    store: CountingBlobStore,
) -> None:
    kept = store.put(blob_of(50, "k"))
    oversize = store.put(blob_of(101, "o"))
    cache = BlobCache(store, max_bytes=100)
    cache.get(kept)

    assert cache.get(oversize) == blob_of(101, "o")
    assert cache.get(oversize) == blob_of(101, "o")

    assert oversize not in cache
    assert kept in cache  # an oversize entry does not flush the others
    assert cache.size_bytes == 50
    assert store.fetches[oversize] == 2


def test_an_entry_of_exactly_max_bytes_is_kept(store: CountingBlobStore) -> None:
    key = store.put(blob_of(100, "x"))
    cache = BlobCache(store, max_bytes=100)

    cache.get(key)

    assert key in cache
    assert cache.size_bytes == 100


def test_evict_drops_one_entry(store: CountingBlobStore) -> None:
    gone = store.put(b"gone")
    kept = store.put(b"kept!")
    cache = BlobCache(store, max_bytes=1000)
    cache.get(gone)
    cache.get(kept)

    cache.evict(gone)

    assert gone not in cache
    assert kept in cache
    assert cache.size_bytes == len(b"kept!")
    cache.get(gone)
    assert store.fetches[gone] == 2


def test_evict_of_an_uncached_key_is_fine(store: CountingBlobStore) -> None:
    cache = BlobCache(store, max_bytes=1000)

    cache.evict(blob_key(b"never cached"))

    assert cache.size_bytes == 0


def test_clear_drops_every_entry_and_keeps_the_counters(store: CountingBlobStore) -> None:
    keys = [store.put(blob_of(10, tag)) for tag in "xyz"]
    cache = BlobCache(store, max_bytes=1000)
    for key in keys:
        cache.get(key)
    cache.get(keys[0])

    cache.clear()

    assert (len(cache), cache.size_bytes) == (0, 0)
    assert (cache.hits, cache.misses) == (1, 3)
    cache.get(keys[0])
    assert cache.misses == 4


def test_resize_evicts_down_to_the_new_bound(store: CountingBlobStore) -> None:
    a, b, c = (store.put(blob_of(100, tag)) for tag in "abc")
    cache = BlobCache(store, max_bytes=300)
    for key in (a, b, c):
        cache.get(key)

    cache.resize(150)

    assert [key in cache for key in (a, b, c)] == [False, False, True]
    assert cache.max_bytes == 150


def test_a_missing_blob_raises_and_is_not_cached(store: CountingBlobStore) -> None:
    data = b"late"
    key = blob_key(data)
    cache = BlobCache(store, max_bytes=1000)

    with pytest.raises(BlobNotFoundError):
        cache.get(key)
    store.put(data)

    assert cache.get(key) == data
    assert store.fetches[key] == 2


def test_bad_keys_are_rejected_before_reading_the_store(store: CountingBlobStore) -> None:
    cache = BlobCache(store, max_bytes=1000)

    for bad_key in ("../x", "A" * 64, "a" * 63):
        with pytest.raises(InvalidIdentifierError):
            cache.get(bad_key)
        with pytest.raises(InvalidIdentifierError):
            cache.evict(bad_key)

    assert not store.fetches
    assert cache.misses == 0


@pytest.mark.parametrize("max_bytes", [-1, 1.5, True])
def test_max_bytes_must_be_a_non_negative_int(store: CountingBlobStore, max_bytes: object) -> None:
    with pytest.raises(ConfigError, match="max_bytes"):
        BlobCache(store, max_bytes)  # type: ignore[arg-type]


def test_concurrent_gets_fetch_each_key_once_when_it_fits(url: str) -> None:
    store = CountingBlobStore(url, delay=0.02)
    blobs = {store.put(blob_of(1000, tag)): blob_of(1000, tag) for tag in "abcd"}
    cache = BlobCache(store, max_bytes=len(blobs) * 1000)
    threads_count, rounds = 8, 50
    start = threading.Barrier(threads_count)
    wrong: list[str] = []

    def work() -> None:
        start.wait()
        for _ in range(rounds):
            for key, data in blobs.items():
                if cache.get(key) != data:
                    wrong.append(key)

    threads = [threading.Thread(target=work) for _ in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert not wrong
    assert store.fetches == dict.fromkeys(blobs, 1)
    assert cache.misses == len(blobs)
    assert cache.hits == threads_count * rounds * len(blobs) - len(blobs)
    assert cache.size_bytes == len(blobs) * 1000


def test_concurrent_gets_of_a_missing_blob_read_once_and_all_fail(url: str) -> None:
    store = CountingBlobStore(url, delay=0.1)
    key = blob_key(b"missing")
    cache = BlobCache(store, max_bytes=1000)
    threads_count = 8
    start = threading.Barrier(threads_count)
    errors: list[BaseException] = []
    errors_lock = threading.Lock()

    def work() -> None:
        start.wait()
        try:
            cache.get(key)
        except BlobNotFoundError as error:
            with errors_lock:
                errors.append(error)

    threads = [threading.Thread(target=work) for _ in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(errors) == threads_count
    assert store.fetches[key] == 1


def test_concurrent_gets_under_eviction_return_the_right_bytes(url: str) -> None:
    store = CountingBlobStore(url)
    blobs = {store.put(blob_of(100 + n, str(n))): blob_of(100 + n, str(n)) for n in range(10)}
    cache = BlobCache(store, max_bytes=350)  # about three of the ten fit
    wrong: list[str] = []

    def work(offset: int) -> None:
        keys = list(blobs)
        for n in range(200):
            key = keys[(n * 7 + offset) % len(keys)]
            if cache.get(key) != blobs[key]:
                wrong.append(key)

    threads = [threading.Thread(target=work, args=(offset,)) for offset in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert not wrong
    assert cache.size_bytes <= 350
    assert cache.size_bytes == sum(len(blobs[key]) for key in blobs if key in cache)
    assert cache.hits + cache.misses == 8 * 200


def test_process_blob_cache_is_created_once_per_url(url: str, tmp_path: Path) -> None:
    first = process_blob_cache(url, 1000)

    assert process_blob_cache(url, 1000) is first
    assert process_blob_cache(str(tmp_path / "another"), 1000) is not first
    assert first.store.url == url


def test_process_blob_cache_reads_a_shared_blob_once(url: str) -> None:
    key = BlobStore(url).put(b"shared by many reducers")

    for _ in range(5):
        assert process_blob_cache(url, 1000).get(key) == b"shared by many reducers"

    cache = process_blob_cache(url, 1000)
    assert (cache.misses, cache.hits) == (1, 4)


def test_process_blob_cache_takes_a_new_max_bytes(url: str) -> None:
    cache = process_blob_cache(url, 1000)

    assert process_blob_cache(url, 10).max_bytes == 10
    assert cache.max_bytes == 10


def test_a_forked_process_gets_its_own_cache(tmp_path: Path) -> None:
    url = str(tmp_path / "forked")
    parent_cache = process_blob_cache(url, 1000)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running pytest's teardown
        status = 1
        try:
            answer = b"own" if process_blob_cache(url, 1000) is not parent_cache else b"same"
            os.write(write_end, answer)
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    try:
        answer = os.read(read_end, 16)
    finally:
        os.close(read_end)
        _, status = os.waitpid(pid, 0)

    assert os.waitstatus_to_exitcode(status) == 0
    assert answer == b"own"
    assert process_blob_cache(url, 1000) is parent_cache
