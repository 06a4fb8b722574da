"""Reads ahead from a store: in order, several at once, within their byte budget."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any, ClassVar

import fsspec
import pyarrow as pa
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from shuffle_api import (
    IntermediateResultPartitionID,
    PartitionNotFoundError,
    ResultPartitionID,
    ShuffleServiceClosedError,
    SubpartitionRange,
)
from shuffle_api.testing import make_batches
from shuffle_api.testing.harness import route
from shuffle_runtime.format import Layouts, PartitionFileReader, PartitionFileWriter, StoreSink
from shuffle_runtime.store import Store
from shuffle_runtime.store_reads import StoreReads

SUBPARTITIONS = 4
PARTITIONS = 8


class _SlowMemory(MemoryFileSystem):  # type: ignore[misc]  # fsspec has no type hints
    """memory:// whose reads take a while, counting how many run at once."""

    protocol = "slowmemory"
    delay: ClassVar[float] = 0.3  # long enough that reads overlap on a busy host
    running: ClassVar[int] = 0
    most_at_once: ClassVar[int] = 0
    lock: ClassVar[threading.Lock] = threading.Lock()

    def cat_file(self, path: str, start: Any = None, end: Any = None, **kwargs: Any) -> Any:
        cls = type(self)
        with cls.lock:
            cls.running += 1
            cls.most_at_once = max(cls.most_at_once, cls.running)
        try:
            time.sleep(cls.delay)
            return super().cat_file(path, start=start, end=end, **kwargs)
        finally:
            with cls.lock:
                cls.running -= 1


fsspec.register_implementation("slowmemory", _SlowMemory, clobber=True)


@pytest.fixture
def store() -> Iterator[Store]:
    made = Store(f"slowmemory://store-reads-{uuid.uuid4().hex}")
    yield made
    made.delete_tree(made.path())


def _write(store: Store) -> tuple[list[ResultPartitionID], list[pa.RecordBatch]]:
    batches = make_batches(16_000, batch_rows=2_000)
    partitions = []
    for index in range(PARTITIONS):
        partition = ResultPartitionID(IntermediateResultPartitionID("reads", index), "attempt")
        # Small runs, several per subpartition: a block of each is more than one range.
        writer = PartitionFileWriter(
            StoreSink(store, partition), SUBPARTITIONS, codec="none", memory_budget=64 << 10
        )
        for batch in batches[index::PARTITIONS]:
            keys = route(batch, SUBPARTITIONS)
            for subpartition in range(SUBPARTITIONS):
                writer.add(subpartition, batch.filter(pa.array(keys == subpartition)))
        writer.commit()
        partitions.append(partition)
    return partitions, batches


def _rows_by_partition(answers: Iterator[pa.RecordBatch | None]) -> list[list[int]]:
    rows: list[list[int]] = [[]]
    for answer in answers:
        if answer is None:
            rows.append([])
        else:
            rows[-1].extend(answer.column("row").to_pylist())
    return rows[:-1]


def test_each_partition_is_answered_in_turn_as_its_own_reader_reads_it(store: Store) -> None:
    partitions, _ = _write(store)
    wanted = SubpartitionRange(1, 2)
    reads = StoreReads(threads=4, ahead_bytes=64 << 20)
    try:
        answered = _rows_by_partition(reads.read(store, partitions, wanted))
    finally:
        reads.close()
    expected = [
        [row for batch in PartitionFileReader(store, p).read(wanted) for row in batch["row"]]
        for p in partitions
    ]
    assert answered == [[value.as_py() for value in rows] for rows in expected]
    assert sum(map(len, answered)) > 0


@pytest.mark.parametrize(("ahead_bytes", "at_once"), [(64 << 20, 4), (1, 1)])
def test_blocks_are_read_several_at_once_within_the_budget(
    store: Store, ahead_bytes: int, at_once: int
) -> None:
    """With room for every block, ``threads`` reads run at once; with room for none, only
    the block its reader waits for is read."""
    partitions, _ = _write(store)
    for partition in partitions:  # layouts cached: only blocks are read below
        PartitionFileReader(store, partition, Layouts.MAPPED)
    _SlowMemory.most_at_once = 0
    reads = StoreReads(threads=4, ahead_bytes=ahead_bytes)
    try:
        for _ in reads.read(store, partitions, SubpartitionRange(0, SUBPARTITIONS - 1)):
            time.sleep(0.01)  # a reader slower than nothing
    finally:
        reads.close()
    assert _SlowMemory.most_at_once == at_once


def test_a_missing_partition_fails_at_its_turn_after_the_ones_before(store: Store) -> None:
    partitions, _ = _write(store)
    missing = ResultPartitionID(IntermediateResultPartitionID("reads", 99), "attempt")
    order = [partitions[0], missing, partitions[1]]
    reads = StoreReads(threads=4, ahead_bytes=64 << 20)
    answered: list[pa.RecordBatch | None] = []
    try:
        with pytest.raises(PartitionNotFoundError) as raised:
            answered.extend(reads.read(store, order, SubpartitionRange(0, SUBPARTITIONS - 1)))
    finally:
        reads.close()
    assert raised.value.partition_id == missing
    assert answered.count(None) == 1  # the first partition, whole


def test_an_empty_partition_between_others_is_answered_empty(store: Store) -> None:
    partitions, _ = _write(store)
    empty = ResultPartitionID(IntermediateResultPartitionID("reads", 50), "attempt")
    sink = StoreSink(store, empty)
    PartitionFileWriter(sink, SUBPARTITIONS, codec="none", memory_budget=1 << 20).commit()
    order = [partitions[0], empty, partitions[1]]
    reads = StoreReads(threads=1, ahead_bytes=64 << 20)  # its layout not read ahead
    try:
        answered = _rows_by_partition(reads.read(store, order, SubpartitionRange(0, 3)))
    finally:
        reads.close()
    assert [len(rows) > 0 for rows in answered] == [True, False, True]


def test_reads_of_a_closed_environment_fail_typed(store: Store) -> None:
    partitions, _ = _write(store)
    reads = StoreReads(threads=2, ahead_bytes=64 << 20)
    answers = reads.read(store, partitions, SubpartitionRange(0, 1))
    reads.close()
    with pytest.raises(ShuffleServiceClosedError):
        list(answers)
