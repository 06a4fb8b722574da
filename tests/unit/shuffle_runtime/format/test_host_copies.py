"""Host copies of partitions' metadata from a shared store: an executor's Python workers fetch
each map output's manifest and index once between them; a copy that does not decode is
fetched again; the copies are bounded."""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from shuffle_api import IntermediateResultPartitionID, ResultPartitionID, SubpartitionRange
from shuffle_api.testing import make_batches
from shuffle_runtime.format import Layouts, PartitionFileReader, PartitionFileWriter, StoreSink
from shuffle_runtime.format.host_copies import HostCopies
from shuffle_runtime.store import Store


class _CountingMemory(MemoryFileSystem):  # type: ignore[misc]  # fsspec has no type hints
    """memory:// under another name (so a shared store, as object stores are), counting reads."""

    protocol = "countingmemory"
    reads: ClassVar[int] = 0

    def cat_file(self, path: str, start: Any = None, end: Any = None, **kwargs: Any) -> Any:
        type(self).reads += 1
        return super().cat_file(path, start=start, end=end, **kwargs)


fsspec.register_implementation("countingmemory", _CountingMemory, clobber=True)

EVERY = SubpartitionRange(0, 1)


@pytest.fixture
def store() -> Iterator[Store]:
    made = Store(f"countingmemory://host-copies-{uuid.uuid4().hex}")
    yield made
    made.delete_tree(made.path())


@pytest.fixture
def executor_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """What Spark gives an executor's Python workers."""
    monkeypatch.setenv("SPARK_LOCAL_DIRS", f"{tmp_path / 'local-1'},{tmp_path / 'local-2'}")
    return tmp_path / "local-1"


def _partition(store: Store) -> ResultPartitionID:
    partition = ResultPartitionID(IntermediateResultPartitionID("copies", 0), uuid.uuid4().hex)
    writer = PartitionFileWriter(
        StoreSink(store, partition), 2, codec="none", memory_budget=64 << 10
    )
    for number, batch in enumerate(make_batches(2_000, batch_rows=500)):
        writer.add(number % 2, batch)
    writer.commit()
    return partition


def _rows_as_another_process_reads(store: Store, partition: ResultPartitionID) -> int:
    PartitionFileReader.forget(store, partition)  # another process has none cached
    reader = PartitionFileReader(store, partition, Layouts.MAPPED)
    return sum(batch.num_rows for batch in reader.read(EVERY))


def test_the_second_process_of_an_executor_reads_the_metadata_from_the_host_copy(
    store: Store, executor_dirs: Path
) -> None:
    partition = _partition(store)
    _CountingMemory.reads = 0
    assert _rows_as_another_process_reads(store, partition) == 2_000
    first = _CountingMemory.reads  # manifest, index, and the data
    _CountingMemory.reads = 0
    assert _rows_as_another_process_reads(store, partition) == 2_000
    assert _CountingMemory.reads == first - 2  # the data only
    names = os.listdir(executor_dirs / "pyshuffle-metadata")
    assert len([name for name in names if not name.endswith(".lock")]) == 1


def test_without_an_executors_directory_nothing_is_copied(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SPARK_LOCAL_DIRS", raising=False)
    partition = _partition(store)
    _CountingMemory.reads = 0
    _rows_as_another_process_reads(store, partition)
    first = _CountingMemory.reads
    _CountingMemory.reads = 0
    _rows_as_another_process_reads(store, partition)
    assert _CountingMemory.reads == first


def test_a_copy_that_does_not_decode_is_fetched_again(store: Store, executor_dirs: Path) -> None:
    partition = _partition(store)
    _rows_as_another_process_reads(store, partition)
    [copy] = (p for p in (executor_dirs / "pyshuffle-metadata").iterdir() if p.suffix != ".lock")
    data = bytearray(copy.read_bytes())
    data[-1] ^= 0xFF  # a flipped bit in the index
    copy.write_bytes(bytes(data))
    assert _rows_as_another_process_reads(store, partition) == 2_000
    assert copy.read_bytes() != bytes(data)  # fetched again, and copied whole


def test_copies_are_pruned_oldest_first_past_the_bound(tmp_path: Path) -> None:
    copies = HostCopies(tmp_path, max_copies=10)
    for index in range(30):
        partition = ResultPartitionID(IntermediateResultPartitionID("pruned", index), "attempt")
        copies.read("s3://bucket", partition, lambda: (b"manifest", b"index"))
    copies.prune()
    # Down to 80% of the bound in files (a copy and its lock each): about 8 copies.
    assert 6 <= len([name for name in os.listdir(tmp_path) if not name.endswith(".lock")]) <= 9
    fetched: list[int] = []

    def fetch() -> tuple[bytes, bytes]:
        fetched.append(1)
        return b"manifest", b"index"

    oldest = ResultPartitionID(IntermediateResultPartitionID("pruned", 0), "attempt")
    copies.read("s3://bucket", oldest, fetch)
    assert fetched == [1]  # the oldest copy was pruned
    newest = ResultPartitionID(IntermediateResultPartitionID("pruned", 29), "attempt")
    assert copies.read("s3://bucket", newest, _unreachable) == (b"manifest", b"index")


def _unreachable() -> tuple[bytes, bytes]:
    raise AssertionError("fetched, where the host's copy was kept")


def test_processes_of_a_host_fetch_a_copy_once_between_them(tmp_path: Path) -> None:
    """Reads of the same copy at once (reducers starting together on every core): one fetch."""
    fetches: list[int] = []
    started = threading.Barrier(8)

    def fetch() -> tuple[bytes, bytes]:
        fetches.append(1)
        time.sleep(0.2)  # the others arrive meanwhile
        return b"manifest", b"index"

    partition = ResultPartitionID(IntermediateResultPartitionID("raced", 0), "attempt")

    def read() -> tuple[bytes, bytes]:
        started.wait()
        # A process of its own: its own HostCopies over the same directory.
        return HostCopies(tmp_path).read("s3://bucket", partition, fetch)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: read(), range(8)))
    assert answers == [(b"manifest", b"index")] * 8
    assert len(fetches) == 1
