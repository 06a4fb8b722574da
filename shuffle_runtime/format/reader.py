"""Reading a committed partition: manifest, verified index, verified runs."""

from __future__ import annotations

import collections
import enum
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import xxhash

from shuffle_api.descriptors import SubpartitionRange
from shuffle_api.errors import (
    ChecksumMismatchError,
    PartitionCorruptedError,
    PartitionNotFoundError,
    ShuffleError,
)
from shuffle_api.ids import ResultPartitionID
from shuffle_api.io import BROADCAST
from shuffle_runtime.format.host_copies import host_copies
from shuffle_runtime.format.layout import partition_directory
from shuffle_runtime.format.manifest import (
    DATA_FILE,
    INDEX_FILE,
    MANIFEST_FILE,
    MAX_SUBPARTITIONS,
    PartitionManifest,
    without_sources,
)
from shuffle_runtime.ndarrays import numpy_values
from shuffle_runtime.store import RangeReader, Sender, Store

__all__ = [
    "MAX_SUBPARTITIONS",
    "Layouts",
    "PartitionFileReader",
    "Run",
    "check_commit",
    "decode_run",
    "is_committed",
    "is_readable",
    "verify_checksum",
    "verify_run",
]


@dataclass(frozen=True, slots=True)
class Run:
    """One index row: consecutive IPC batch messages of one subpartition (or broadcast)."""

    subpartition: int
    region: int
    offset: int
    length: int
    rows: int
    checksum: int
    batches: int = 1


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


@dataclass(frozen=True, slots=True)
class RunIndex:
    """A partition's index as columns (numpy; zero-copy views of the index file's buffers),
    with where each subpartition's runs are: no Python object per run until one is read."""

    subpartition: npt.NDArray[np.int32]
    region: npt.NDArray[np.int32]
    batches: npt.NDArray[np.int32]
    offset: npt.NDArray[np.int64]
    length: npt.NDArray[np.int64]
    rows: npt.NDArray[np.int64]
    checksum: npt.NDArray[np.uint64]
    order: npt.NDArray[np.int64] | None
    """Positions of the non-broadcast runs by subpartition (stable); ``None`` where the
    index lists them so already (one region, no broadcast: the common case)."""
    sorted_subpartitions: npt.NDArray[np.int32]
    """``subpartition`` in ``order``."""
    bounds: npt.NDArray[np.int64]
    """Where each subpartition's runs start in ``sorted_subpartitions`` (and, last, where
    they end): a reader of one finds its runs by two lookups, not two searches."""
    broadcast: npt.NDArray[np.int64]
    file_bytes: int
    """The index file's size (its buffers hold the columns)."""

    @property
    def copied_bytes(self) -> int:
        """What it holds beyond the index file's buffers."""
        if self.order is None:
            return int(self.bounds.nbytes)
        return int(
            self.order.nbytes
            + self.sorted_subpartitions.nbytes
            + self.broadcast.nbytes
            + self.bounds.nbytes
        )

    def positions(self, subpartitions: SubpartitionRange) -> npt.NDArray[np.int64]:
        """The runs a reader of ``subpartitions`` gets, subpartition by subpartition, each in
        write order (broadcast runs included in every subpartition)."""
        sorted_subpartitions = self.sorted_subpartitions
        start = int(self.bounds[subpartitions.start])
        stop = int(self.bounds[subpartitions.end + 1])
        own = (
            np.arange(start, stop, dtype=np.int64) if self.order is None else self.order[start:stop]
        )
        if not len(self.broadcast):
            return own
        # Each subpartition's own runs and every broadcast run, in write order.
        in_range = sorted_subpartitions[start:stop]
        return np.concatenate(
            [np.sort(np.concatenate([own[in_range == s], self.broadcast])) for s in subpartitions]
        )

    def only_position(self, subpartitions: SubpartitionRange) -> int | None:
        """The one run a reader of ``subpartitions`` gets, where it gets one (of one
        subpartition, no broadcast runs): :meth:`positions` in fewer steps."""
        if subpartitions.start != subpartitions.end or len(self.broadcast):
            return None
        start = self.bounds.item(subpartitions.start)
        if self.bounds.item(subpartitions.start + 1) - start != 1:
            return None
        return int(start if self.order is None else self.order.item(start))

    def run(self, position: int) -> Run:
        return Run(
            int(self.subpartition[position]),
            int(self.region[position]),
            int(self.offset[position]),
            int(self.length[position]),
            int(self.rows[position]),
            int(self.checksum[position]),
            int(self.batches[position]),
        )


_INDEX_COLUMNS: Final = (
    "subpartition",
    "region",
    "num_batches",
    "offset",
    "length",
    "rows",
    "checksum",
)
_INDEX_TYPES: Final = (np.int32, np.int32, np.int32, np.int64, np.int64, np.int64, np.uint64)


def _index_column(column: pa.Array, kind: npt.DTypeLike) -> npt.NDArray[Any]:
    if column.null_count:
        raise ValueError(f"a null in index column of {column.type}")
    return numpy_values(column).astype(kind, copy=False)


def _decode_index(index: pa.Buffer | bytes, manifest: PartitionManifest) -> RunIndex:
    """The index's runs, each checked to lie in the data file and name a subpartition the
    manifest has: a reader never reads (or allocates) past what was written."""
    partition = manifest.partition
    try:
        table = pa.ipc.open_file(pa.py_buffer(index)).read_all().combine_chunks()
        columns = [
            _index_column(table.column(name).combine_chunks(), kind)
            for name, kind in zip(_INDEX_COLUMNS, _INDEX_TYPES, strict=True)
        ]
    except (pa.ArrowException, KeyError, ValueError, TypeError) as error:
        raise PartitionCorruptedError(
            f"index of partition {partition} does not decode: {error}", partition
        ) from error
    subpartition, region, batches, offset, length, rows, checksum = columns
    count, size = manifest.number_of_subpartitions, manifest.data_bytes
    if not 1 <= count <= MAX_SUBPARTITIONS:
        raise PartitionCorruptedError(
            f"manifest of partition {partition} claims {count} subpartitions, outside"
            f" 1..{MAX_SUBPARTITIONS}",
            partition,
        )
    broadcast = subpartition == BROADCAST
    outside = ~broadcast & ((subpartition < 0) | (subpartition >= count))
    if outside.any():
        raise PartitionCorruptedError(
            f"index of partition {partition} names subpartition"
            f" {int(subpartition[outside][0])} of {count}",
            partition,
        )
    beyond = (offset < 0) | (length < 0) | (offset + length > size)
    if beyond.any():
        first = int(np.flatnonzero(beyond)[0])
        raise PartitionCorruptedError(
            f"index of partition {partition}: a run at bytes {int(offset[first])}.."
            f"{int(offset[first] + length[first])} lies outside the {size} data bytes",
            partition,
        )
    broadcast_positions = np.flatnonzero(broadcast)
    in_order = not len(broadcast_positions) and bool(np.all(subpartition[1:] >= subpartition[:-1]))
    order = None
    sorted_subpartitions = subpartition
    if not in_order:
        own = np.flatnonzero(~broadcast)
        order = own[np.argsort(subpartition[own], kind="stable")]
        sorted_subpartitions = subpartition[order]
    return RunIndex(
        subpartition,
        region,
        batches,
        offset,
        length,
        rows,
        checksum,
        order,
        sorted_subpartitions,
        np.searchsorted(sorted_subpartitions, np.arange(count + 1)).astype(np.int64),
        broadcast_positions,
        len(memoryview(index)),
    )


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
    """The record batches in a run's bytes (zero-copy when uncompressed, but for a run of
    many small batches: see :func:`decode_streamed`)."""
    # Message after message to the run's end: half the cost of a MessageReader, which a
    # reducer of many map outputs pays for a block of a few rows each.
    stream = pa.BufferReader(data)
    size = data.size
    while (start := stream.tell()) < size:
        try:
            message = pa.ipc.read_message(stream)
            if stream.tell() <= start:
                raise EOFError("a message of no bytes")
        except (pa.ArrowException, OSError, EOFError) as error:
            raise PartitionCorruptedError(
                f"partition {partition}: a run does not decode: {error}", partition
            ) from error
        if not start and stream.tell() * _STREAMED_BATCHES <= size:
            # A first message this small for its run: a run of many (a merged one, as a
            # reducer fetches it from a worker that does not say how many it holds).
            yield from decode_streamed(data, schema, partition)
            return
        try:
            yield pa.ipc.read_record_batch(message, schema)
        except pa.ArrowException as error:
            raise PartitionCorruptedError(
                f"partition {partition}: a batch does not decode: {error}", partition
            ) from error


_STREAMED_BATCHES: Final = 16
"""A run of this many batches or more (a merged run) is decoded by Arrow's stream reader, in
one call: about 1.0 us a batch against 1.8 us message by message (1,000 batches of two rows),
for a copy of the run behind the schema's message."""


def decode_streamed(
    data: pa.Buffer, schema: pa.Schema, partition: ResultPartitionID
) -> list[pa.RecordBatch]:
    """:func:`decode_run` of a run of many batches, in one call of Arrow's stream reader, as
    one batch: a reducer takes a merged run of 4,000 blocks of 4 rows in 8.7 ms, where its
    4,000 batches, coalesced one by one, took 29-34 ms (a run is at most about 16 MiB)."""
    header = schema.serialize()
    try:
        stream = pa.py_buffer(b"".join((memoryview(header), memoryview(data))))
        table = pa.ipc.open_stream(stream).read_all()
    except (pa.ArrowException, OSError) as error:  # a run cut short is an OSError
        raise PartitionCorruptedError(
            f"partition {partition}: a run does not decode: {error}", partition
        ) from error
    batches: list[pa.RecordBatch] = table.combine_chunks().to_batches()
    return batches


# Reads of neighbouring runs are joined up to this size: larger ones are read run by run.
_MAX_RANGE_BYTES: Final = 8 << 20
# A run sent to a socket is copied through the sender up to this size, sent from the page cache
# above it.
_COPIED_RUN_BYTES: Final = 64 << 10


@dataclass(frozen=True, slots=True)
class _Layout:
    """What a reader learns before it opens the data file, and the bytes it learnt it from."""

    manifest: PartitionManifest
    index: RunIndex
    manifest_bytes: bytes
    index_bytes: pa.Buffer | bytes
    data_path: str
    manifest_to_send: bytes


def _read_files(
    store: Store, partition: ResultPartitionID, *, map_index: bool
) -> tuple[bytes, pa.Buffer | bytes]:
    """The manifest's bytes and the index's (memory-mapped where ``map_index`` and the store
    maps files, else read)."""
    directory = partition_directory(store, partition)
    index_path = store.child(directory, INDEX_FILE)
    try:
        manifest_bytes = store.read_bytes(store.child(directory, MANIFEST_FILE))
        index_bytes = store.map_bytes(index_path) if map_index else store.read_bytes(index_path)
    except FileNotFoundError as error:
        raise PartitionNotFoundError(
            f"partition {partition} not found on {store.url}: it was never committed, was"
            " released, or its files were deleted",
            partition,
        ) from error
    return manifest_bytes, index_bytes


def _decode_layout(
    store: Store,
    partition: ResultPartitionID,
    files: tuple[bytes, pa.Buffer | bytes],
    *,
    statistics: bool,
) -> _Layout:
    manifest_bytes, index_bytes = files
    directory = partition_directory(store, partition)
    manifest_path = store.child(directory, MANIFEST_FILE)
    manifest = PartitionManifest.from_json(
        manifest_bytes, manifest_path, partition, statistics=statistics
    )
    if manifest.partition != partition:
        raise PartitionCorruptedError(
            f"manifest at {manifest_path} describes {manifest.partition}, not {partition}",
            partition,
        )
    if xxhash.xxh3_64_intdigest(memoryview(index_bytes)) != manifest.index_checksum:
        raise ChecksumMismatchError(f"index of partition {partition} is corrupt", partition)
    index = _decode_index(index_bytes, manifest)
    return _Layout(
        manifest,
        index,
        manifest_bytes,
        index_bytes,
        store.child(directory, DATA_FILE),
        manifest_bytes if not manifest.merged_from else without_sources(manifest_bytes),
    )


class Layouts(enum.Enum):
    """Where a reader takes a partition's layout (its manifest and index) from."""

    FILES = enum.auto()
    """Read and decoded for this reader, statistics included."""
    MAPPED = enum.auto()
    """The process's cache, index files memory-mapped from a local store: for readers in
    tasks, which need no statistics. A partition's files are taken never to change once
    committed (a released one's data file is gone, which its next read finds)."""
    READ = enum.auto()
    """The process's cache, index files read: for long-lived servers, which a file
    truncated under a mapping would kill. They ``forget`` what they delete or commit."""
    CHECKED = enum.auto()
    """The process's cache while the manifest and index files still hold the bytes it was
    decoded from (read again each time: small files, and much less work than decoding
    them), for a reader that must see files changed or corrupted under it."""


class _LayoutCache:
    """Per process, the layouts of partitions read lately: a reader of many partitions (one
    reducer after another in a Python worker, a data port's blocking views, the external
    worker's fetches) decodes each manifest and index once. Bounded by entries and by the
    bytes they hold beyond index files mapped from a local store."""

    def __init__(self, max_entries: int, max_bytes: int, layouts: Layouts) -> None:
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._checked = layouts is Layouts.CHECKED
        self._map_index = layouts is Layouts.MAPPED
        self._layouts: collections.OrderedDict[
            tuple[str, ResultPartitionID], tuple[_Layout, int]
        ] = collections.OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, store: Store, partition: ResultPartitionID) -> _Layout:
        key = (store.url, partition)
        with self._lock:
            found = self._layouts.get(key)
            if found is not None and not self._checked:
                self._layouts.move_to_end(key)
                return found[0]
        if self._checked:
            files = _read_files(store, partition, map_index=False)
            if found is not None and files == (found[0].manifest_bytes, found[0].index_bytes):
                return self._touch(key, found[0])
            layout = _decode_layout(store, partition, files, statistics=False)
        else:
            layout = self._layout(store, partition)
        cost = _ENTRY_BYTES + layout.index.copied_bytes + len(layout.manifest_bytes)
        if layout.manifest_to_send is not layout.manifest_bytes:
            cost += len(layout.manifest_to_send)
        if not (self._map_index and store.maps_files):
            cost += layout.index.file_bytes
        with self._lock:
            replaced = self._layouts.pop(key, None)
            if replaced is not None:
                self._bytes -= replaced[1]
            self._layouts[key] = (layout, cost)
            self._bytes += cost
            while len(self._layouts) > 1 and (
                len(self._layouts) > self._max_entries or self._bytes > self._max_bytes
            ):
                _, (_, evicted_cost) = self._layouts.popitem(last=False)
                self._bytes -= evicted_cost
        return layout

    def _layout(self, store: Store, partition: ResultPartitionID) -> _Layout:
        """Read and decoded: from the host's copy where the store is shared (see
        ``host_copies``), one that does not decode fetched again."""
        copies = host_copies() if store.is_shared else None
        if copies is None:
            files = _read_files(store, partition, map_index=self._map_index)
            return _decode_layout(store, partition, files, statistics=False)

        def fetch() -> tuple[bytes, bytes]:
            manifest, index = _read_files(store, partition, map_index=False)
            return manifest, bytes(index)

        try:
            return _decode_layout(
                store, partition, copies.read(store.url, partition, fetch), statistics=False
            )
        except PartitionCorruptedError:
            copies.discard(store.url, partition)
        return _decode_layout(
            store, partition, copies.read(store.url, partition, fetch), statistics=False
        )

    def _touch(self, key: tuple[str, ResultPartitionID], layout: _Layout) -> _Layout:
        with self._lock:
            if key in self._layouts:
                self._layouts.move_to_end(key)
        return layout

    def forget(self, store: Store, partition: ResultPartitionID) -> None:
        with self._lock:
            dropped = self._layouts.pop((store.url, partition), None)
            if dropped is not None:
                self._bytes -= dropped[1]


# A layout's Python objects (manifest, schema, arrays): about this much beside its arrays.
_ENTRY_BYTES: Final = 4096
_CACHES: Final = {
    layouts: _LayoutCache(max_entries=16_384, max_bytes=64 << 20, layouts=layouts)
    for layouts in (Layouts.MAPPED, Layouts.READ, Layouts.CHECKED)
}


class PartitionFileReader:
    """A committed partition on a store. Opening reads the manifest and the index only, or
    takes them from a cache of the process (see ``Layouts``: cached manifests carry no
    statistics)."""

    def __init__(
        self, store: Store, partition: ResultPartitionID, layouts: Layouts = Layouts.FILES
    ) -> None:
        self._store = store
        self._partition = partition
        self._data: RangeReader | None = None
        if layouts is Layouts.FILES:
            files = _read_files(store, partition, map_index=True)
            layout = _decode_layout(store, partition, files, statistics=True)
        else:
            layout = _CACHES[layouts].get(store, partition)
        self._data_path = layout.data_path
        self.manifest = layout.manifest
        self.manifest_bytes = layout.manifest_bytes
        """The manifest file as read (statistics included)."""
        self.manifest_to_send = layout.manifest_to_send
        """The manifest a remote reader of its rows gets: the file's, but a merged partition's
        without its sources (see ``without_sources``)."""
        self._index = layout.index

    @staticmethod
    def forget(store: Store, partition: ResultPartitionID) -> None:
        """Drop the cached layouts of a partition whose files are being deleted or written
        anew (servers' ``READ`` layouts never look at the files again)."""
        for cache in _CACHES.values():
            cache.forget(store, partition)

    @property
    def partition(self) -> ResultPartitionID:
        return self._partition

    @property
    def schema(self) -> pa.Schema | None:
        return self.manifest.schema

    @property
    def has_broadcast_runs(self) -> bool:
        """Whether some runs belong to every subpartition."""
        return bool(len(self._index.broadcast))

    def _check_range(self, subpartitions: SubpartitionRange) -> None:
        if subpartitions.end >= self.manifest.number_of_subpartitions:
            raise ShuffleError(
                f"subpartitions {subpartitions.start}..{subpartitions.end} out of range: partition"
                f" {self._partition} has {self.manifest.number_of_subpartitions}"
            )

    def _positions(self, subpartitions: SubpartitionRange) -> npt.NDArray[np.int64]:
        self._check_range(subpartitions)
        return self._index.positions(subpartitions)

    def runs(self, subpartitions: SubpartitionRange) -> Iterator[Run]:
        """The runs a reader of these subpartitions gets, subpartition by subpartition, each in
        write order (broadcast runs included in every subpartition)."""
        for position in self._positions(subpartitions).tolist():
            yield self._index.run(position)

    def _ranges(self) -> RangeReader:
        try:
            if self._data is None:
                self._data = self._store.open_ranges(self._data_path)
        except FileNotFoundError as error:
            raise self._gone() from error
        return self._data

    def _gone(self) -> PartitionNotFoundError:
        return PartitionNotFoundError(
            f"data file of partition {self._partition} is gone from {self._store.url}",
            self._partition,
        )

    def _read_range(self, offset: int, length: int) -> pa.Buffer:
        """Bytes of the data file, which an object store finds missing only when read."""
        try:
            data = self._ranges().read_range(offset, length)
        except FileNotFoundError as error:
            raise self._gone() from error
        self._check_length(data.size, length, offset)
        return data

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
        data = self._read_range(run.offset, run.length)
        if verify:
            verify_run(data, run, self._partition)
        return data

    def read_after(self, prefix: bytes, run: Run, start: int, length: int) -> bytes:
        """``prefix`` and bytes ``start .. start + length`` of a run, unverified, as one new
        ``bytes``: a message to send, framing first, with no copy after the read."""
        offset = run.offset + start
        try:
            message = self._ranges().read_after(prefix, offset, length)
        except FileNotFoundError as error:
            raise self._gone() from error
        self._check_length(len(message) - len(prefix), length, offset)
        return message

    def check_data_file(self) -> None:
        """Open the data file, and raise ChecksumMismatchError if it is shorter than the
        manifest says (a sender checks before it starts: once a run is under way, it can only
        hang up)."""
        wanted = self.manifest.data_bytes
        if wanted:  # an empty partition may have no data file
            try:
                size = self._ranges().size()
            except FileNotFoundError as error:
                raise self._gone() from error
            self._check_length(min(size, wanted), wanted, 0)

    def send_run(
        self,
        sock: Sender,
        header: bytes,
        run: Run,
        *,
        piece_size: int,
        sent: Callable[[int], None],
    ) -> None:
        """``header``, then the run's bytes, unverified (the receiver verifies), to ``sock``, in
        pieces of at most ``piece_size`` bytes, calling ``sent`` with each piece's size: from
        the page cache, never through this process, where the store is a local file; a small
        run is read and sent with its header in one call."""
        if run.length <= _COPIED_RUN_BYTES:
            # Cheaper than sendfile's calls (a reducer's block of a map output is mostly small).
            sock.sendall(self.read_after(header, run, 0, run.length))
            sent(run.length)
            return
        ranges = self._ranges()
        sock.sendall(header)
        try:
            for start in range(0, run.length, piece_size):
                length = min(piece_size, run.length - start)
                offset = run.offset + start
                self._check_length(ranges.send_range(sock, offset, length), length, offset)
                sent(length)
        except FileNotFoundError as error:  # an object store's data file, found gone on read
            raise self._gone() from error

    def read(self, subpartitions: SubpartitionRange) -> Iterable[pa.RecordBatch]:
        """Every batch of these subpartitions. Runs that lie side by side in the data file
        are read as one range (up to 8 MiB), each verified, and decoded in one pass."""
        schema = self.manifest.schema
        if schema is None:
            return ()
        self._check_range(subpartitions)
        position = self._index.only_position(subpartitions)
        if position is not None:  # a reducer's one run of a map output, mostly: fewest steps
            return self._read_run_at(position, schema)
        return self._read_pieces(subpartitions)

    def _read_pieces(self, subpartitions: SubpartitionRange) -> Iterator[pa.RecordBatch]:
        for piece in self.pieces(subpartitions):
            yield from self.decode(self.fetch(piece))

    def _read_run_at(self, position: int, schema: pa.Schema) -> Iterable[pa.RecordBatch]:
        """The batches of the run at ``position``, read and verified."""
        index = self._index
        data = self.fetch([position])
        if index.batches.item(position) == 1:
            try:
                batch = pa.ipc.read_record_batch(data, schema)
            except pa.ArrowException as error:
                raise PartitionCorruptedError(
                    f"partition {self._partition}: a batch does not decode: {error}",
                    self._partition,
                ) from error
            if batch.num_rows == index.rows.item(position):
                return (batch,)
        elif index.batches.item(position) >= _STREAMED_BATCHES:
            return decode_streamed(data, schema, self._partition)
        return list(self.decode(data))  # more than one message (or the index says so)

    def pieces(self, subpartitions: SubpartitionRange) -> Iterator[list[int]]:
        """The positions of the runs of these subpartitions, in groups that lie side by side
        in the data file, each read as one range of at most 8 MiB (or one run)."""
        if self.manifest.schema is None:
            return
        index = self._index
        positions = self._positions(subpartitions)
        if len(positions) <= 1:  # a reducer's one run of a map output, mostly
            if len(positions):
                yield positions.tolist()
            return
        offsets, lengths = index.offset[positions], index.length[positions]
        starts = np.flatnonzero(offsets[1:] != offsets[:-1] + lengths[:-1]) + 1
        for group in np.split(np.arange(len(positions)), starts):
            begin = 0
            while begin < len(group):
                # Runs from ``begin`` while they stay within the range limit (one at least).
                ends = offsets[group[begin:]] + lengths[group[begin:]] - offsets[group[begin]]
                end = begin + max(1, int(np.searchsorted(ends, _MAX_RANGE_BYTES, side="right")))
                yield positions[group[begin:end]].tolist()
                begin = end

    def run_columns(
        self, positions: list[int]
    ) -> tuple[
        npt.NDArray[np.int32], npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int32]
    ]:
        """The subpartition, length, rows and batches of the runs at ``positions``."""
        index = self._index
        return (
            index.subpartition[positions],
            index.length[positions],
            index.rows[positions],
            index.batches[positions],
        )

    def piece_bytes(self, positions: list[int]) -> int:
        """Bytes :meth:`fetch` reads for a piece."""
        return int(self._index.length[positions].sum())

    def decode(self, data: pa.Buffer) -> Iterator[pa.RecordBatch]:
        """The batches of a fetched piece."""
        schema = self.manifest.schema
        assert schema is not None  # a partition without one has no pieces
        return decode_run(data, schema, self._partition)

    def fetch(self, positions: list[int]) -> pa.Buffer:
        """A piece: runs at ``positions``, which lie one after another in the data file,
        read as one range and verified."""
        index = self._index
        first, last = positions[0], positions[-1]
        offset = index.offset.item(first)
        length = index.offset.item(last) + index.length.item(last) - offset
        data = self._read_range(offset, length)
        if first == last:
            if xxhash.xxh3_64_intdigest(memoryview(data)) != index.checksum.item(first):
                verify_run(data, index.run(first), self._partition)  # names the run
            return data
        view = memoryview(data)
        start = 0
        for position, size, checksum in zip(
            positions,
            index.length[positions].tolist(),
            index.checksum[positions].tolist(),
            strict=True,
        ):
            if xxhash.xxh3_64_intdigest(view[start : start + size]) != checksum:
                piece = data.slice(start, size)
                verify_run(piece, index.run(position), self._partition)  # names the run
            start += size
        return data


def is_committed(store: Store, partition: ResultPartitionID) -> bool:
    """Whether the partition is committed on ``store``: on a local disk, :func:`is_readable`;
    on an object store, where each file read is a request, whether its manifest (the commit
    point) is there: one request (a HEAD), not two GETs, a partition. A stage's check of
    thousands of map outputs takes this; a file damaged behind it fails the read that meets
    it, typed."""
    if store.is_local:
        return is_readable(store, partition)
    return store.exists(store.child(partition_directory(store, partition), MANIFEST_FILE))


def is_readable(store: Store, partition: ResultPartitionID) -> bool:
    """Whether the partition's committed files are on the store and decode: its layout as
    readers of its data check it, nothing per subpartition decoded (as statistics would be)."""
    try:
        PartitionFileReader(store, partition, Layouts.CHECKED)
    except (PartitionNotFoundError, PartitionCorruptedError):
        return False
    return True
