"""Sort-merge partition writer: batches grouped by subpartition, spilled in regions.

Layout of a committed partition (see ``docs/format.md``):
- ``data.arrow``: one Arrow IPC file. It starts with an empty batch (so the schema is written
  before the first run), then region after region; in each region the runs of subpartition
  0, 1, ... (each region's rows of a subpartition coalesced into batches of about the target
  size); a broadcast batch is flushed as a run of its own (subpartition -1) so the order of
  writes is kept.
- ``index.arrow``: an Arrow IPC file with one row per run (:data:`INDEX_SCHEMA`).
- ``manifest.json``: written last and atomically; its presence is the commit.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from shuffle_api.errors import ShuffleError
from shuffle_api.io import BROADCAST, PartitionStatistics
from shuffle_api.options import COMPRESSION_AUTO_BANDWIDTH, TARGET_BATCH_SIZE
from shuffle_runtime.batches import OrderedRows, chop, coalesce_sized, group_nbytes
from shuffle_runtime.format.codec_choice import AUTO, choose_codec, ipc_write_options
from shuffle_runtime.format.manifest import INDEX_SCHEMA, MAX_SUBPARTITIONS, PartitionManifest
from shuffle_runtime.format.sink import DataStream, PartitionSink, write_all
from shuffle_runtime.ndarrays import arrow_array
from shuffle_runtime.store import storage_errors

__all__ = ["MAX_RUN_BYTES", "PartitionFileWriter", "index_file"]

MAX_RUN_BYTES = 8 << 20
"""A run is cut once it reaches this size: a run is what the data port sends as one frame, so
runs stay far below ``netty-like.network.max-frame-size`` whatever the sort buffer holds."""


# Bytes the IPC writer hands over natively before they cross into Python.
_STREAM_BUFFER_BYTES = 256 << 10
# Bytes of runs gathered before they are hashed and written to the store.
_STORE_WRITE_BYTES = 1 << 20


class _HashingSink:
    """A write-only file that gathers what pyarrow writes through it (through a native
    ``pa.BufferedOutputStream``), hashes each run in what it gathered, and writes it to the
    store in chunks of about :data:`_STORE_WRITE_BYTES`: runs are hashed and written a chunk
    at a time, not one Python call each (a map output into thousands of subpartitions is
    thousands of small runs)."""

    def __init__(self, target: DataStream) -> None:
        self._target = target
        self._pending = bytearray()
        self._pending_start = 0
        self._position = 0
        self.closed = False

    def write(self, data: bytes) -> int:
        self._pending += data
        self._position += len(data)
        return len(data)

    def checksums(self, runs: Iterable[tuple[int, int]]) -> list[int]:
        """The hash of each run, ``(offset, length)`` in the file, among the bytes gathered."""
        pending, start = memoryview(self._pending), self._pending_start
        try:
            return [
                xxhash.xxh3_64_intdigest(pending[offset - start : offset - start + length])
                for offset, length in runs
            ]
        finally:
            pending.release()

    def drain(self) -> None:
        """Write what is gathered to the store."""
        write_all(self._target, self._pending)
        # A new buffer, not the old one emptied: a bytearray with views cannot be resized, and
        # a sink's error that it logged or kept (a dropped replica's) holds frames with views.
        self._pending = bytearray()
        self._pending_start = self._position

    def discard(self) -> None:
        """Close without writing what is gathered (the attempt is aborted; a failed write's
        traceback may hold views of the buffer, which is let go as in :meth:`drain`)."""
        if not self.closed:
            self.closed = True
            self._pending = bytearray()
            self._target.close()

    def tell(self) -> int:
        return self._position

    def flush(self) -> None:
        """Nothing to do: what was written reaches the store by :meth:`drain` or
        :meth:`close`."""

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                if self._pending:
                    self.drain()
                self._target.flush()
            finally:
                self._target.close()


@dataclass(frozen=True, slots=True)
class _Buffered:
    """Rows a region holds, and the Arrow bytes of each subpartition's."""

    rows: OrderedRows
    sizes: npt.NDArray[np.int64]


class PartitionFileWriter:
    """Writes one partition in the on-store format. Not thread-safe: one producer task.

    Batches are buffered, grouped by subpartition, until half of ``memory_budget`` bytes; then
    that region is handed to a background spill thread, which coalesces, encodes, compresses
    and writes it while the next region fills (pyarrow releases the GIL for that work, so a
    producer and its spill use two cores). At most one region is in flight, so the writer holds
    about the budget. The commit writes the last region itself (nothing is left to overlap it
    with), so a partition that fits one region starts no thread.

    With ``codec="auto"`` the codec is chosen when the first run is written, from its first
    batch (see :mod:`shuffle_runtime.format.codec_choice`); the manifest records the choice.
    """

    def __init__(
        self,
        sink: PartitionSink,
        number_of_subpartitions: int,
        *,
        codec: str,
        memory_budget: int,
        target_batch_bytes: int = TARGET_BATCH_SIZE.default,
        auto_bandwidth: int = COMPRESSION_AUTO_BANDWIDTH.default,
    ) -> None:
        if not 1 <= number_of_subpartitions <= MAX_SUBPARTITIONS:
            raise ShuffleError(
                f"partition {sink.partition}: {number_of_subpartitions} subpartitions, outside"
                f" 1..{MAX_SUBPARTITIONS}"
            )
        self._sink = sink
        self._partition = sink.partition
        self._subpartitions = number_of_subpartitions
        if codec != AUTO:
            ipc_write_options(codec)  # an unknown codec fails here, not in the spill thread
        self._codec = codec
        self._auto_bandwidth = auto_bandwidth
        self._region_bytes = max(1, memory_budget // 2)
        self._target_batch_bytes = target_batch_bytes
        self._schema: pa.Schema | None = None
        # The producer's side: the region filling, and the spill in flight.
        self._region: list[_Buffered] = []
        self._buffered_bytes = 0
        # Started by the first spill before the commit: a partition written whole at its commit
        # (most map outputs) starts no thread.
        self._spiller: ThreadPoolExecutor | None = None
        self._spilling: Future[None] | None = None
        self._spilling_bytes = 0
        # The spill thread's side: the producer reads it only after waiting for the spill.
        self._data: _HashingSink | None = None
        self._stream: pa.BufferedOutputStream | None = None
        self._run_start = 0
        self._drained = 0
        self._ipc: pa.ipc.RecordBatchFileWriter | None = None
        self._region_bytes_written = 0  # the Arrow bytes of the region being written
        self._batches = 0
        self._regions = 0
        # Per run: its index row (INDEX_SCHEMA's columns but the checksum), and the checksums
        # of the runs written to the store so far.
        self._runs: list[tuple[int, ...]] = []
        self._checksums: list[int] = []
        # Per subpartition (then of the broadcast batches), the Arrow bytes of the batches
        # taken: the statistics weigh the rows as the producer had them, whatever the codec.
        self._arrow_bytes = np.zeros(number_of_subpartitions + 1, dtype=np.int64)

    @property
    def buffered_bytes(self) -> int:
        """Bytes of the region filling (what the next spill writes)."""
        return self._buffered_bytes

    @property
    def held_bytes(self) -> int:
        """Bytes of batches in memory: the region filling plus the one being written."""
        return self._buffered_bytes + self._spilling_bytes

    def add(self, subpartition: int, batch: pa.RecordBatch, size: int | None = None) -> None:
        """Take a batch for one subpartition (or :data:`BROADCAST`); spill past the budget.
        ``size``: its ``nbytes``, where the caller has it (pyarrow takes microseconds to
        count them, as long as the rest of this call for a small batch)."""
        if not (subpartition == BROADCAST or 0 <= subpartition < self._subpartitions):
            raise ShuffleError(
                f"subpartition {subpartition} out of range [0, {self._subpartitions})"
                f" of partition {self._partition}"
            )
        self._check_schema(batch.schema)
        if size is None:
            size = batch.nbytes
        self._arrow_bytes[subpartition] += size  # the broadcast's in the last place
        if subpartition == BROADCAST:
            self.spill()
            # Queued behind the region just handed over: the spill thread runs one task at a time.
            self._hand_over(lambda: self._write_broadcast(batch, size), size)
            return
        rows = OrderedRows(batch, subpartition, np.array([batch.num_rows], dtype=np.int64))
        self._buffer(_Buffered(rows, np.array([size], dtype=np.int64)))

    def add_ordered(self, rows: OrderedRows) -> None:
        """Take the rows of consecutive subpartitions at once; spill past the budget."""
        if not (rows.first >= 0 and rows.first + len(rows.counts) <= self._subpartitions):
            raise ShuffleError(
                f"subpartitions {rows.first}..{rows.first + len(rows.counts) - 1} out of range"
                f" [0, {self._subpartitions}) of partition {self._partition}"
            )
        if int(rows.counts.sum()) != rows.batch.num_rows:
            raise ShuffleError(
                f"{int(rows.counts.sum())} rows counted for a batch of {rows.batch.num_rows}"
            )
        self._check_schema(rows.batch.schema)
        sizes = group_nbytes(rows.batch, rows.counts)
        self._arrow_bytes[rows.first : rows.first + len(sizes)] += sizes
        if int(sizes.sum()) <= self._target_batch_bytes:
            self._buffer(_Buffered(rows, sizes))
            return
        # In parts of about the target size: the budget is looked at after each, as it is
        # after each batch taken alone.
        for part, part_sizes in rows.cut(sizes, self._target_batch_bytes):
            self._buffer(_Buffered(part, part_sizes))

    def _buffer(self, buffered: _Buffered) -> None:
        self._region.append(buffered)
        self._buffered_bytes += int(buffered.sizes.sum())
        if self._buffered_bytes >= self._region_bytes:
            self.spill()

    def spill(self) -> None:
        """Hand the buffered batches, as one region, to the spill thread (once the previous
        spill is written: one region in flight at most)."""
        if not self._buffered_bytes:
            return
        region, size = self._take_region()
        self._hand_over(lambda: self._write_region(region, size), size)

    def _take_region(self) -> tuple[list[_Buffered], int]:
        region, size = self._region, self._buffered_bytes
        self._region = []
        self._buffered_bytes = 0
        return region, size

    def _hand_over(self, task: Callable[[], None], size: int) -> None:
        self._wait_for_spill()
        if self._spiller is None:
            self._spiller = ThreadPoolExecutor(1, thread_name_prefix="pyshuffle-spill")
        self._spilling = self._spiller.submit(task)
        self._spilling_bytes = size

    def _stop_spiller(self) -> None:
        if self._spiller is not None:
            self._spiller.shutdown()

    def _wait_for_spill(self) -> None:
        """Block until the spill in flight is written; its error is raised here."""
        spilling, self._spilling = self._spilling, None
        self._spilling_bytes = 0
        if spilling is not None:
            spilling.result()

    def _check_schema(self, schema: pa.Schema) -> None:
        if self._schema is not None:
            return
        for field in schema:
            if pa.types.is_dictionary(field.type):
                raise ShuffleError(
                    f"column {field.name!r} is dictionary-encoded, which partitions do not"
                    f" store; cast it to {field.type.value_type} first"
                )
        self._schema = schema

    # --- on the spill thread (the last region: on the committing one) -----------------------

    def _write_region(self, region: list[_Buffered], size: int) -> None:
        """Each subpartition's rows as one run (or a few, see :data:`MAX_RUN_BYTES`) of
        batches of about the target size: fewer, larger IPC messages to write and to read."""
        target = self._target_batch_bytes
        self._region_bytes_written = size
        with storage_errors(self._sink.where):
            for subpartition, pieces in _pieces_by_subpartition(region):
                if len(pieces) == 1 and pieces[0][1] <= target:  # most, into many subpartitions
                    self._write_batch_run(subpartition, pieces[0][0])
                else:
                    self._write_run(subpartition, coalesce_sized(_chopped(pieces, target), target))
            self._drain()
        self._regions += 1

    def _write_broadcast(self, batch: pa.RecordBatch, size: int) -> None:
        self._region_bytes_written = size
        with storage_errors(self._sink.where):
            self._write_run(BROADCAST, [batch])
            self._drain()
        self._regions += 1

    def _drain(self) -> None:
        """Hash the runs written since the last drain and write them to the store. Once per
        region at least: a spilled region is on the store when its spill ends, so a slow
        store holds the producer back, and the writer holds its budget, not more."""
        if self._stream is None or self._data is None:
            return
        self._stream.flush()  # every byte written so far reaches the hashing sink
        hashed = len(self._checksums)
        self._checksums += self._data.checksums((run[4], run[5]) for run in self._runs[hashed:])
        self._data.drain()
        self._drained = self._data.tell()

    def _open(
        self, first_batch: pa.RecordBatch
    ) -> tuple[pa.BufferedOutputStream, pa.ipc.RecordBatchFileWriter]:
        if self._stream is not None and self._ipc is not None:
            return self._stream, self._ipc
        schema = self._schema
        assert schema is not None
        self._codec = choose_codec(
            self._codec,
            first_batch,
            self._auto_bandwidth,
            known_bytes=self._region_bytes_written,
        )
        self._data = _HashingSink(self._sink.open_data())
        self._stream = pa.BufferedOutputStream(
            pa.PythonFile(self._data, mode="w"), _STREAM_BUFFER_BYTES
        )
        self._ipc = pa.ipc.new_file(self._stream, schema, options=ipc_write_options(self._codec))
        # Forces the header and schema out now, so every run's range holds only batches.
        self._ipc.write_batch(
            pa.record_batch([pa.nulls(0, field.type) for field in schema], schema=schema)
        )
        self._run_start = self._stream.tell()
        self._batches = 1
        return self._stream, self._ipc

    def _write_run(self, subpartition: int, batches: Iterable[pa.RecordBatch]) -> None:
        """Write ``batches`` as runs of at most about :data:`MAX_RUN_BYTES` each (called
        within ``storage_errors``: once per run of thousands of small ones)."""
        pending = iter(batches)
        first = next(pending, None)
        if first is None:
            return
        stream, ipc = self._open(first)
        batches_in_run = rows_in_run = 0
        for batch in itertools.chain((first,), pending):
            ipc.write_batch(batch)
            batches_in_run += 1
            rows_in_run += batch.num_rows
            if stream.tell() - self._run_start >= MAX_RUN_BYTES:
                self._index_run(subpartition, batches_in_run, rows_in_run)
                batches_in_run = rows_in_run = 0
        if batches_in_run:
            self._index_run(subpartition, batches_in_run, rows_in_run)

    def _write_batch_run(self, subpartition: int, batch: pa.RecordBatch) -> None:
        """:meth:`_write_run` of one batch, in fewer steps (thousands a region)."""
        ipc = self._ipc if self._ipc is not None else self._open(batch)[1]
        ipc.write_batch(batch)
        self._index_run(subpartition, 1, batch.num_rows)

    def _index_run(self, subpartition: int, batches: int, rows: int) -> None:
        stream = self._stream
        assert stream is not None
        start, end = self._run_start, stream.tell()
        self._runs.append(
            (subpartition, self._regions, self._batches, batches, start, end - start, rows)
        )
        self._run_start = end
        self._batches += batches
        if end - self._drained >= _STORE_WRITE_BYTES:
            self._drain()

    # --- commit and abort ----------------------------------------------------------------------

    def commit(self) -> PartitionStatistics:
        """Write what is buffered, the index, then the manifest (the commit point)."""
        self._wait_for_spill()
        self._stop_spiller()
        region, size = self._take_region()
        if size:  # on this thread: the producer has nothing left to do meanwhile
            self._write_region(region, size)
        data_bytes = 0
        if self._ipc is not None and self._stream is not None and self._data is not None:
            with storage_errors(self._sink.where):
                self._ipc.close()
                self._stream.close()  # closes the hashing sink, which writes the rest
                data_bytes = self._data.tell()
        runs = np.array(self._runs, dtype=np.int64).reshape(len(self._runs), len(INDEX_SCHEMA) - 1)
        index_bytes = index_file(runs, np.array(self._checksums, dtype=np.uint64))
        names = INDEX_SCHEMA.names
        statistics = self._statistics(
            *(runs[:, names.index(name)] for name in ("subpartition", "rows", "length"))
        )
        manifest = PartitionManifest(
            partition=self._partition,
            number_of_subpartitions=self._subpartitions,
            codec=self._codec,
            schema=self._schema,
            statistics=statistics,
            num_regions=self._regions,
            data_bytes=data_bytes,
            index_checksum=xxhash.xxh3_64_intdigest(index_bytes),
        )
        self._sink.commit(index_bytes, manifest.to_json())
        return statistics

    def _statistics(
        self,
        subpartition: npt.NDArray[np.int64],
        rows: npt.NDArray[np.int64],
        length: npt.NDArray[np.int64],
    ) -> PartitionStatistics:
        """Rows, stored bytes and Arrow bytes per subpartition (from the runs' columns): each
        subpartition's own plus the broadcast's, which every subpartition's reader gets."""
        # The broadcast runs' totals in the last place.
        own = np.where(subpartition == BROADCAST, self._subpartitions, subpartition)
        totals = [
            np.bincount(own, weights=column, minlength=self._subpartitions + 1).astype(np.int64)
            for column in (rows, length)
        ]
        totals.append(self._arrow_bytes)
        return PartitionStatistics(*(tuple((sums[:-1] + sums[-1]).tolist()) for sums in totals))

    def abort(self) -> None:
        """Drop buffers and delete whatever reached the store."""
        self._region = []
        self._buffered_bytes = 0
        # Whatever the spill in flight did or failed to do is deleted next.
        with contextlib.suppress(Exception):
            self._wait_for_spill()
        self._stop_spiller()
        if self._data is not None:
            # The directory is removed next; a close error changes nothing.
            with contextlib.suppress(OSError, ShuffleError):
                self._data.discard()
        self._sink.abort()


def index_file(runs: npt.NDArray[np.int64], checksums: npt.NDArray[np.uint64]) -> bytes:
    """index.arrow of ``runs`` (a row per run: :data:`INDEX_SCHEMA`'s columns but the last)
    and their ``checksums``."""
    columns = [
        pc.cast(arrow_array(runs[:, position]), field.type)
        for position, field in enumerate(INDEX_SCHEMA)
        if position < len(INDEX_SCHEMA) - 1
    ]
    columns.append(arrow_array(checksums))
    index = pa.BufferOutputStream()
    with pa.ipc.new_file(index, INDEX_SCHEMA) as index_writer:
        index_writer.write_batch(pa.record_batch(columns, schema=INDEX_SCHEMA))
    written: bytes = index.getvalue().to_pybytes()
    return written


def _pieces_by_subpartition(
    region: list[_Buffered],
) -> Iterator[tuple[int, list[tuple[pa.RecordBatch, int]]]]:
    """Each subpartition with rows in ``region``, in order, and its rows: zero-copy slices
    in the order they were taken, with their Arrow bytes."""
    if len(region) == 1:  # one batch in order, the pieces already in subpartition order
        [buffered] = region
        sizes = buffered.sizes[buffered.rows.counts > 0].tolist()
        for (subpartition, piece), size in zip(buffered.rows.slices(), sizes, strict=True):
            yield subpartition, [(piece, size)]
        return
    pieces: dict[int, list[tuple[pa.RecordBatch, int]]] = {}
    for buffered in region:
        first = buffered.rows.first
        for subpartition, piece in buffered.rows.slices():
            pieces.setdefault(subpartition, []).append(
                (piece, int(buffered.sizes[subpartition - first]))
            )
    for subpartition in sorted(pieces):
        yield subpartition, pieces[subpartition]


def _chopped(
    pieces: Iterable[tuple[pa.RecordBatch, int]], target: int
) -> Iterator[tuple[pa.RecordBatch, int]]:
    """``pieces``, those larger than ``target`` cut into slices of about ``target`` bytes."""
    for piece, size in pieces:
        if size <= target or piece.num_rows <= 1:
            yield piece, size
            continue
        for part in chop(piece, target):
            yield part, size * part.num_rows // piece.num_rows
