"""Merging committed partitions per subpartition: many map outputs' runs of each reducer become
one run (or a few of 8 MiB) of one partition, so that a reducer reads one block where it read
one per map output.

The runs' bytes are copied as they are, never decoded: a run is whole IPC record batch messages
(each says its own compression), so the runs of one subpartition from every source, one after
another, are a run too. The merged partition is a partition of the on-store format (see
docs/format.md) whose data file is an Arrow IPC stream (the schema, the runs subpartition by
subpartition, the end-of-stream marker), whose index has a run per subpartition (cut at 8 MiB,
as the writer cuts), and whose
manifest names the sources (``merged_from``): a reader reads it as any partition, and plain
pyarrow with ``pa.ipc.open_stream``.

Each source's runs are verified against their checksums before they are copied, so a merged
run's checksum never covers bytes that were corrupt at their source.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import xxhash

from shuffle_api.descriptors import ResultPartitionDeploymentDescriptor, SubpartitionRange
from shuffle_api.errors import InvalidOperationError, ShuffleError
from shuffle_api.ids import ResultPartitionID
from shuffle_api.io import PartitionStatistics
from shuffle_runtime.format.manifest import INDEX_SCHEMA, PartitionManifest
from shuffle_runtime.format.reader import Layouts, PartitionFileReader
from shuffle_runtime.format.sink import DataStream, StoreSink, write_all
from shuffle_runtime.format.writer import MAX_RUN_BYTES, index_file
from shuffle_runtime.store import Store, storage_errors

__all__ = ["MERGE_PASS_BYTES", "MergedPartition", "check_merge_target", "merge_partitions"]

MERGE_PASS_BYTES: Final = 64 << 20
"""Source bytes gathered at once: the subpartitions of a pass are read from every source,
then written; a merge holds about this much, whatever the partitions' sizes."""
_END_OF_STREAM: Final = b"\xff\xff\xff\xff\x00\x00\x00\x00"
_MIXED: Final = "mixed"


@dataclass(frozen=True, slots=True)
class MergedPartition:
    """What a merge wrote: the merged partition, the sources it was made of (in order), its
    statistics and the bytes of its data file."""

    partition: ResultPartitionID
    sources: tuple[ResultPartitionID, ...]
    statistics: PartitionStatistics
    data_bytes: int


def check_merge_target(merged: ResultPartitionDeploymentDescriptor) -> None:
    """InvalidOperationError unless ``merged`` (what ``ShuffleEnvironment.merge_partitions``
    is to write) is a partition that is stored whole: a merge writes it at once."""
    if merged.partition_type.must_be_pipelined:
        raise InvalidOperationError(
            f"merged partition {merged.result_partition_id} must be blocking, not"
            f" {merged.partition_type.name}"
        )


def merge_partitions(
    sources: Sequence[tuple[Store, ResultPartitionID]],
    target: Store,
    merged: ResultPartitionID,
    *,
    subpartitions: int | None = None,
    pass_bytes: int = MERGE_PASS_BYTES,
) -> MergedPartition:
    """Write ``merged`` on ``target``: for each subpartition, the runs of every source in
    ``sources``' order. The sources must be committed partitions of one schema and one
    number of subpartitions (``subpartitions``, where given), without broadcast runs or
    dictionary columns; else
    :class:`ShuffleError`, and nothing is written. A corrupt or missing source fails the merge
    (``ChecksumMismatchError``, ``PartitionNotFoundError``), nothing committed."""
    if not sources:
        raise ShuffleError(f"merge of {merged}: no sources")
    readers = [PartitionFileReader(store, source, Layouts.FILES) for store, source in sources]
    count, schema = _common_shape(readers, merged)
    if subpartitions is not None and count != subpartitions:
        raise ShuffleError(
            f"merge of {merged}: sources of {count} subpartitions, not {subpartitions}"
        )
    statistics = _summed([reader.manifest.statistics for reader in readers], count)
    codecs = {reader.manifest.codec for reader in readers if reader.schema is not None}
    sink = StoreSink(target, merged)
    try:
        with storage_errors(sink.where):
            output = sink.open_data()
            try:
                runs, checksums, data_bytes = _write_runs(
                    output, readers, schema, statistics, pass_bytes
                )
            finally:
                output.close()
        index = index_file(runs, checksums)
        manifest = PartitionManifest(
            partition=merged,
            number_of_subpartitions=count,
            codec=codecs.pop() if len(codecs) == 1 else _MIXED,
            schema=schema,
            statistics=statistics,
            num_regions=1 if len(runs) else 0,
            data_bytes=data_bytes,
            index_checksum=xxhash.xxh3_64_intdigest(index),
            merged_from=tuple(source for _, source in sources),
        )
        sink.commit(index, manifest.to_json())
    except BaseException:
        sink.abort()
        raise
    return MergedPartition(merged, manifest.merged_from, statistics, data_bytes)


def _common_shape(
    readers: list[PartitionFileReader], merged: ResultPartitionID
) -> tuple[int, pa.Schema | None]:
    """The sources' number of subpartitions and schema (None where none has rows)."""
    counts = {reader.manifest.number_of_subpartitions for reader in readers}
    if len(counts) != 1:
        raise ShuffleError(f"merge of {merged}: sources of {sorted(counts)} subpartitions")
    count = counts.pop()
    schemas = [reader.schema for reader in readers if reader.schema is not None]
    schema = schemas[0] if schemas else None
    if any(not each.equals(schema) for each in schemas[1:]):
        raise ShuffleError(f"merge of {merged}: the sources' schemas differ")
    if schema is not None and any(pa.types.is_dictionary(field.type) for field in schema):
        raise ShuffleError(f"merge of {merged}: dictionary columns (each source has its own)")
    for reader in readers:
        if reader.has_broadcast_runs:
            raise ShuffleError(f"merge of {merged}: {reader.partition} has broadcast runs")
    return count, schema


def _summed(each: list[PartitionStatistics], count: int) -> PartitionStatistics:
    """The sources' statistics added up, subpartition by subpartition."""
    names = ("rows_per_subpartition", "bytes_per_subpartition", "arrow_bytes_per_subpartition")
    sums = np.zeros((len(names), count), dtype=np.int64)
    for statistics in each:
        for row, name in enumerate(names):
            column = getattr(statistics, name)
            if column:
                sums[row] += np.asarray(column, dtype=np.int64)
    return PartitionStatistics(*(tuple(row.tolist()) for row in sums))


def _passes(statistics: PartitionStatistics, pass_bytes: int) -> list[SubpartitionRange]:
    """Ranges of subpartitions of at most ``pass_bytes`` (one at least) that have rows."""
    sizes = np.asarray(statistics.bytes_per_subpartition, dtype=np.int64)
    passes: list[SubpartitionRange] = []
    start, held = 0, 0
    for subpartition, size in enumerate(sizes.tolist()):
        if held and held + size > pass_bytes:
            passes.append(SubpartitionRange(start, subpartition - 1))
            start, held = subpartition, 0
        held += size
    if len(sizes):
        passes.append(SubpartitionRange(start, len(sizes) - 1))
    return passes


@dataclass(frozen=True, slots=True)
class _SourceRuns:
    """Runs of sources, fetched and verified: each run's bytes, subpartition, rows and
    batches (arrays side by side, in the order they are to be written)."""

    views: list[bytes]
    subpartitions: npt.NDArray[np.int64]
    lengths: npt.NDArray[np.int64]
    rows: npt.NDArray[np.int64]
    batches: npt.NDArray[np.int64]

    @classmethod
    def joined(cls, parts: list[_SourceRuns]) -> _SourceRuns:
        """``parts`` one after another, then ordered by subpartition (stable: within one, in
        the parts' order)."""
        if len(parts) == 1:
            return parts[0]
        views = [view for part in parts for view in part.views]
        columns = [
            np.concatenate([getattr(part, name) for part in parts])
            for name in ("subpartitions", "lengths", "rows", "batches")
        ]
        order = np.argsort(columns[0], kind="stable")
        ordered = order.tolist()
        return cls([views[at] for at in ordered], *(column[order] for column in columns))


class _Runs:
    """The merged data file's runs as they are written: each subpartition's source runs
    gathered into runs cut after the one that takes a run past :data:`MAX_RUN_BYTES` (a run
    is what a data port sends as one frame and a reader fetches at once), each written,
    hashed and indexed when it closes. Source runs are taken in arrays, not one by one: a
    merge of small blocks takes hundreds of thousands."""

    def __init__(self, output: DataStream, offset: int) -> None:
        self._output = output
        self.offset = offset
        self._batches = 0
        self.rows: list[tuple[int, ...]] = []
        """Index rows: INDEX_SCHEMA's columns but the checksum."""
        self.checksums: list[int] = []
        self._subpartition = -1
        self._pieces: list[bytes] = []
        self._held = self._held_batches = self._held_rows = 0

    def add(self, runs: _SourceRuns) -> None:
        """Append ``runs`` (ordered by subpartition) to the runs being written."""
        subpartitions = runs.subpartitions
        starts = np.flatnonzero(subpartitions[1:] != subpartitions[:-1]) + 1
        bounds = [0, *starts.tolist(), len(subpartitions)]
        for begin, end in itertools.pairwise(bounds):
            subpartition = int(subpartitions[begin])
            if subpartition != self._subpartition:
                self.close()
                self._subpartition = subpartition
            self._add_one_subpartition(runs, begin, end)

    def _add_one_subpartition(self, runs: _SourceRuns, begin: int, end: int) -> None:
        # Where each would close the run it joins: once the run holds MAX_RUN_BYTES, the
        # next one starts another.
        held = self._held + np.cumsum(runs.lengths[begin:end])
        while begin < end:
            if self._held >= MAX_RUN_BYTES:
                self.close()
                held -= held[0] - runs.lengths[begin]
            cut = begin + min(
                int(np.searchsorted(held, MAX_RUN_BYTES, side="left")) + 1, end - begin
            )
            taken = cut - begin
            self._pieces.extend(runs.views[begin:cut])
            self._held = int(held[taken - 1])
            self._held_rows += int(runs.rows[begin:cut].sum())
            self._held_batches += int(runs.batches[begin:cut].sum())
            held = held[taken:]
            begin = cut

    def close(self) -> None:
        if not self._pieces:
            return
        run = b"".join(self._pieces)
        write_all(self._output, run)
        self.rows.append(
            (
                self._subpartition,
                0,
                self._batches,
                self._held_batches,
                self.offset,
                len(run),
                self._held_rows,
            )
        )
        self.checksums.append(xxhash.xxh3_64_intdigest(run))
        self.offset += len(run)
        self._batches += self._held_batches
        self._pieces = []
        self._held = self._held_batches = self._held_rows = 0


def _write_runs(
    output: DataStream,
    readers: list[PartitionFileReader],
    schema: pa.Schema | None,
    statistics: PartitionStatistics,
    pass_bytes: int,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint64], int]:
    """The data file: the schema, each subpartition's runs of every source, the end marker.
    Returns the index rows (INDEX_SCHEMA's columns but the checksum), the checksums and the
    bytes written."""
    if schema is None:  # no source has a row: an empty partition has no data file content
        return _index_rows([]), np.array([], dtype=np.uint64), 0
    header = schema.serialize()
    write_all(output, memoryview(header))
    runs = _Runs(output, header.size)
    for subpartitions in _passes(statistics, pass_bytes):
        if len(subpartitions) == 1:
            # Passed on as read: a subpartition larger than a pass is never held whole.
            for reader in readers:
                for fetched in _source_runs(reader, subpartitions):
                    runs.add(fetched)
        else:  # gathered first: at most a pass's bytes
            gathered = [
                fetched for reader in readers for fetched in _source_runs(reader, subpartitions)
            ]
            if gathered:
                runs.add(_SourceRuns.joined(gathered))
    runs.close()
    write_all(output, _END_OF_STREAM)
    checksums = np.array(runs.checksums, dtype=np.uint64)
    return _index_rows(runs.rows), checksums, runs.offset + len(_END_OF_STREAM)


def _source_runs(
    reader: PartitionFileReader, subpartitions: SubpartitionRange
) -> Iterator[_SourceRuns]:
    """``reader``'s runs of ``subpartitions``, a piece (runs side by side in its data file) at
    a time, each run verified."""
    if reader.schema is None:
        return
    for positions in reader.pieces(subpartitions):
        # Bytes, not a memoryview: slicing bytes copies a small run in a tenth of the time a
        # memoryview of an Arrow buffer takes to make a view of it.
        data = reader.fetch(positions).to_pybytes()
        owners, lengths, rows, batches = reader.run_columns(positions)
        ends = np.cumsum(lengths).tolist()
        views = [
            data[end - length : end] for end, length in zip(ends, lengths.tolist(), strict=True)
        ]
        yield _SourceRuns(
            views,
            owners.astype(np.int64),
            lengths.astype(np.int64),
            rows.astype(np.int64),
            batches.astype(np.int64),
        )


def _index_rows(rows: list[tuple[int, ...]]) -> npt.NDArray[np.int64]:
    return np.array(rows, dtype=np.int64).reshape(len(rows), len(INDEX_SCHEMA) - 1)
