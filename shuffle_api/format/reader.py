"""Reading a committed partition: manifest, verified index, verified runs."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import xxhash

from shuffle_api.descriptors import SubpartitionRange
from shuffle_api.errors import (
    ChecksumMismatchError,
    PartitionCorruptedError,
    PartitionNotFoundError,
    ShuffleError,
)
from shuffle_api.format.layout import partition_directory
from shuffle_api.format.manifest import DATA_FILE, INDEX_FILE, MANIFEST_FILE, PartitionManifest
from shuffle_api.ids import ResultPartitionID
from shuffle_api.io import BROADCAST
from shuffle_api.store import RangeReader, Store

__all__ = [
    "MAX_SUBPARTITIONS",
    "PartitionFileReader",
    "Run",
    "check_commit",
    "decode_run",
    "verify_checksum",
    "verify_run",
]

MAX_SUBPARTITIONS = 1 << 17
"""The most subpartitions a partition committed from elsewhere may claim: a reader's index of
runs grows with the count, whatever was written."""


@dataclass(frozen=True, slots=True)
class Run:
    """One index row: consecutive IPC batch messages of one subpartition (or broadcast)."""

    subpartition: int
    region: int
    offset: int
    length: int
    rows: int
    checksum: int


def verify_checksum(
    data: pa.Buffer, checksum: int, partition: ResultPartitionID, where: str
) -> None:
    """Raise :class:`ChecksumMismatchError` (naming ``where``) unless ``data`` hashes to
    ``checksum``."""
    if xxhash.xxh3_64_intdigest(memoryview(data)) != checksum:
        raise ChecksumMismatchError(
            f"checksum mismatch in partition {partition}, {where}", partition
        )


def verify_run(data: pa.Buffer, run: Run, partition: ResultPartitionID) -> None:
    """Raise :class:`ChecksumMismatchError` unless ``data`` is the run's bytes."""
    where = (
        f"subpartition {run.subpartition}, region {run.region}"
        f" (bytes {run.offset}..{run.offset + run.length})"
    )
    if data.size != run.length:
        raise ChecksumMismatchError(
            f"partition {partition}, {where}: {data.size} bytes where {run.length} were written",
            partition,
        )
    verify_checksum(data, run.checksum, partition, where)


def _decode_index(index_bytes: bytes, manifest: PartitionManifest) -> list[Run]:
    """The index's runs, each checked to lie in the data file and name a subpartition the
    manifest has: a reader never reads (or allocates) past what was written."""
    partition = manifest.partition
    try:
        index = pa.ipc.open_file(pa.py_buffer(index_bytes)).read_all()
        runs = [
            Run(*row)
            for row in zip(
                *(
                    index.column(name).to_pylist()
                    for name in ("subpartition", "region", "offset", "length", "rows", "checksum")
                ),
                strict=True,
            )
        ]
    except (pa.ArrowException, KeyError, ValueError, TypeError) as error:
        raise PartitionCorruptedError(
            f"index of partition {partition} does not decode: {error}", partition
        ) from error
    count, size = manifest.number_of_subpartitions, manifest.data_bytes
    for run in runs:
        if run.subpartition != BROADCAST and not 0 <= run.subpartition < count:
            raise PartitionCorruptedError(
                f"index of partition {partition} names subpartition {run.subpartition} of {count}",
                partition,
            )
        if run.offset < 0 or run.length < 0 or run.offset + run.length > size:
            raise PartitionCorruptedError(
                f"index of partition {partition}: a run at bytes {run.offset}.."
                f"{run.offset + run.length} lies outside the {size} data bytes",
                partition,
            )
    return runs


def check_commit(
    manifest: PartitionManifest,
    index_bytes: bytes,
    data_bytes: int,
    partition: ResultPartitionID,
) -> None:
    """Raise :class:`PartitionCorruptedError` unless the manifest and index describe the
    ``data_bytes`` that arrived: what a store that received a partition from elsewhere checks
    before it believes it."""
    what = f"commit of {partition}"
    if manifest.partition != partition:
        raise PartitionCorruptedError(
            f"{what} carries the manifest of {manifest.partition}", partition
        )
    if manifest.data_bytes != data_bytes:
        raise PartitionCorruptedError(
            f"{what}: the manifest describes {manifest.data_bytes} data bytes,"
            f" {data_bytes} arrived",
            partition,
        )
    count = manifest.number_of_subpartitions
    if not 1 <= count <= MAX_SUBPARTITIONS:
        raise PartitionCorruptedError(
            f"{what}: {count} subpartitions, outside 1..{MAX_SUBPARTITIONS}", partition
        )
    statistics = manifest.statistics
    if any(
        len(counts) != count
        for counts in (
            statistics.rows_per_subpartition,
            statistics.bytes_per_subpartition,
            statistics.arrow_bytes_per_subpartition,
        )
    ):
        raise PartitionCorruptedError(
            f"{what}: statistics of {len(statistics.rows_per_subpartition)} subpartitions"
            f" for {count}",
            partition,
        )
    if xxhash.xxh3_64_intdigest(index_bytes) != manifest.index_checksum:
        raise PartitionCorruptedError(f"{what}: the index is corrupt", partition)
    _decode_index(index_bytes, manifest)


def decode_run(
    data: pa.Buffer, schema: pa.Schema, partition: ResultPartitionID
) -> Iterator[pa.RecordBatch]:
    """The record batches in a run's bytes (zero-copy when uncompressed)."""
    reader = pa.ipc.MessageReader.open_stream(pa.BufferReader(data))
    while True:
        try:
            message = reader.read_next_message()
        except StopIteration:
            return
        except pa.ArrowException as error:
            raise PartitionCorruptedError(
                f"partition {partition}: a run does not decode: {error}", partition
            ) from error
        try:
            yield pa.ipc.read_record_batch(message, schema)
        except pa.ArrowException as error:
            raise PartitionCorruptedError(
                f"partition {partition}: a batch does not decode: {error}", partition
            ) from error


class PartitionFileReader:
    """A committed partition on a store. Opening reads the manifest and the index only."""

    def __init__(self, store: Store, partition: ResultPartitionID) -> None:
        self._store = store
        self._partition = partition
        directory = partition_directory(store, partition)
        self._data_path = store.child(directory, DATA_FILE)
        self._data: RangeReader | None = None
        manifest_path = store.child(directory, MANIFEST_FILE)
        try:
            self.manifest = PartitionManifest.from_json(
                store.read_bytes(manifest_path), manifest_path
            )
            index_bytes = store.read_bytes(store.child(directory, INDEX_FILE))
        except FileNotFoundError as error:
            raise PartitionNotFoundError(
                f"partition {partition} not found on {store.url}: it was never committed, was"
                " released, or its files were deleted",
                partition,
            ) from error
        if self.manifest.partition != partition:
            raise PartitionCorruptedError(
                f"manifest at {manifest_path} describes {self.manifest.partition}, not {partition}",
                partition,
            )
        if xxhash.xxh3_64_intdigest(index_bytes) != self.manifest.index_checksum:
            raise ChecksumMismatchError(f"index of partition {partition} is corrupt", partition)
        self._runs = _decode_index(index_bytes, self.manifest)
        subpartition_of_run = np.asarray([run.subpartition for run in self._runs], dtype=np.int64)
        self._broadcast = np.flatnonzero(subpartition_of_run == BROADCAST)
        order = np.argsort(subpartition_of_run, kind="stable")
        bounds = np.searchsorted(
            subpartition_of_run[order], np.arange(self.manifest.number_of_subpartitions + 1)
        )
        self._runs_by_subpartition = [
            order[bounds[s] : bounds[s + 1]] for s in range(len(bounds) - 1)
        ]

    @property
    def partition(self) -> ResultPartitionID:
        return self._partition

    @property
    def schema(self) -> pa.Schema | None:
        return self.manifest.schema

    def runs(self, subpartitions: SubpartitionRange) -> Iterator[Run]:
        """The runs a reader of these subpartitions gets, subpartition by subpartition, each in
        write order (broadcast runs included in every subpartition)."""
        if subpartitions.end >= self.manifest.number_of_subpartitions:
            raise ShuffleError(
                f"subpartitions {subpartitions.start}..{subpartitions.end} out of range: partition"
                f" {self._partition} has {self.manifest.number_of_subpartitions}"
            )
        for subpartition in subpartitions:
            own = self._runs_by_subpartition[subpartition]
            chosen = (
                np.sort(np.concatenate([own, self._broadcast])) if len(self._broadcast) else own
            )
            for position in chosen:
                yield self._runs[int(position)]

    def _ranges(self) -> RangeReader:
        try:
            if self._data is None:
                self._data = self._store.open_ranges(self._data_path)
        except FileNotFoundError as error:
            raise PartitionNotFoundError(
                f"data file of partition {self._partition} is gone from {self._store.url}",
                self._partition,
            ) from error
        return self._data

    def _check_length(self, read: int, wanted: int, offset: int) -> None:
        """Checked even where the receiver verifies: its check would come too late."""
        if read != wanted:
            raise ChecksumMismatchError(
                f"data file of partition {self._partition} on {self._store.url} is truncated:"
                f" {read} of the {wanted} bytes at {offset}",
                self._partition,
            )

    def read_run(self, run: Run, *, verify: bool = True) -> pa.Buffer:
        """A run's bytes, verified against its checksum unless the receiver verifies them."""
        data = self._ranges().read_range(run.offset, run.length)
        self._check_length(data.size, run.length, run.offset)
        if verify:
            verify_run(data, run, self._partition)
        return data

    def read_after(self, prefix: bytes, run: Run, start: int, length: int) -> bytes:
        """``prefix`` and bytes ``start .. start + length`` of a run, unverified, as one new
        ``bytes``: a message to send, framing first, with no copy after the read."""
        offset = run.offset + start
        message = self._ranges().read_after(prefix, offset, length)
        self._check_length(len(message) - len(prefix), length, offset)
        return message

    def check_data_file(self) -> None:
        """Open the data file, and raise ChecksumMismatchError if it is shorter than the
        manifest says (a sender checks before it starts: once a run is under way, it can only
        hang up)."""
        wanted = self.manifest.data_bytes
        if wanted:  # an empty partition may have no data file
            self._check_length(min(self._ranges().size(), wanted), wanted, 0)

    def send_run(
        self,
        sock: socket.socket,
        header: bytes,
        run: Run,
        *,
        piece_size: int,
        sent: Callable[[int], None],
    ) -> None:
        """``header``, then the run's bytes, unverified (the receiver verifies), to ``sock``, in
        pieces of at most ``piece_size`` bytes, calling ``sent`` with each piece's size: from
        the page cache, never through this process, where the store is a local file."""
        sock.sendall(header)
        ranges = self._ranges()
        for start in range(0, run.length, piece_size):
            length = min(piece_size, run.length - start)
            offset = run.offset + start
            self._check_length(ranges.send_range(sock, offset, length), length, offset)
            sent(length)

    def read(self, subpartitions: SubpartitionRange) -> Iterator[pa.RecordBatch]:
        """Every batch of these subpartitions."""
        schema = self.manifest.schema
        if schema is None:
            return
        for run in self.runs(subpartitions):
            yield from decode_run(self.read_run(run), schema, self._partition)
