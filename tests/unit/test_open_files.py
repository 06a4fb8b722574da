"""The local files a process keeps open between reads (a reducer after another reads a small
block of each of the same map outputs): reused while they are the files their paths name,
dropped when deleted, evicted past a bound or when idle, and never closed under a reader."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shuffle_runtime.store import Store, _OpenFiles


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
