"""``shuffle_runtime.format.sink``: a StoreSink refuses a committed partition, and a store
that takes part of each write still gets every byte."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, BinaryIO, cast

import pytest

from shuffle_api import ResultPartitionID, ShuffleError
from shuffle_runtime.format import PartitionFileReader, PartitionFileWriter, StoreSink
from shuffle_runtime.store import Store
from tests.unit.shuffle_runtime.format.partitions import (
    SPREAD_WRITES,
    expected_keys,
    make_batch,
    read_keys,
    write_partition,
)


def test_writing_again_to_a_committed_partition_raises_shuffle_error(
    store: Store, partition: ResultPartitionID
) -> None:
    write_partition(store, partition, SPREAD_WRITES)

    with pytest.raises(ShuffleError, match="already committed"):
        PartitionFileWriter(StoreSink(store, partition), 3, codec="lz4", memory_budget=1 << 20)

    reader = PartitionFileReader(store, partition)
    assert read_keys(reader, 0) == expected_keys(SPREAD_WRITES, 0)


class _ShortWritesStore(Store):
    """A local store whose data files take at most 1000 bytes per write call, as an unbuffered
    file may."""

    def open_output(self, path: str) -> BinaryIO:
        return cast(BinaryIO, _ShortWritesFile(super().open_output(path)))


class _ShortWritesFile(io.RawIOBase):
    def __init__(self, target: BinaryIO) -> None:
        self._target = target

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        return self._target.write(memoryview(data)[:1000])

    def close(self) -> None:
        self._target.close()
        super().close()


def test_a_store_that_takes_part_of_each_write_still_gets_every_byte(
    tmp_path: Path, partition: ResultPartitionID
) -> None:
    store = _ShortWritesStore(str(tmp_path / "store"))
    writes = [(i % 3, make_batch(i * 500, 500)) for i in range(6)]
    writer = PartitionFileWriter(
        StoreSink(store, partition), 3, codec="none", memory_budget=1 << 20
    )
    for subpartition, batch in writes:
        writer.add(subpartition, batch)
    writer.commit()
    reader = PartitionFileReader(store, partition)
    for subpartition in range(3):
        assert read_keys(reader, subpartition) == expected_keys(writes, subpartition)
