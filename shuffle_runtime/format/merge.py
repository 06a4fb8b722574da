"""Merging committed partitions per subpartition: many map outputs' runs of each reducer become
one run of one partition, so that a reducer reads one block where it read one per map output.

The runs' bytes are copied as they are, never decoded: a run is whole IPC record batch messages
(each says its own compression), so the runs of one subpartition from every source, one after
another, are a run too. The merged partition is a partition of the on-store format (see
docs/format.md) whose data file is an Arrow IPC stream (the schema, the runs subpartition by
subpartition, the end-of-stream marker), whose index has one run per subpartition, and whose
manifest names the sources (``merged_from``): a reader reads it as any partition, and plain
pyarrow with ``pa.ipc.open_stream``.

Each source's runs are verified against their checksums before they are copied, so a merged
run's checksum never covers bytes that were corrupt at their source.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import xxhash

from shuffle_api.descriptors import SubpartitionRange
from shuffle_api.errors import ShuffleError
from shuffle_api.ids import ResultPartitionID
from shuffle_api.io import PartitionStatistics
from shuffle_runtime.format.manifest import INDEX_SCHEMA, PartitionManifest
from shuffle_runtime.format.reader import Layouts, PartitionFileReader
from shuffle_runtime.format.sink import DataStream, StoreSink, write_all
from shuffle_runtime.format.writer import index_file
from shuffle_runtime.store import Store, storage_errors

__all__ = ["MERGE_PASS_BYTES", "MergedPartition", "merge_partitions"]

MERGE_PASS_BYTES: Final = 64 << 20
"""Source bytes gathered at once: the subpartitions of a pass are read from every source,
then written; a merge holds about this much, whatever the partitions' sizes."""
_END_OF_STREAM: Final = b"\xff\xff\xff\xff\x00\x00\x00\x00"
_MIXED: Final = "mixed"


@dataclass(frozen=True, slots=True)
class MergedPartition:
    """What a merge wrote: the merged partition, the sources it holds (those with rows; a
    source of no rows is named too, it adds nothing), and its statistics."""

    partition: ResultPartitionID
    sources: tuple[ResultPartitionID, ...]
    statistics: PartitionStatistics


def merge_partitions(
    sources: Sequence[tuple[Store, ResultPartitionID]],
    target: Store,
    merged: ResultPartitionID,
    *,
    pass_bytes: int = MERGE_PASS_BYTES,
) -> MergedPartition:
    """Write ``merged`` on ``target``: for each subpartition, the runs of every source in
    ``sources``' order. The sources must be committed partitions of one schema and one
    number of subpartitions, without broadcast runs or dictionary columns; else
    :class:`ShuffleError`, and nothing is written. A corrupt or missing source fails the merge
    (``ChecksumMismatchError``, ``PartitionNotFoundError``), nothing committed."""
    if not sources:
        raise ShuffleError(f"merge of {merged}: no sources")
    readers = [PartitionFileReader(store, source, Layouts.FILES) for store, source in sources]
    count, schema = _common_shape(readers, merged)
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
    return MergedPartition(merged, manifest.merged_from, statistics)


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
    rows: list[tuple[int, ...]] = []
    checksums: list[int] = []
    if schema is None:  # no source has a row: an empty partition has no data file content
        return _index_rows(rows), np.array(checksums, dtype=np.uint64), 0
    header = schema.serialize()
    write_all(output, memoryview(header))
    offset, batches = header.size, 0
    for subpartitions in _passes(statistics, pass_bytes):
        gathered: list[list[pa.Buffer]] = [[] for _ in subpartitions]
        counted = np.zeros((len(subpartitions), 2), dtype=np.int64)  # batches, rows
        for reader in readers:
            _gather(reader, subpartitions, gathered, counted)
        for place, pieces in enumerate(gathered):
            if not pieces:
                continue
            run = b"".join(memoryview(piece) for piece in pieces)
            write_all(output, run)
            run_batches, run_rows = counted[place].tolist()
            rows.append(
                (subpartitions.start + place, 0, batches, run_batches, offset, len(run), run_rows)
            )
            checksums.append(xxhash.xxh3_64_intdigest(run))
            offset += len(run)
            batches += run_batches
    write_all(output, _END_OF_STREAM)
    return _index_rows(rows), np.array(checksums, dtype=np.uint64), offset + len(_END_OF_STREAM)


def _gather(
    reader: PartitionFileReader,
    subpartitions: SubpartitionRange,
    gathered: list[list[pa.Buffer]],
    counted: npt.NDArray[np.int64],
) -> None:
    """Add ``reader``'s runs of ``subpartitions`` (read a piece at a time, each verified) to
    ``gathered``, and their batches and rows to ``counted``, by place in the range."""
    if reader.schema is None:
        return
    for piece in reader.pieces(subpartitions):
        data = reader.fetch(piece)
        owners, lengths, rows, batches = reader.run_columns(piece)
        places = owners - subpartitions.start
        np.add.at(counted[:, 0], places, batches)
        np.add.at(counted[:, 1], places, rows)
        ends = np.cumsum(lengths)
        for place, end, length in zip(
            places.tolist(), ends.tolist(), lengths.tolist(), strict=True
        ):
            gathered[place].append(data.slice(end - length, length))


def _index_rows(rows: list[tuple[int, ...]]) -> npt.NDArray[np.int64]:
    return np.array(rows, dtype=np.int64).reshape(len(rows), len(INDEX_SCHEMA) - 1)
