"""The on-store partition format: writer, reader, manifest, index, store, failure modes."""

from __future__ import annotations

import base64
import errno
import io
import json
import os
import random
import socket
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import zstandard

from shuffle_api import (
    BROADCAST,
    ChecksumMismatchError,
    IntermediateResultPartitionID,
    InvalidIdentifierError,
    PartitionCorruptedError,
    PartitionNotFoundError,
    PartitionStatistics,
    ResultPartitionID,
    ShuffleError,
    StorageError,
    SubpartitionRange,
    UnsupportedFormatVersionError,
)
from shuffle_runtime.format import (
    Layouts,
    PartitionFileReader,
    PartitionFileWriter,
    StoreSink,
    partition_directory,
    result_directories,
    stored_partitions,
)
from shuffle_runtime.format.manifest import (
    DATA_FILE,
    INDEX_FILE,
    INDEX_SCHEMA,
    MANIFEST_FILE,
    MAX_SUBPARTITIONS,
    NO_STATISTICS,
    PartitionManifest,
)
from shuffle_runtime.format.reader import Run
from shuffle_runtime.store import Store

SCHEMA = pa.schema([("key", pa.int64()), ("text", pa.string())])


@pytest.fixture(params=["local", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A real store: a local tmp_path directory, or a memory:// path unique to the test."""
    if request.param == "local":
        yield Store(str(tmp_path / "store"))
        return
    memory = Store(f"memory://pyshuffle-unit-{uuid.uuid4().hex}")
    yield memory
    memory.delete_tree(memory.path())


@pytest.fixture
def local_store(tmp_path: Path) -> Store:
    return Store(str(tmp_path / "store"))


@pytest.fixture
def partition() -> ResultPartitionID:
    return ResultPartitionID(IntermediateResultPartitionID("result-1", 3), uuid.uuid4().hex)


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


def files_under(store: Store, path: str) -> list[str]:
    if not store.exists(path):
        return []
    return [str(name) for name in store.filesystem.find(path)]


SPREAD_WRITES = [
    (0, make_batch(0, 10)),
    (1, make_batch(100, 5)),
    (2, make_batch(200, 7)),
    (0, make_batch(10, 3)),
    (2, make_batch(207, 1)),
]


# --- round trips ---------------------------------------------------------------------------


@pytest.mark.parametrize("codec", ["none", "lz4", "zstd"])
def test_round_trip_per_codec_returns_each_subpartition_in_write_order(
    store: Store, partition: ResultPartitionID, codec: str
) -> None:
    write_partition(store, partition, SPREAD_WRITES, codec=codec)

    reader = PartitionFileReader(store, partition)

    assert reader.manifest.codec == codec
    assert reader.schema is not None and reader.schema.equals(SCHEMA)
    for subpartition in range(3):
        batches = list(reader.read(SubpartitionRange.single(subpartition)))
        assert all(batch.schema.equals(SCHEMA) for batch in batches)
        assert keys_of(batches) == expected_keys(SPREAD_WRITES, subpartition)
        assert [t for b in batches for t in b.column("text").to_pylist()] == [
            f"row-{k}" for k in expected_keys(SPREAD_WRITES, subpartition)
        ]


def test_reading_a_range_returns_subpartition_after_subpartition(
    store: Store, partition: ResultPartitionID
) -> None:
    write_partition(store, partition, SPREAD_WRITES)

    reader = PartitionFileReader(store, partition)

    assert keys_of(reader.read(SubpartitionRange(0, 2))) == (
        expected_keys(SPREAD_WRITES, 0)
        + expected_keys(SPREAD_WRITES, 1)
        + expected_keys(SPREAD_WRITES, 2)
    )
    assert keys_of(reader.read(SubpartitionRange(1, 2))) == (
        expected_keys(SPREAD_WRITES, 1) + expected_keys(SPREAD_WRITES, 2)
    )


def test_partition_is_reconsumable(store: Store, partition: ResultPartitionID) -> None:
    write_partition(store, partition, SPREAD_WRITES)

    first = read_keys(PartitionFileReader(store, partition), 0)
    reader = PartitionFileReader(store, partition)
    second = read_keys(reader, 0)
    third = read_keys(reader, 0)

    assert first == second == third == expected_keys(SPREAD_WRITES, 0)


def test_reading_past_the_last_subpartition_raises_shuffle_error(
    store: Store, partition: ResultPartitionID
) -> None:
    write_partition(store, partition, SPREAD_WRITES, subpartitions=3)

    reader = PartitionFileReader(store, partition)

    with pytest.raises(ShuffleError, match="out of range"):
        list(reader.read(SubpartitionRange(2, 3)))


def test_committed_partition_has_data_index_and_manifest(
    store: Store, partition: ResultPartitionID
) -> None:
    write_partition(store, partition, SPREAD_WRITES)

    names = sorted(
        path.rsplit("/", 1)[-1]
        for path in files_under(store, partition_directory(store, partition))
    )

    assert names == sorted([DATA_FILE, INDEX_FILE, MANIFEST_FILE])


# --- spilling and broadcast ----------------------------------------------------------------


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_tiny_memory_budget_spills_several_regions_that_read_back_in_write_order(
    store: Store, partition: ResultPartitionID, codec: str
) -> None:
    writes = [(i % 4, make_batch(i * 1000, 20 + i)) for i in range(24)]

    writer = write_partition(
        store, partition, writes, subpartitions=4, codec=codec, memory_budget=1
    )

    assert writer.buffered_bytes == 0
    reader = PartitionFileReader(store, partition)
    assert reader.manifest.num_regions > 1
    for subpartition in range(4):
        assert read_keys(reader, subpartition) == expected_keys(writes, subpartition)


def test_moderate_memory_budget_groups_several_batches_per_region(
    store: Store, partition: ResultPartitionID
) -> None:
    writes = [(i % 3, make_batch(i * 100, 50)) for i in range(30)]
    budget = 4 * writes[0][1].nbytes

    write_partition(store, partition, writes, memory_budget=budget)

    reader = PartitionFileReader(store, partition)
    assert 1 < reader.manifest.num_regions < len(writes)
    for subpartition in range(3):
        assert read_keys(reader, subpartition) == expected_keys(writes, subpartition)


def test_broadcast_rows_appear_in_every_subpartition_in_interleaved_write_order(
    store: Store, partition: ResultPartitionID
) -> None:
    writes = [
        (0, make_batch(0, 2)),
        (BROADCAST, make_batch(1000, 3)),
        (1, make_batch(100, 2)),
        (0, make_batch(2, 2)),
        (BROADCAST, make_batch(2000, 1)),
        (2, make_batch(200, 1)),
        (1, make_batch(102, 1)),
    ]

    write_partition(store, partition, writes)

    reader = PartitionFileReader(store, partition)
    assert read_keys(reader, 0) == [0, 1, 1000, 1001, 1002, 2, 3, 2000]
    assert read_keys(reader, 1) == [1000, 1001, 1002, 100, 101, 2000, 102]
    assert read_keys(reader, 2) == [1000, 1001, 1002, 2000, 200]


def test_broadcast_only_partition_reads_the_same_rows_everywhere(
    store: Store, partition: ResultPartitionID
) -> None:
    write_partition(store, partition, [(BROADCAST, make_batch(0, 4))], subpartitions=5)

    reader = PartitionFileReader(store, partition)

    for subpartition in range(5):
        assert read_keys(reader, subpartition) == [0, 1, 2, 3]
    assert reader.manifest.statistics.rows_per_subpartition == (4,) * 5


# --- coalescing and the background spill ----------------------------------------------------


def test_each_region_stores_a_subpartition_as_few_batches_of_at_most_the_target_size(
    store: Store, partition: ResultPartitionID
) -> None:
    writes = [(i % 2, make_batch(1000 + i * 40, 40)) for i in range(60)]  # 4-digit keys
    piece_bytes = writes[0][1].nbytes
    assert {batch.nbytes for _, batch in writes} == {piece_bytes}
    writer = PartitionFileWriter(
        StoreSink(store, partition),
        2,
        codec="zstd",
        memory_budget=40 * piece_bytes,  # regions of 20 pieces
        target_batch_bytes=4 * piece_bytes,
    )
    for subpartition, batch in writes:
        writer.add(subpartition, batch)
    writer.commit()

    reader = PartitionFileReader(store, partition)
    index = pa.ipc.open_file(
        pa.py_buffer(store.read_bytes(file_path(store, partition, INDEX_FILE)))
    )
    runs = index.read_all().to_pylist()
    data = pa.ipc.open_file(pa.py_buffer(store.read_bytes(file_path(store, partition, DATA_FILE))))
    assert reader.manifest.num_regions == 3
    # 10 pieces per subpartition per region, 4 to a batch: 3 batches, not 10.
    assert [run["num_batches"] for run in runs] == [3] * 6
    assert all(data.get_batch(n).nbytes <= 4 * piece_bytes for n in range(data.num_record_batches))
    for subpartition in range(2):
        assert read_keys(reader, subpartition) == expected_keys(writes, subpartition)


class _GatedStore(Store):
    """A local store whose data files write only while ``opened`` is set, and fail with
    ``error`` once it is set."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.opened = threading.Event()
        self.opened.set()
        self.error: OSError | None = None

    def open_output(self, path: str) -> BinaryIO:
        return cast(BinaryIO, _GatedFile(super().open_output(path), self))


class _GatedFile(io.RawIOBase):
    def __init__(self, target: BinaryIO, store: _GatedStore) -> None:
        self._target = target
        self._store = store

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._store.opened.wait(10)
        if self._store.error is not None:
            raise self._store.error
        return self._target.write(data)

    def close(self) -> None:
        self._target.close()
        super().close()


def test_writer_holds_at_most_its_budget_while_the_store_is_slow(
    tmp_path: Path, partition: ResultPartitionID
) -> None:
    store = _GatedStore(str(tmp_path / "store"))
    writes = [(i % 2, make_batch(1000 + i * 50, 50)) for i in range(12)]  # equal sizes
    budget = 4 * writes[0][1].nbytes  # regions of two writes
    writer = PartitionFileWriter(StoreSink(store, partition), 2, codec="lz4", memory_budget=budget)
    store.opened.clear()
    added: list[int] = []
    held: list[int] = []

    def produce() -> None:
        for number, (subpartition, batch) in enumerate(writes):
            writer.add(subpartition, batch)
            added.append(number)
            held.append(writer.held_bytes)

    producer = threading.Thread(target=produce)
    producer.start()
    producer.join(0.5)

    # Writes 0-1 (a region) are stuck in the store; write 3 fills the next region and waits.
    assert producer.is_alive()
    assert added == [0, 1, 2]
    assert max(held) <= budget
    store.opened.set()
    producer.join(10)
    writer.commit()
    reader = PartitionFileReader(store, partition)
    for subpartition in range(2):
        assert read_keys(reader, subpartition) == expected_keys(writes, subpartition)


def test_failed_background_spill_raises_storage_error_and_abort_leaves_nothing(
    tmp_path: Path, partition: ResultPartitionID
) -> None:
    store = _GatedStore(str(tmp_path / "store"))
    store.error = OSError(errno.EIO, "disk on fire")
    writer = PartitionFileWriter(StoreSink(store, partition), 2, codec="lz4", memory_budget=1)
    writer.add(0, make_batch(0, 5))  # spills in the background, which fails

    with pytest.raises(StorageError, match="disk on fire"):
        writer.commit()

    writer.abort()
    assert files_under(store, partition_directory(store, partition)) == []


# --- statistics ----------------------------------------------------------------------------


def test_statistics_match_what_was_written_and_what_is_read(
    store: Store, partition: ResultPartitionID
) -> None:
    writes = [
        *SPREAD_WRITES,
        (BROADCAST, make_batch(5000, 4)),
        (1, make_batch(105, 6)),
    ]
    writer = PartitionFileWriter(StoreSink(store, partition), 3, codec="zstd", memory_budget=64)
    for subpartition, batch in writes:
        writer.add(subpartition, batch)

    statistics = writer.commit()

    reader = PartitionFileReader(store, partition)
    assert reader.manifest.statistics == statistics
    for subpartition in range(3):
        runs = list(reader.runs(SubpartitionRange.single(subpartition)))
        written_rows = len(expected_keys(writes, subpartition))
        assert statistics.rows_per_subpartition[subpartition] == written_rows
        assert len(read_keys(reader, subpartition)) == written_rows
        assert sum(run.rows for run in runs) == written_rows
        assert statistics.bytes_per_subpartition[subpartition] == sum(run.length for run in runs)
        assert (
            sum(len(reader.read_run(run)) for run in runs)
            == (statistics.bytes_per_subpartition[subpartition])
        )
    assert statistics.total_rows == sum(len(expected_keys(writes, s)) for s in range(3))
    assert reader.manifest.data_bytes == store.size(file_path(store, partition, DATA_FILE))


def test_arrow_bytes_are_the_same_whatever_the_codec(
    store: Store, partition: ResultPartitionID
) -> None:
    """What plans weigh does not depend on the codec a map task chose (``auto``)."""
    writes = [(s, make_batch(1000 * s, 4000)) for s in range(3)] + [(BROADCAST, make_batch(0, 50))]
    written = {}
    for codec in ("none", "lz4", "zstd"):
        attempt = ResultPartitionID(partition.partition_id, f"attempt-{codec}")
        writer = PartitionFileWriter(StoreSink(store, attempt), 3, codec=codec, memory_budget=64)
        for subpartition, batch in writes:
            writer.add(subpartition, batch)
        written[codec] = writer.commit()
        assert PartitionFileReader(store, attempt).manifest.statistics == written[codec]

    assert len({statistics.arrow_bytes_per_subpartition for statistics in written.values()}) == 1
    assert all(
        compressed < plain
        for compressed, plain in zip(
            written["zstd"].bytes_per_subpartition,
            written["none"].bytes_per_subpartition,
            strict=True,
        )
    )
    for subpartition in range(3):
        batches = [batch for target, batch in writes if target in (subpartition, BROADCAST)]
        assert written["none"].arrow_bytes_per_subpartition[subpartition] == sum(
            batch.nbytes for batch in batches
        )


def as_format_1(document: dict[str, Any], *, arrow_bytes: bool = True) -> None:
    """``document`` (a manifest of format 2) as format 1 wrote it: statistics as lists."""
    statistics = PartitionStatistics.decode(
        base64.b64decode(document.pop("statistics")), document["number_of_subpartitions"]
    )
    document["format_version"] = 1
    document["rows_per_subpartition"] = list(statistics.rows_per_subpartition)
    document["bytes_per_subpartition"] = list(statistics.bytes_per_subpartition)
    if arrow_bytes:
        document["arrow_bytes_per_subpartition"] = list(statistics.arrow_bytes_per_subpartition)


def test_a_manifest_of_format_1_reads_as_it_was_written(
    store: Store, partition: ResultPartitionID
) -> None:
    write_partition(store, partition, SPREAD_WRITES)
    written = PartitionFileReader(store, partition).manifest.statistics
    edit_manifest(store, partition, as_format_1)

    reader = PartitionFileReader(store, partition)

    assert reader.manifest.format_version == 1
    assert reader.manifest.statistics == written
    assert [read_keys(reader, s) for s in range(3)] == [
        expected_keys(SPREAD_WRITES, s) for s in range(3)
    ]


def test_a_manifest_without_arrow_bytes_takes_the_stored_bytes(
    store: Store, partition: ResultPartitionID
) -> None:
    write_partition(store, partition, SPREAD_WRITES)
    # As pyshuffle wrote manifests before 2026-11-26.
    edit_manifest(store, partition, lambda document: as_format_1(document, arrow_bytes=False))

    statistics = PartitionFileReader(store, partition).manifest.statistics

    assert statistics.arrow_bytes_per_subpartition == statistics.bytes_per_subpartition


@pytest.mark.parametrize(
    "statistics",
    [
        pytest.param("not base64!", id="not-base64"),
        pytest.param(base64.b64encode(b"not zstd").decode(), id="not-zstd"),
        pytest.param(
            base64.b64encode(PartitionStatistics((1,), (2,), (3,)).encode()).decode(),
            id="other-subpartitions",
        ),
        pytest.param(
            base64.b64encode(zstandard.ZstdCompressor().compress(bytes(1 << 20))).decode(),
            id="declares-a-megabyte",
        ),
        pytest.param(None, id="missing"),
    ],
)
def test_manifest_with_bad_statistics_raises_partition_corrupted(
    store: Store, partition: ResultPartitionID, statistics: str | None
) -> None:
    write_partition(store, partition, SPREAD_WRITES)
    edit_manifest(store, partition, lambda document: document.update(statistics=statistics))

    with pytest.raises(PartitionCorruptedError, match=r"statistics|does not decode"):
        PartitionFileReader(store, partition)


def test_readers_of_data_neither_decode_nor_need_the_statistics(
    store: Store, partition: ResultPartitionID
) -> None:
    write_partition(store, partition, SPREAD_WRITES)
    edit_manifest(store, partition, lambda document: document.update(statistics="not base64!"))
    manifest_bytes = store.read_bytes(file_path(store, partition, MANIFEST_FILE))

    manifest = PartitionManifest.from_json(manifest_bytes, "fetched", statistics=False)
    reader = PartitionFileReader(store, partition, Layouts.MAPPED)

    assert manifest.statistics is NO_STATISTICS
    assert manifest.data_bytes > 0
    assert read_keys(reader, 1) == expected_keys(SPREAD_WRITES, 1)


def test_a_manifest_claiming_too_many_subpartitions_is_corrupt_and_allocates_nothing(
    store: Store, partition: ResultPartitionID
) -> None:
    write_partition(store, partition, SPREAD_WRITES)
    # A reader's lookup table grows with the count: a billion would take gigabytes.
    edit_manifest(store, partition, lambda document: document.update(number_of_subpartitions=10**9))

    for layouts in Layouts:
        with pytest.raises(PartitionCorruptedError, match="1000000000 subpartitions"):
            PartitionFileReader(store, partition, layouts)


def test_a_writer_of_more_subpartitions_than_readers_take_is_refused(
    store: Store, partition: ResultPartitionID
) -> None:
    with pytest.raises(ShuffleError, match=f"{MAX_SUBPARTITIONS + 1} subpartitions"):
        PartitionFileWriter(
            StoreSink(store, partition), MAX_SUBPARTITIONS + 1, codec="none", memory_budget=1
        )


# --- readable with plain pyarrow -----------------------------------------------------------


def test_partition_reads_back_with_plain_pyarrow_from_manifest_and_index(
    store: Store, partition: ResultPartitionID
) -> None:
    writes = [
        *SPREAD_WRITES,
        (BROADCAST, make_batch(9000, 2)),
        (1, make_batch(105, 4)),
        (1, make_batch(109, 1)),
    ]
    write_partition(store, partition, writes, codec="zstd", memory_budget=200)
    directory = partition_directory(store, partition)
    fs = store.filesystem

    # No pyshuffle reader below: the manifest's JSON, the index file, the Arrow IPC data file.
    manifest = json.loads(fs.cat_file(f"{directory}/{MANIFEST_FILE}"))
    # Rows, stored bytes and Arrow bytes per subpartition: zstd-compressed int64 rows.
    statistics = np.frombuffer(
        zstandard.ZstdDecompressor().decompress(base64.b64decode(manifest["statistics"])), "<i8"
    ).reshape(3, manifest["number_of_subpartitions"])
    with fs.open(f"{directory}/{manifest['index_file']}", "rb") as handle:
        index = pa.ipc.open_file(pa.py_buffer(handle.read())).read_all()
    assert index.schema.equals(INDEX_SCHEMA)
    with fs.open(f"{directory}/{manifest['data_file']}", "rb") as handle:
        data = pa.ipc.open_file(pa.py_buffer(handle.read()))

    assert data.schema.equals(SCHEMA)
    for subpartition in range(manifest["number_of_subpartitions"]):
        rows: list[int] = []
        for run in index.to_pylist():
            if run["subpartition"] in (subpartition, -1):
                for number in range(run["first_batch"], run["first_batch"] + run["num_batches"]):
                    rows += data.get_batch(number).column("key").to_pylist()
        assert rows == expected_keys(writes, subpartition)
        assert len(rows) == statistics[0][subpartition]


def test_local_data_file_is_an_arrow_ipc_file_pyarrow_opens_by_path(
    local_store: Store, partition: ResultPartitionID
) -> None:
    write_partition(local_store, partition, SPREAD_WRITES)
    data_path = file_path(local_store, partition, DATA_FILE)
    index_path = file_path(local_store, partition, INDEX_FILE)

    index = pa.ipc.open_file(index_path).read_all()
    data = pa.ipc.open_file(data_path)

    for subpartition in range(3):
        rows: list[int] = []
        for run in index.filter(pc.equal(index["subpartition"], subpartition)).to_pylist():
            for number in range(run["first_batch"], run["first_batch"] + run["num_batches"]):
                rows += data.get_batch(number).column("key").to_pylist()
        assert rows == expected_keys(SPREAD_WRITES, subpartition)
    assert data.read_all().num_rows == sum(batch.num_rows for _, batch in SPREAD_WRITES)


# --- commit, abort and missing partitions --------------------------------------------------


def test_reader_before_commit_raises_partition_not_found_naming_the_partition(
    store: Store, partition: ResultPartitionID
) -> None:
    writer = PartitionFileWriter(StoreSink(store, partition), 3, codec="lz4", memory_budget=1)
    writer.add(0, make_batch(0, 5))

    with pytest.raises(PartitionNotFoundError) as caught:
        PartitionFileReader(store, partition)

    assert str(partition) in str(caught.value)
    assert caught.value.partition_id == partition
    writer.abort()


def test_reader_of_a_partition_never_written_raises_partition_not_found(
    store: Store, partition: ResultPartitionID
) -> None:
    with pytest.raises(PartitionNotFoundError) as caught:
        PartitionFileReader(store, partition)

    assert caught.value.partition_id == partition


def test_abort_leaves_nothing_on_the_store(store: Store, partition: ResultPartitionID) -> None:
    writer = PartitionFileWriter(StoreSink(store, partition), 3, codec="zstd", memory_budget=1)
    for subpartition, batch in SPREAD_WRITES:
        writer.add(subpartition, batch)
    directory = partition_directory(store, partition)
    assert files_under(store, directory), "spilled data reached the store before the abort"

    writer.abort()

    assert not store.exists(directory)
    assert files_under(store, store.path()) == []
    with pytest.raises(PartitionNotFoundError):
        PartitionFileReader(store, partition)


def test_abort_before_any_write_leaves_nothing(store: Store, partition: ResultPartitionID) -> None:
    writer = PartitionFileWriter(StoreSink(store, partition), 3, codec="lz4", memory_budget=1)

    writer.abort()

    assert files_under(store, store.path()) == []


def test_writing_again_to_a_committed_partition_raises_shuffle_error(
    store: Store, partition: ResultPartitionID
) -> None:
    write_partition(store, partition, SPREAD_WRITES)

    with pytest.raises(ShuffleError, match="already committed"):
        PartitionFileWriter(StoreSink(store, partition), 3, codec="lz4", memory_budget=1 << 20)

    reader = PartitionFileReader(store, partition)
    assert read_keys(reader, 0) == expected_keys(SPREAD_WRITES, 0)


def test_another_attempt_of_the_same_partition_is_written_separately(
    store: Store, partition: ResultPartitionID
) -> None:
    write_partition(store, partition, [(0, make_batch(0, 3))])
    retry = ResultPartitionID(partition.partition_id, "retry-attempt")

    write_partition(store, retry, [(0, make_batch(50, 2))])

    assert read_keys(PartitionFileReader(store, partition), 0) == [0, 1, 2]
    assert read_keys(PartitionFileReader(store, retry), 0) == [50, 51]


def test_empty_partition_commits_and_reads_back_nothing(
    store: Store, partition: ResultPartitionID
) -> None:
    writer = PartitionFileWriter(StoreSink(store, partition), 4, codec="lz4", memory_budget=1 << 20)

    statistics = writer.commit()

    assert statistics.rows_per_subpartition == (0, 0, 0, 0)
    assert statistics.bytes_per_subpartition == (0, 0, 0, 0)
    reader = PartitionFileReader(store, partition)
    assert reader.schema is None
    assert list(reader.read(SubpartitionRange(0, 3))) == []
    assert list(reader.runs(SubpartitionRange(0, 3))) == []


def test_dictionary_encoded_column_is_rejected_naming_the_column(
    store: Store, partition: ResultPartitionID
) -> None:
    batch = pa.record_batch(
        {"id": pa.array([1, 2]), "city": pa.array(["oslo", "rome"]).dictionary_encode()}
    )
    writer = PartitionFileWriter(StoreSink(store, partition), 2, codec="lz4", memory_budget=1 << 20)

    with pytest.raises(ShuffleError, match="'city'"):
        writer.add(0, batch)

    writer.abort()


def test_unknown_codec_is_rejected(store: Store, partition: ResultPartitionID) -> None:
    with pytest.raises(ShuffleError, match="snappy"):
        PartitionFileWriter(StoreSink(store, partition), 2, codec="snappy", memory_budget=1)


# --- cached layouts ------------------------------------------------------------------------


def test_cached_readers_share_one_decoded_layout_without_statistics(
    store: Store, partition: ResultPartitionID
) -> None:
    write_partition(store, partition, SPREAD_WRITES)
    first = PartitionFileReader(store, partition, Layouts.MAPPED)
    second = PartitionFileReader(store, partition, Layouts.MAPPED)
    assert first._index is second._index
    assert first.manifest.statistics.rows_per_subpartition == ()
    assert first.manifest_bytes == store.read_bytes(file_path(store, partition, MANIFEST_FILE))
    assert [read_keys(second, s) for s in range(3)] == [
        expected_keys(SPREAD_WRITES, s) for s in range(3)
    ]
    PartitionFileReader.forget(store, partition)
    assert PartitionFileReader(store, partition, Layouts.MAPPED)._index is not first._index


def test_a_server_reads_its_cached_index_so_files_truncated_under_it_cannot_kill_it(
    local_store: Store, partition: ResultPartitionID
) -> None:
    write_partition(local_store, partition, SPREAD_WRITES)
    first = PartitionFileReader(local_store, partition, Layouts.READ)
    # Cut to nothing: pages of a mapped index would now fault (SIGBUS) when read.
    os.truncate(file_path(local_store, partition, INDEX_FILE), 0)
    again = PartitionFileReader(local_store, partition, Layouts.READ)
    assert again._index is first._index, "taken from the cache, files not read again"
    assert [read_keys(again, s) for s in range(3)] == [
        expected_keys(SPREAD_WRITES, s) for s in range(3)
    ]
    PartitionFileReader.forget(local_store, partition)
    with pytest.raises(PartitionCorruptedError):
        PartitionFileReader(local_store, partition, Layouts.READ)


def test_a_checked_reader_sees_files_changed_under_its_cache(
    store: Store, partition: ResultPartitionID
) -> None:
    write_partition(store, partition, SPREAD_WRITES)
    first = PartitionFileReader(store, partition, Layouts.CHECKED)
    assert PartitionFileReader(store, partition, Layouts.CHECKED)._index is first._index
    # A byte of the index flipped in place: same name, same size.
    index_path = file_path(store, partition, INDEX_FILE)
    index = bytearray(store.read_bytes(index_path))
    index[len(index) // 2] ^= 0xFF
    rewrite(store, index_path, bytes(index))
    with pytest.raises(ChecksumMismatchError):
        PartitionFileReader(store, partition, Layouts.CHECKED)
    index[len(index) // 2] ^= 0xFF
    rewrite(store, index_path, bytes(index))
    assert read_keys(PartitionFileReader(store, partition, Layouts.CHECKED), 1) == (
        expected_keys(SPREAD_WRITES, 1)
    )
    edit_manifest(store, partition, lambda document: document.update(format_version=99))
    with pytest.raises(UnsupportedFormatVersionError):
        PartitionFileReader(store, partition, Layouts.CHECKED)
    store.delete_tree(partition_directory(store, partition))
    with pytest.raises(PartitionNotFoundError):
        PartitionFileReader(store, partition, Layouts.CHECKED)


# --- corruption ----------------------------------------------------------------------------


def rewrite(store: Store, path: str, data: bytes) -> None:
    store.filesystem.pipe_file(path, data)


def edit_manifest(
    store: Store, partition: ResultPartitionID, change: Callable[[dict[str, Any]], object]
) -> None:
    manifest_path = file_path(store, partition, MANIFEST_FILE)
    document = json.loads(store.read_bytes(manifest_path))
    change(document)
    rewrite(store, manifest_path, json.dumps(document).encode())


def test_flipped_byte_in_a_run_raises_checksum_mismatch_naming_partition_and_subpartition(
    store: Store, partition: ResultPartitionID
) -> None:
    write_partition(store, partition, SPREAD_WRITES, codec="none")
    reader = PartitionFileReader(store, partition)
    (run,) = [r for r in reader.runs(SubpartitionRange.single(1))]
    data_path = file_path(store, partition, DATA_FILE)
    data = bytearray(store.read_bytes(data_path))
    data[run.offset + run.length // 2] ^= 0x01
    rewrite(store, data_path, bytes(data))

    reader = PartitionFileReader(store, partition)
    with pytest.raises(ChecksumMismatchError) as caught:
        list(reader.read(SubpartitionRange.single(1)))

    assert f"partition {partition}" in str(caught.value)
    assert "subpartition 1" in str(caught.value)
    assert caught.value.partition_id == partition
    # The other subpartitions' runs are intact and still read.
    assert read_keys(reader, 0) == expected_keys(SPREAD_WRITES, 0)
    assert read_keys(reader, 2) == expected_keys(SPREAD_WRITES, 2)


def test_deleted_data_file_raises_partition_not_found(
    store: Store, partition: ResultPartitionID
) -> None:
    write_partition(store, partition, SPREAD_WRITES)
    store.filesystem.rm(file_path(store, partition, DATA_FILE))

    reader = PartitionFileReader(store, partition)

    with pytest.raises(PartitionNotFoundError) as caught:
        list(reader.read(SubpartitionRange.single(0)))
    assert caught.value.partition_id == partition
    assert str(partition) in str(caught.value)


@pytest.fixture(params=["mapped", "positioned", "memory", "s3"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Each way a store reads ranges: a memory map, positioned reads, fsspec (in memory, and
    ranged GETs of an object store: moto's S3 server standing in for S3)."""
    if request.param in ("mapped", "positioned"):
        yield Store(str(tmp_path / "store"), memory_map=request.param == "mapped")
        return
    if request.param == "s3":
        bucket = f"unit-{uuid.uuid4().hex}"
        request.getfixturevalue("s3_stand_in").make_bucket(bucket)
        root = f"s3://{bucket}/store"
    else:
        root = f"memory://pyshuffle-unit-{uuid.uuid4().hex}"
    fsspec_store = Store(root)
    yield fsspec_store
    fsspec_store.delete_tree(fsspec_store.path())


def test_a_run_read_after_a_prefix_is_the_prefix_and_the_run_bytes(
    any_store: Store, partition: ResultPartitionID
) -> None:
    write_partition(any_store, partition, SPREAD_WRITES, codec="none")
    reader = PartitionFileReader(any_store, partition)
    for run in reader.runs(SubpartitionRange(0, 2)):
        data = reader.read_run(run).to_pybytes()
        middle = run.length // 3
        for start, length in [(0, run.length), (middle, run.length - middle), (0, 0)]:
            message = reader.read_after(b"prefix", run, start, length)
            assert message == b"prefix" + data[start : start + length]


def _sent(reader: PartitionFileReader, run: Run) -> bytes:
    """What :meth:`PartitionFileReader.send_run` puts on a socket, read from its other end."""
    sender, receiver = socket.socketpair()
    with sender, receiver:
        receiver.settimeout(10)
        pieces: list[int] = []
        # Pieces smaller than the run: each is sent and counted.
        reader.send_run(sender, b"header", run, piece_size=1000, sent=pieces.append)
        assert sum(pieces) == run.length and all(size <= 1000 for size in pieces)
        sender.shutdown(socket.SHUT_WR)
        received = bytearray()
        while chunk := receiver.recv(1 << 20):
            received += chunk
    return bytes(received)


def test_a_run_sent_to_a_socket_is_the_header_and_the_run_bytes(
    any_store: Store, partition: ResultPartitionID
) -> None:
    write_partition(any_store, partition, SPREAD_WRITES, codec="none")
    reader = PartitionFileReader(any_store, partition)
    reader.check_data_file()
    for run in reader.runs(SubpartitionRange(0, 2)):
        assert _sent(reader, run) == b"header" + reader.read_run(run).to_pybytes()
    # An empty run (an index may hold one) is its header alone.
    assert _sent(reader, Run(0, 0, 0, 0, 0, 0)) == b"header"


@pytest.mark.parametrize("length", [1000, 3 << 20])
def test_ranges_small_and_large_are_the_file_bytes_and_short_at_its_end(
    any_store: Store, length: int
) -> None:
    """Small ranges are read and large ones sliced from a memory map (a mapped store), small
    messages joined to their prefix and large ones read into place: all give the file's
    bytes, and a range past the end is short, not an error."""
    path = any_store.path("ranges", "data")
    content = random.Random(length).randbytes(2 * length)
    any_store.put_atomic(path, content)
    ranges = any_store.open_ranges(path)
    assert ranges.read_range(7, length).to_pybytes() == content[7 : 7 + length]
    assert ranges.read_range(length + 11, length).to_pybytes() == content[length + 11 :]
    assert ranges.read_range(3 * length, length).size == 0
    assert ranges.read_after(b"head", 7, length) == b"head" + content[7 : 7 + length]
    assert ranges.read_after(b"head", length + 11, length) == b"head" + content[length + 11 :]
    assert ranges.read_after(b"head", 3 * length, length) == b"head"


def test_a_data_file_gone_is_partition_not_found_for_every_read(
    any_store: Store, partition: ResultPartitionID
) -> None:
    """An object store finds a missing data file only when it is read: every way of reading
    still names the partition lost."""
    write_partition(any_store, partition, SPREAD_WRITES, codec="none")
    reader = PartitionFileReader(any_store, partition)
    run = next(iter(reader.runs(SubpartitionRange.single(0))))
    any_store.delete_tree(file_path(any_store, partition, DATA_FILE))
    reads: list[Callable[[PartitionFileReader], object]] = [
        lambda gone: gone.read_run(run),
        lambda gone: gone.read_after(b"prefix", run, 0, run.length),
        lambda gone: list(gone.read(SubpartitionRange.single(0))),
        lambda gone: _sent(gone, run),
        PartitionFileReader.check_data_file,
    ]
    for read in reads:
        with pytest.raises(PartitionNotFoundError) as caught:
            read(PartitionFileReader(any_store, partition))
        assert caught.value.partition_id == partition


def test_data_file_truncated_inside_a_run_raises_checksum_mismatch(
    any_store: Store, partition: ResultPartitionID
) -> None:
    write_partition(any_store, partition, SPREAD_WRITES, codec="none")
    reader = PartitionFileReader(any_store, partition)
    run = next(iter(reader.runs(SubpartitionRange.single(0))))
    data_path = file_path(any_store, partition, DATA_FILE)
    rewrite(any_store, data_path, any_store.read_bytes(data_path)[: run.offset + run.length // 2])

    reader = PartitionFileReader(any_store, partition)

    with pytest.raises(ChecksumMismatchError) as read:
        list(reader.read(SubpartitionRange.single(0)))
    with pytest.raises(ChecksumMismatchError, match="truncated") as read_after:
        reader.read_after(b"prefix", run, 0, run.length)
    with pytest.raises(ChecksumMismatchError, match="truncated") as checked:
        reader.check_data_file()
    with pytest.raises(ChecksumMismatchError, match="truncated") as sent:
        _sent(reader, run)
    assert read.value.partition_id == read_after.value.partition_id == partition
    assert checked.value.partition_id == sent.value.partition_id == partition


@pytest.mark.parametrize("keep", [0, 16])
def test_data_file_truncated_before_a_run_raises_partition_corrupted(
    store: Store, partition: ResultPartitionID, keep: int
) -> None:
    write_partition(store, partition, SPREAD_WRITES, codec="none")
    data_path = file_path(store, partition, DATA_FILE)
    rewrite(store, data_path, store.read_bytes(data_path)[:keep])

    reader = PartitionFileReader(store, partition)

    with pytest.raises(PartitionCorruptedError) as caught:
        list(reader.read(SubpartitionRange.single(0)))
    assert caught.value.partition_id == partition
    assert str(partition) in str(caught.value)


def test_deleted_index_file_raises_partition_not_found(
    store: Store, partition: ResultPartitionID
) -> None:
    write_partition(store, partition, SPREAD_WRITES)
    store.filesystem.rm(file_path(store, partition, INDEX_FILE))

    with pytest.raises(PartitionNotFoundError):
        PartitionFileReader(store, partition)


def test_corrupt_index_file_raises_checksum_mismatch(
    store: Store, partition: ResultPartitionID
) -> None:
    write_partition(store, partition, SPREAD_WRITES)
    index_path = file_path(store, partition, INDEX_FILE)
    index = bytearray(store.read_bytes(index_path))
    index[len(index) // 2] ^= 0xFF
    rewrite(store, index_path, bytes(index))

    with pytest.raises(ChecksumMismatchError) as caught:
        PartitionFileReader(store, partition)
    assert caught.value.partition_id == partition


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"{not json", id="not-json"),
        pytest.param(b"\xff\xfe\x00", id="not-utf8"),
        pytest.param(b"", id="empty"),
        pytest.param(b'{"format": "pyshuffle-partition"}', id="fields-missing"),
        pytest.param(b'{"format": "something-else", "format_version": 1}', id="other-format"),
        pytest.param(b"[]", id="json-array"),
        pytest.param(b"null", id="json-null"),
    ],
)
def test_corrupt_manifest_raises_partition_corrupted(
    store: Store, partition: ResultPartitionID, content: bytes
) -> None:
    write_partition(store, partition, SPREAD_WRITES)
    manifest_path = file_path(store, partition, MANIFEST_FILE)
    rewrite(store, manifest_path, content)

    with pytest.raises(PartitionCorruptedError) as caught:
        PartitionFileReader(store, partition)

    assert manifest_path in str(caught.value)


def test_truncated_manifest_raises_partition_corrupted(
    store: Store, partition: ResultPartitionID
) -> None:
    write_partition(store, partition, SPREAD_WRITES)
    manifest_path = file_path(store, partition, MANIFEST_FILE)
    rewrite(store, manifest_path, store.read_bytes(manifest_path)[:-40])

    with pytest.raises(PartitionCorruptedError):
        PartitionFileReader(store, partition)


def test_manifest_of_a_newer_format_version_is_unsupported(
    store: Store, partition: ResultPartitionID
) -> None:
    write_partition(store, partition, SPREAD_WRITES)
    edit_manifest(store, partition, lambda document: document.update(format_version=99))

    with pytest.raises(UnsupportedFormatVersionError) as caught:
        PartitionFileReader(store, partition)

    assert "99" in str(caught.value)


def test_manifest_describing_another_partition_raises_partition_corrupted(
    store: Store, partition: ResultPartitionID
) -> None:
    write_partition(store, partition, SPREAD_WRITES)
    manifest_path = file_path(store, partition, MANIFEST_FILE)
    document = json.loads(store.read_bytes(manifest_path))
    document["partition"]["producer_attempt_id"] = "someone-else"
    rewrite(store, manifest_path, json.dumps(document).encode())

    with pytest.raises(PartitionCorruptedError, match="someone-else"):
        PartitionFileReader(store, partition)


# --- the store -----------------------------------------------------------------------------


@pytest.mark.parametrize("part", ["../x", "..", "a/b", "", ".hidden", "x/../../y"])
def test_store_path_rejects_components_that_could_escape_the_root(store: Store, part: str) -> None:
    with pytest.raises(InvalidIdentifierError):
        store.path("result", part)
    with pytest.raises(InvalidIdentifierError):
        store.child(store.path("result"), part)


def test_store_path_joins_valid_components_under_the_root(store: Store) -> None:
    root = store.path()

    assert store.path("result", "0", "attempt") == f"{root}/result/0/attempt"
    assert store.child(store.path("result"), "data.arrow") == f"{root}/result/data.arrow"


def test_put_atomic_writes_the_bytes_and_leaves_no_temp_files(store: Store) -> None:
    directory = store.path("atomic")
    target = store.child(directory, "manifest.json")

    store.put_atomic(target, b"first")
    store.put_atomic(target, b"second version")

    assert store.read_bytes(target) == b"second version"
    assert [path.rsplit("/", 1)[-1] for path in files_under(store, directory)] == ["manifest.json"]


def test_put_atomic_that_fails_raises_storage_error_and_leaves_no_temp_files(
    local_store: Store,
) -> None:
    directory = local_store.path("atomic")
    target = local_store.child(directory, "manifest.json")
    os.makedirs(os.path.join(target, "occupied"))  # a directory where the file should go

    with pytest.raises(StorageError):
        local_store.put_atomic(target, b"data")

    assert sorted(os.listdir(directory)) == ["manifest.json"]
    assert os.path.isdir(target)


def test_local_store_creates_its_root(tmp_path: Path) -> None:
    root = tmp_path / "a" / "b"

    store = Store(str(root))

    assert root.is_dir()
    assert store.is_local


def test_memory_store_is_not_local() -> None:
    store = Store(f"memory://pyshuffle-unit-{uuid.uuid4().hex}")

    assert not store.is_local


def test_delete_tree_tolerates_missing_paths(store: Store) -> None:
    missing = store.path("nothing-here")

    store.delete_tree(missing)
    assert not store.exists(missing)


def test_a_store_is_opened_only_where_it_exists_and_never_created(tmp_path: Path) -> None:
    missing = tmp_path / "producer-store"
    assert Store.open_existing(str(missing)) is None
    assert not missing.exists()
    assert Store.open_existing("no-such-protocol://bucket/store") is None
    missing.mkdir()
    found = Store.open_existing(str(missing))
    assert found is not None and found.url == str(missing)


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


def test_a_shared_store_spreads_map_outputs_over_prefixes_each_found_and_released(
    any_store: Store,
) -> None:
    """On an object store the map outputs of one result sit under several key prefixes (each
    the same in every process), a worker's scan finds every one, and deleting the result's
    directories leaves nothing; a local store keeps one directory per result."""
    result_id = f"result-{uuid.uuid4().hex}"
    partitions = [
        ResultPartitionID(IntermediateResultPartitionID(result_id, index), f"attempt-{index}")
        for index in range(40)
    ]
    for partition in partitions:
        write_partition(any_store, partition, SPREAD_WRITES[:1])
    root = any_store.path()
    prefixes = {partition_directory(any_store, p)[len(root) :].split("/")[1] for p in partitions}
    if any_store.is_shared:
        assert len(prefixes) > 8 and all(len(prefix) == 1 for prefix in prefixes)
    else:
        assert prefixes == {result_id}
    found = dict(stored_partitions(any_store))
    assert sorted(p for p in found.values() if p is not None) == sorted(partitions)
    assert all(found[partition_directory(any_store, p)] == p for p in partitions)
    for directory in result_directories(any_store, result_id):
        any_store.delete_tree(directory)
    assert list(stored_partitions(any_store)) == []
