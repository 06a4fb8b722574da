"""Sort-merge partition writer: batches grouped by subpartition, spilled in regions.

Layout of a committed partition (see ``docs/format.md``):
- ``data.arrow``: one Arrow IPC file. It starts with an empty batch (so the schema is written
  before the first run), then region after region; in each region the runs of subpartition
  0, 1, ... ; a broadcast batch is flushed as a run of its own (subpartition -1) so the order
  of writes is kept.
- ``index.arrow``: an Arrow IPC file with one row per run (:data:`INDEX_SCHEMA`).
- ``manifest.json``: written last and atomically; its presence is the commit.
"""

from __future__ import annotations

import contextlib
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import xxhash

from shuffle_api.errors import ShuffleError
from shuffle_api.format.layout import partition_directory
from shuffle_api.format.manifest import (
    CODECS,
    DATA_FILE,
    INDEX_FILE,
    INDEX_SCHEMA,
    MANIFEST_FILE,
    PartitionManifest,
)
from shuffle_api.ids import ResultPartitionID
from shuffle_api.io import BROADCAST, PartitionStatistics
from shuffle_api.store import Store, storage_errors

__all__ = ["MAX_RUN_BYTES", "PartitionFileWriter", "ipc_write_options"]

MAX_RUN_BYTES = 8 << 20
"""A run is cut once it reaches this size: a run is what the data port sends as one frame, so
runs stay far below ``netty-like.network.max-frame-size`` whatever the sort buffer holds."""


def ipc_write_options(codec: str) -> pa.ipc.IpcWriteOptions:
    if codec not in CODECS:
        raise ShuffleError(f"unknown codec {codec!r}; choose one of {', '.join(CODECS)}")
    return pa.ipc.IpcWriteOptions(compression=None if codec == "none" else codec)


class _HashingSink:
    """A write-only file that hashes what passes through, so each run's checksum costs no
    re-read. pyarrow writes to it through ``pa.PythonFile``."""

    def __init__(self, target: BinaryIO) -> None:
        self._target = target
        self._hasher = xxhash.xxh3_64()
        self._position = 0
        self.closed = False

    def write(self, data: bytes) -> int:
        self._hasher.update(data)
        self._target.write(data)
        self._position += len(data)
        return len(data)

    def tell(self) -> int:
        return self._position

    def flush(self) -> None:
        self._target.flush()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._target.close()

    def take_checksum(self) -> int:
        """The hash of everything written since the last call."""
        digest = self._hasher.intdigest()
        self._hasher.reset()
        return int(digest)


class PartitionFileWriter:
    """Writes one partition in the on-store format. Not thread-safe: one producer task."""

    def __init__(
        self,
        store: Store,
        partition: ResultPartitionID,
        number_of_subpartitions: int,
        *,
        codec: str,
        memory_budget: int,
    ) -> None:
        self._store = store
        self._partition = partition
        self._subpartitions = number_of_subpartitions
        self._options = ipc_write_options(codec)
        self._codec = codec
        self._memory_budget = memory_budget
        self._directory = partition_directory(store, partition)
        if store.exists(store.child(self._directory, MANIFEST_FILE)):
            raise ShuffleError(f"partition {partition} is already committed at {self._directory}")
        self._buffers: list[list[pa.RecordBatch]] = [[] for _ in range(number_of_subpartitions)]
        self._buffered_bytes = 0
        self._sink: _HashingSink | None = None
        self._run_start = 0
        self._ipc: pa.ipc.RecordBatchFileWriter | None = None
        self._schema: pa.Schema | None = None
        self._batches = 0
        self._region = 0
        self._index: dict[str, list[int]] = {field.name: [] for field in INDEX_SCHEMA}
        self._rows = np.zeros(number_of_subpartitions, dtype=np.int64)
        self._bytes = np.zeros(number_of_subpartitions, dtype=np.int64)
        self._broadcast_rows = 0
        self._broadcast_bytes = 0

    @property
    def buffered_bytes(self) -> int:
        return self._buffered_bytes

    def add(self, subpartition: int, batch: pa.RecordBatch) -> None:
        """Take a batch for one subpartition (or :data:`BROADCAST`); spill past the budget."""
        if not (subpartition == BROADCAST or 0 <= subpartition < self._subpartitions):
            raise ShuffleError(
                f"subpartition {subpartition} out of range [0, {self._subpartitions})"
                f" of partition {self._partition}"
            )
        self._open(batch.schema)
        if subpartition == BROADCAST:
            self.spill()
            self._write_run(BROADCAST, [batch])
            self._region += 1
            return
        self._buffers[subpartition].append(batch)
        self._buffered_bytes += batch.nbytes
        if self._buffered_bytes >= self._memory_budget:
            self.spill()

    def spill(self) -> None:
        """Write every buffered batch as one region."""
        if not self._buffered_bytes:
            return
        for subpartition, batches in enumerate(self._buffers):
            if batches:
                self._write_run(subpartition, batches)
                batches.clear()
        self._buffered_bytes = 0
        self._region += 1

    def _open(self, schema: pa.Schema) -> None:
        if self._ipc is not None:
            return
        for field in schema:
            if pa.types.is_dictionary(field.type):
                raise ShuffleError(
                    f"column {field.name!r} is dictionary-encoded, which partitions do not"
                    f" store; cast it to {field.type.value_type} first"
                )
        path = self._store.child(self._directory, DATA_FILE)
        with storage_errors(path):
            self._sink = _HashingSink(self._store.open_output(path))
            self._ipc = pa.ipc.new_file(
                pa.PythonFile(self._sink, mode="w"), schema, options=self._options
            )
            # Forces the header and schema out now, so every run's range holds only batches.
            self._ipc.write_batch(
                pa.record_batch([pa.array([], type=field.type) for field in schema], schema=schema)
            )
        self._sink.take_checksum()
        self._run_start = self._sink.tell()
        self._schema = schema
        self._batches = 1

    def _write_run(self, subpartition: int, batches: list[pa.RecordBatch]) -> None:
        """Write ``batches`` as runs of at most about :data:`MAX_RUN_BYTES` each."""
        assert self._sink is not None and self._ipc is not None
        first = 0
        with storage_errors(self._directory):
            for index, batch in enumerate(batches):
                self._ipc.write_batch(batch)
                if self._sink.tell() - self._run_start >= MAX_RUN_BYTES:
                    self._index_run(subpartition, batches[first : index + 1])
                    first = index + 1
        if first < len(batches):
            self._index_run(subpartition, batches[first:])

    def _index_run(self, subpartition: int, batches: list[pa.RecordBatch]) -> None:
        assert self._sink is not None
        start = self._run_start
        self._run_start = self._sink.tell()
        rows = sum(batch.num_rows for batch in batches)
        length = self._run_start - start
        for name, value in (
            ("subpartition", subpartition),
            ("region", self._region),
            ("first_batch", self._batches),
            ("num_batches", len(batches)),
            ("offset", start),
            ("length", length),
            ("rows", rows),
            ("checksum", self._sink.take_checksum()),
        ):
            self._index[name].append(value)
        self._batches += len(batches)
        if subpartition == BROADCAST:
            self._broadcast_rows += rows
            self._broadcast_bytes += length
        else:
            self._rows[subpartition] += rows
            self._bytes[subpartition] += length

    def commit(self) -> PartitionStatistics:
        """Write what is buffered, the index, then the manifest (the commit point)."""
        self.spill()
        data_bytes = 0
        if self._ipc is not None and self._sink is not None:
            with storage_errors(self._directory):
                self._ipc.close()
                data_bytes = self._sink.tell()
                self._sink.close()
        index = pa.BufferOutputStream()
        with pa.ipc.new_file(index, INDEX_SCHEMA) as index_writer:
            index_writer.write_table(pa.table(self._index, schema=INDEX_SCHEMA))
        index_bytes = index.getvalue().to_pybytes()
        self._store.put_atomic(self._store.child(self._directory, INDEX_FILE), index_bytes)
        statistics = PartitionStatistics(
            tuple(int(v) + self._broadcast_rows for v in self._rows),
            tuple(int(v) + self._broadcast_bytes for v in self._bytes),
        )
        manifest = PartitionManifest(
            partition=self._partition,
            number_of_subpartitions=self._subpartitions,
            codec=self._codec,
            schema=self._schema,
            statistics=statistics,
            num_regions=self._region,
            data_bytes=data_bytes,
            index_checksum=xxhash.xxh3_64_intdigest(index_bytes),
        )
        self._store.put_atomic(
            self._store.child(self._directory, MANIFEST_FILE), manifest.to_json()
        )
        return statistics

    def abort(self) -> None:
        """Drop buffers and delete whatever reached the store."""
        self._buffers = [[] for _ in range(self._subpartitions)]
        self._buffered_bytes = 0
        if self._sink is not None:
            # The directory is removed next; a close error changes nothing.
            with contextlib.suppress(OSError):
                self._sink.close()
        self._store.delete_tree(self._directory)
