"""``blob.store``: the content-addressed blob store, on a local directory and on memory://."""

from __future__ import annotations

import hashlib
import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from blob import BlobStore, blob_key
from shuffle_api import BlobCorruptedError, BlobNotFoundError, InvalidIdentifierError, ShuffleError
from shuffle_runtime.store import Store, default_store_url

BAD_KEYS = [
    "../x",
    "/etc/passwd",
    "A" * 64,
    "0123456789ABCDEF" * 4,
    "a" * 63,
    "a" * 65,
    "",
    "../" + "a" * 61,
    "g" * 64,
]


@pytest.fixture(params=["local", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BlobStore]:
    """A real blob store: a local tmp_path directory, or a memory:// root unique to the test."""
    if request.param == "local":
        yield BlobStore(str(tmp_path / "blobs-root"))
        return
    url = f"memory://pyshuffle-blob-unit-{uuid.uuid4().hex}"
    yield BlobStore(url)
    raw = Store(url)
    raw.delete_tree(raw.path())


def files_under(blob_store: BlobStore) -> list[str]:
    """Every file below the store's root (temporary files included)."""
    raw = Store(blob_store.url)
    return sorted(raw.filesystem.find(raw.path()))


def blob_path(blob_store: BlobStore, key: str) -> str:
    raw = Store(blob_store.url)
    return raw.path("blobs", key[:2], key)


def test_put_then_get_returns_the_same_bytes(store: BlobStore) -> None:
    data = os.urandom(100_000)

    key = store.put(data)

    assert store.get(key) == data
    assert store.exists(key)


def test_empty_blob_round_trips(store: BlobStore) -> None:
    key = store.put(b"")

    assert key == hashlib.sha256(b"").hexdigest()
    assert store.get(key) == b""


def test_key_is_the_sha256_hex_digest(store: BlobStore) -> None:
    data = b"shuffle descriptors"

    key = store.put(data)

    assert key == hashlib.sha256(data).hexdigest() == blob_key(data)
    assert len(key) == 64
    assert key == key.lower()


def test_layout_is_blobs_slash_two_hex_digits_slash_key(tmp_path: Path) -> None:
    root = tmp_path / "root"
    key = BlobStore(str(root)).put(b"layout")

    assert (root / "blobs" / key[:2] / key).read_bytes() == b"layout"


def test_same_data_gives_the_same_key_and_one_file(store: BlobStore) -> None:
    first = store.put(b"payload")
    second = store.put(b"payload")

    assert first == second
    assert files_under(store) == [blob_path(store, first)]


def test_putting_existing_bytes_does_not_rewrite_the_file(tmp_path: Path) -> None:
    store = BlobStore(str(tmp_path))
    key = store.put(b"once")
    path = tmp_path / "blobs" / key[:2] / key
    before = path.stat()

    store.put(b"once")

    after = path.stat()
    # An atomic rewrite replaces the file, which gives it a new inode.
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_put_replaces_a_truncated_blob(store: BlobStore) -> None:
    data = b"x" * 1000
    key = store.put(data)
    Store(store.url).put_atomic(blob_path(store, key), data[:10])

    assert store.put(data) == key
    assert store.get(key) == data


def test_different_data_gives_different_keys(store: BlobStore) -> None:
    assert store.put(b"one") != store.put(b"two")
    assert len(files_under(store)) == 2


def test_put_leaves_no_temporary_files(store: BlobStore) -> None:
    keys = [store.put(os.urandom(10_000 + n)) for n in range(5)]

    assert files_under(store) == sorted(blob_path(store, key) for key in keys)


def test_readers_see_a_whole_blob_or_none_while_it_is_put(tmp_path: Path) -> None:
    store = BlobStore(str(tmp_path))
    data = os.urandom(4 << 20)
    key = blob_key(data)
    stop = threading.Event()
    outcomes: list[str] = []

    def read() -> None:
        while not stop.is_set():
            try:
                outcomes.append("whole" if store.get(key) == data else "wrong")
            except BlobNotFoundError:
                outcomes.append("none")
            except BlobCorruptedError:
                outcomes.append("partial")

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for _ in range(30):
            store.put(data)
            store.delete(key)
    finally:
        stop.set()
        reader.join()

    assert outcomes
    assert set(outcomes) <= {"whole", "none"}


def test_corrupted_blob_raises_blob_corrupted_error_naming_key_and_store(
    store: BlobStore,
) -> None:
    key = store.put(b"the real bytes")
    Store(store.url).put_atomic(blob_path(store, key), b"the fake bytes")

    with pytest.raises(BlobCorruptedError) as caught:
        store.get(key)

    assert key in str(caught.value)
    assert store.url in str(caught.value)
    assert isinstance(caught.value, ShuffleError)


def test_corrupted_blob_file_on_disk_is_detected(tmp_path: Path) -> None:
    store = BlobStore(str(tmp_path))
    key = store.put(b"abcdef" * 100)
    path = tmp_path / "blobs" / key[:2] / key
    damaged = bytearray(path.read_bytes())
    damaged[17] ^= 0x01
    path.write_bytes(bytes(damaged))

    with pytest.raises(BlobCorruptedError, match=key):
        store.get(key)


def test_missing_blob_raises_blob_not_found_naming_key_and_store(store: BlobStore) -> None:
    key = blob_key(b"never put")

    with pytest.raises(BlobNotFoundError) as caught:
        store.get(key)

    assert key in str(caught.value)
    assert store.url in str(caught.value)
    assert isinstance(caught.value, LookupError)
    assert not store.exists(key)


def test_blob_put_to_another_store_is_not_found(store: BlobStore, tmp_path: Path) -> None:
    other = BlobStore(str(tmp_path / "other"))
    key = other.put(b"elsewhere")

    with pytest.raises(BlobNotFoundError):
        store.get(key)


def test_get_after_delete_raises_blob_not_found(store: BlobStore) -> None:
    key = store.put(b"short-lived")

    store.delete(key)

    assert not store.exists(key)
    with pytest.raises(BlobNotFoundError):
        store.get(key)


def test_delete_removes_only_that_blob(store: BlobStore) -> None:
    kept = store.put(b"kept")
    gone = store.put(b"gone")

    store.delete(gone)

    assert files_under(store) == [blob_path(store, kept)]


def test_delete_of_a_missing_blob_is_fine(store: BlobStore) -> None:
    store.delete(blob_key(b"never put"))


def test_blob_can_be_put_again_after_delete(store: BlobStore) -> None:
    key = store.put(b"again")
    store.delete(key)

    assert store.put(b"again") == key
    assert store.get(key) == b"again"


@pytest.mark.parametrize("bad_key", BAD_KEYS)
@pytest.mark.parametrize("operation", ["get", "exists", "delete"])
def test_bad_keys_are_rejected_and_touch_nothing(
    store: BlobStore, bad_key: str, operation: str
) -> None:
    key = store.put(b"bystander")
    before = files_under(store)

    with pytest.raises(InvalidIdentifierError) as caught:
        getattr(store, operation)(bad_key)

    assert repr(bad_key) in str(caught.value)
    assert files_under(store) == before
    assert store.get(key) == b"bystander"


def test_a_key_cannot_delete_a_file_outside_the_store(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    store = BlobStore(str(tmp_path / "store"))

    for bad_key in ("../../victim", "../victim", str(victim)):
        with pytest.raises(InvalidIdentifierError):
            store.delete(bad_key)

    assert victim.read_bytes() == b"keep me"


@pytest.mark.parametrize("bad_key", [None, 7, b"a" * 64])
def test_keys_that_are_not_strings_are_rejected(store: BlobStore, bad_key: Any) -> None:
    with pytest.raises(InvalidIdentifierError):
        store.get(bad_key)


def test_url_is_the_url_given(tmp_path: Path) -> None:
    url = str(tmp_path / "given")

    assert BlobStore(url).url == url


def test_empty_url_means_the_default_blob_directory() -> None:
    assert BlobStore("").url == f"{default_store_url()}-blobs"
