"""``shuffle_runtime.store``: paths that cannot escape the root, atomic puts, ranges read,
and the local files a process keeps open between reads (a reducer after another reads a small
block of each of the same map outputs): reused while they are the files their paths name,
dropped when deleted, evicted past a bound or when idle, and never closed under a reader."""

from __future__ import annotations

import errno
import os
import random
import uuid
from pathlib import Path

import pytest

from shuffle_api import (
    AuthenticationError,
    InvalidIdentifierError,
    PermissionDeniedError,
    ShuffleError,
    StorageError,
    StorageFullError,
    TransportError,
)
from shuffle_runtime.store import Store, _OpenFiles, storage_errors
from tests.unit.shuffle_runtime.stores import files_under


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _file(directory: Path, name: str, content: bytes) -> str:
    path = directory / name
    path.write_bytes(content)
    return str(path)


def test_a_file_read_again_is_not_opened_again(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    path = store.path("data")
    store.put_atomic(path, b"0123456789")
    first = store.open_ranges(path)
    assert store.open_ranges(path) is first
    assert first.read_range(2, 3).to_pybytes() == b"234"


@pytest.mark.parametrize("mapped", [True, False])
def test_a_file_deleted_elsewhere_is_gone_and_one_replaced_is_read_anew(
    tmp_path: Path, mapped: bool
) -> None:
    """As another process deletes or replaces it, without this process's store knowing (a
    reader that has it already reads on, as one that opened it before the delete would)."""
    files = _OpenFiles(max_files=8, max_idle=60.0)
    path = _file(tmp_path, "data", b"old bytes")
    before = files.open(path, mapped=mapped)
    replacement = _file(tmp_path, "new", b"new bytes")
    os.replace(replacement, path)
    assert files.open(path, mapped=mapped).read_range(0, 3).to_pybytes() == b"new"
    assert before.read_range(0, 3).to_pybytes() == b"old"
    os.remove(path)
    with pytest.raises(FileNotFoundError):
        files.open(path, mapped=mapped)
    assert len(files) == 0


def test_a_large_read_maps_the_file_the_reader_opened_not_its_path_now(tmp_path: Path) -> None:
    """Large ranges are mapped when first read: the file opened, though another has been
    renamed over its path since."""
    files = _OpenFiles(max_files=8, max_idle=60.0)
    size = 2 << 20
    path = _file(tmp_path, "data", b"o" * size)
    before = files.open(path, mapped=True)
    os.replace(_file(tmp_path, "new", b"n" * size), path)
    assert before.read_range(0, size).to_pybytes() == b"o" * size
    assert files.open(path, mapped=True).read_range(0, size).to_pybytes() == b"n" * size


def test_past_the_bound_the_least_recently_used_goes_and_a_reader_keeps_its_file(
    tmp_path: Path,
) -> None:
    files = _OpenFiles(max_files=2, max_idle=60.0)
    paths = [_file(tmp_path, f"data-{number}", bytes([number]) * 10) for number in range(3)]
    held = files.open(paths[0], mapped=False)
    files.open(paths[1], mapped=False)
    files.open(paths[0], mapped=False)  # used again: paths[1] is now the oldest
    files.open(paths[2], mapped=False)
    assert len(files) == 2
    assert files.open(paths[0], mapped=False) is held
    files.open(paths[1], mapped=False)  # back, in place of paths[2]
    files.open(paths[2], mapped=False)  # back, in place of paths[0]
    # Evicted, yet open for the reader that holds it.
    assert files.open(paths[0], mapped=False) is not held
    assert held.read_range(0, 10).to_pybytes() == bytes([0]) * 10


def test_files_unused_for_the_idle_time_are_let_go(tmp_path: Path) -> None:
    clock = _Clock()
    files = _OpenFiles(max_files=8, max_idle=30.0, clock=clock)
    old = files.open(_file(tmp_path, "old", b"old"), mapped=False)
    clock.now += 20
    recent = files.open(_file(tmp_path, "recent", b"recent"), mapped=False)
    clock.now += 15  # old: 35 s unused; recent: 15 s
    files.open(_file(tmp_path, "other", b"other"), mapped=False)
    assert len(files) == 2
    assert files.open(str(tmp_path / "recent"), mapped=False) is recent
    assert files.open(str(tmp_path / "old"), mapped=False) is not old


def test_letting_go_under_a_directory_drops_its_files_at_any_depth_and_no_others(
    tmp_path: Path,
) -> None:
    files = _OpenFiles(max_files=3, max_idle=60.0)
    for directory in ("a/x", "a/y/z", "ab"):
        (tmp_path / directory).mkdir(parents=True)
    paths = [_file(tmp_path, name, b"bytes") for name in ("a/x/data", "a/y/z/data", "ab/data")]
    opened = [files.open(path, mapped=False) for path in paths]
    files.forget_under(str(tmp_path / "a") + "/")
    assert len(files) == 1
    assert files.open(paths[2], mapped=False) is opened[2], "a name that only starts alike"
    assert files.open(paths[0], mapped=False) is not opened[0]
    files.forget_under(str(tmp_path / "a" / "x"))
    files.forget_under(str(tmp_path / "ab"))
    assert len(files) == 0
    for number in range(5):  # evictions past the bound keep nothing of what they drop
        files.open(_file(tmp_path, f"more-{number}", b"bytes"), mapped=False)
    files.forget_under(str(tmp_path))
    assert len(files) == 0
    assert not files._under


def test_what_this_process_deletes_is_let_go_at_once(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    kept, deleted = store.path("kept", "data"), store.path("deleted", "data")
    for path in (kept, deleted):
        store.put_atomic(path, b"bytes")
        store.open_ranges(path)
    reader = store.open_ranges(kept)
    store.delete_tree(store.path("deleted"))
    with pytest.raises(FileNotFoundError):
        store.open_ranges(deleted)
    assert store.open_ranges(kept) is reader


def test_a_file_truncated_in_place_under_a_reader_reads_short(tmp_path: Path) -> None:
    """A reducer's reads are small and never mapped: a page mapped past the new end would
    kill this process (SIGBUS), where a read is short and fails its checksum."""
    store = Store(str(tmp_path))  # a store whose large reads are mapped
    path = store.path("data")
    store.put_atomic(path, b"x" * 10_000)
    ranges = store.open_ranges(path)
    assert ranges.read_range(8_000, 100).size == 100
    os.truncate(path, 50)
    assert store.open_ranges(path) is ranges  # the same file, shorter
    assert ranges.read_range(0, 100).to_pybytes() == b"x" * 50
    assert ranges.read_range(8_000, 100).size == 0


# --- the store -----------------------------------------------------------------------------


@pytest.mark.parametrize("length", [1000, 3 << 20])
def test_ranges_small_and_large_are_the_file_bytes_and_short_at_its_end(
    any_store: Store, length: int
) -> None:
    """Small ranges are read and large ones sliced from a memory map (a mapped store), small
    messages joined to their prefix and large ones read into place: all give the file's
    bytes, and a range past the end is short, not an error."""
    path = any_store.path("ranges", "data")
    content = random.Random(length).randbytes(2 * length)
    any_store.put_atomic(path, content)
    ranges = any_store.open_ranges(path)
    assert ranges.read_range(7, length).to_pybytes() == content[7 : 7 + length]
    assert ranges.read_range(length + 11, length).to_pybytes() == content[length + 11 :]
    assert ranges.read_range(3 * length, length).size == 0
    assert ranges.read_after(b"head", 7, length) == b"head" + content[7 : 7 + length]
    assert ranges.read_after(b"head", length + 11, length) == b"head" + content[length + 11 :]
    assert ranges.read_after(b"head", 3 * length, length) == b"head"


@pytest.mark.parametrize("part", ["../x", "..", "a/b", "", ".hidden", "x/../../y"])
def test_store_path_rejects_components_that_could_escape_the_root(store: Store, part: str) -> None:
    with pytest.raises(InvalidIdentifierError):
        store.path("result", part)
    with pytest.raises(InvalidIdentifierError):
        store.child(store.path("result"), part)


def test_store_path_joins_valid_components_under_the_root(store: Store) -> None:
    root = store.path()

    assert store.path("result", "0", "attempt") == f"{root}/result/0/attempt"
    assert store.child(store.path("result"), "data.arrow") == f"{root}/result/data.arrow"


def test_put_atomic_writes_the_bytes_and_leaves_no_temp_files(store: Store) -> None:
    directory = store.path("atomic")
    target = store.child(directory, "manifest.json")

    store.put_atomic(target, b"first")
    store.put_atomic(target, b"second version")

    assert store.read_bytes(target) == b"second version"
    assert [path.rsplit("/", 1)[-1] for path in files_under(store, directory)] == ["manifest.json"]


def test_put_and_open_output_write_whole_files_into_directories_they_make(store: Store) -> None:
    """What precedes a commit point is written plainly, its directories made where missing."""
    directory = store.path("result", "0", "attempt")
    index = store.child(directory, "index.arrow")
    data = store.child(directory, "data.arrow")

    store.put(index, b"first index")
    store.put(index, b"the index again")
    with store.open_output(data) as output:
        output.write(b"data bytes")

    assert store.read_bytes(index) == b"the index again"
    assert store.read_bytes(data) == b"data bytes"
    assert store.exists(index) and store.exists(data)
    assert not store.exists(store.child(directory, "manifest.json"))
    assert sorted(path.rsplit("/", 1)[-1] for path in files_under(store, directory)) == [
        "data.arrow",
        "index.arrow",
    ]


def test_put_onto_a_directory_raises_storage_error(local_store: Store) -> None:
    target = local_store.child(local_store.path("plain"), "index.arrow")
    os.makedirs(target)  # a directory where the file should go

    with pytest.raises(StorageError):
        local_store.put(target, b"data")


def test_put_atomic_that_fails_raises_storage_error_and_leaves_no_temp_files(
    local_store: Store,
) -> None:
    directory = local_store.path("atomic")
    target = local_store.child(directory, "manifest.json")
    os.makedirs(os.path.join(target, "occupied"))  # a directory where the file should go

    with pytest.raises(StorageError):
        local_store.put_atomic(target, b"data")

    assert sorted(os.listdir(directory)) == ["manifest.json"]
    assert os.path.isdir(target)


def test_local_store_creates_its_root(tmp_path: Path) -> None:
    root = tmp_path / "a" / "b"

    store = Store(str(root))

    assert root.is_dir()
    assert store.is_local


def test_memory_store_is_not_local() -> None:
    store = Store(f"memory://pyshuffle-unit-{uuid.uuid4().hex}")

    assert not store.is_local


def test_delete_tree_tolerates_missing_paths(store: Store) -> None:
    missing = store.path("nothing-here")

    store.delete_tree(missing)
    assert not store.exists(missing)


def test_a_store_is_opened_only_where_it_exists_and_never_created(tmp_path: Path) -> None:
    missing = tmp_path / "producer-store"
    assert Store.open_existing(str(missing)) is None
    assert not missing.exists()
    assert Store.open_existing("no-such-protocol://bucket/store") is None
    missing.mkdir()
    found = Store.open_existing(str(missing))
    assert found is not None and found.url == str(missing)


@pytest.mark.parametrize(
    "raised",
    [
        AuthenticationError("the application ended"),
        PermissionDeniedError("pushed for another application"),
        TransportError("the worker went away"),
        StorageFullError("no space left on the worker's store"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_a_shuffle_error_keeps_its_class_through_storage_errors(raised: ShuffleError) -> None:
    # Each is an OSError too (a refusal is a PermissionError, a lost peer a ConnectionError):
    # a push sink raises them inside a write, which must not make them a StorageError.
    with pytest.raises(type(raised)) as caught, storage_errors("workers 127.0.0.1:1"):
        raise raised
    assert caught.value is raised


def test_an_os_error_of_the_store_becomes_a_storage_error() -> None:
    full = pytest.raises(StorageFullError, match="no space left on the store while writing here")
    with full, storage_errors("here"):
        raise OSError(errno.ENOSPC, "No space left on device")
    failing = pytest.raises(StorageError, match="store operation on here failed")
    with failing as failed, storage_errors("here"):
        raise OSError(errno.EIO, "Input/output error")
    assert type(failed.value) is StorageError
