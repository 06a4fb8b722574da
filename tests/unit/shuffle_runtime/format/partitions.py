"""Partitions written, read back and edited on a store, for the tests of
``shuffle_runtime.format``."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa

from shuffle_api import BROADCAST, ResultPartitionID, SubpartitionRange
from shuffle_runtime.format import (
    PartitionFileReader,
    PartitionFileWriter,
    StoreSink,
    partition_directory,
)
from shuffle_runtime.format.manifest import MANIFEST_FILE
from shuffle_runtime.store import Store

SCHEMA = pa.schema([("key", pa.int64()), ("text", pa.string())])


def make_batch(start: int, rows: int) -> pa.RecordBatch:
    keys = list(range(start, start + rows))
    return pa.record_batch(
        [pa.array(keys, type=pa.int64()), pa.array([f"row-{k}" for k in keys])], schema=SCHEMA
    )


def keys_of(batches: Iterable[pa.RecordBatch]) -> list[int]:
    return [key for batch in batches for key in batch.column("key").to_pylist()]


def write_partition(
    store: Store,
    partition: ResultPartitionID,
    writes: list[tuple[int, pa.RecordBatch]],
    *,
    subpartitions: int = 3,
    codec: str = "lz4",
    memory_budget: int = 1 << 20,
) -> PartitionFileWriter:
    writer = PartitionFileWriter(
        StoreSink(store, partition), subpartitions, codec=codec, memory_budget=memory_budget
    )
    for subpartition, batch in writes:
        writer.add(subpartition, batch)
    writer.commit()
    return writer


def expected_keys(writes: list[tuple[int, pa.RecordBatch]], subpartition: int) -> list[int]:
    return keys_of([batch for target, batch in writes if target in (subpartition, BROADCAST)])


def read_keys(reader: PartitionFileReader, subpartition: int) -> list[int]:
    return keys_of(reader.read(SubpartitionRange.single(subpartition)))


def file_path(store: Store, partition: ResultPartitionID, name: str) -> str:
    return store.child(partition_directory(store, partition), name)


SPREAD_WRITES = [
    (0, make_batch(0, 10)),
    (1, make_batch(100, 5)),
    (2, make_batch(200, 7)),
    (0, make_batch(10, 3)),
    (2, make_batch(207, 1)),
]


def rewrite(store: Store, path: str, data: bytes) -> None:
    store.filesystem.pipe_file(path, data)


def edit_manifest(
    store: Store, partition: ResultPartitionID, change: Callable[[dict[str, Any]], object]
) -> None:
    manifest_path = file_path(store, partition, MANIFEST_FILE)
    document = json.loads(store.read_bytes(manifest_path))
    change(document)
    rewrite(store, manifest_path, json.dumps(document).encode())
