"""``shuffle_runtime.format.writer``: what PartitionFileWriter stores (read back by the
reader and by plain pyarrow), its spills, budget, statistics, codecs and aborts."""

from __future__ import annotations

import base64
import errno
import io
import json
import threading
import uuid
from pathlib import Path
from typing import Any, BinaryIO, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import zstandard

from shuffle_api import (
    BROADCAST,
    IntermediateResultPartitionID,
    PartitionNotFoundError,
    ResultPartitionID,
    ShuffleError,
    StorageError,
    SubpartitionRange,
)
from shuffle_runtime.format import (
    PartitionFileReader,
    PartitionFileWriter,
    StoreSink,
    partition_directory,
)
from shuffle_runtime.format.manifest import (
    DATA_FILE,
    INDEX_FILE,
    INDEX_SCHEMA,
    MANIFEST_FILE,
    MAX_SUBPARTITIONS,
)
from shuffle_runtime.store import Store
from tests.eventually import eventually
from tests.unit.shuffle_runtime.format.compressibility import MIB, compressible, incompressible
from tests.unit.shuffle_runtime.format.partitions import (
    SCHEMA,
    SPREAD_WRITES,
    expected_keys,
    file_path,
    keys_of,
    make_batch,
    read_keys,
    write_partition,
)
from tests.unit.shuffle_runtime.stores import files_under

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
    # Writes 0-1 (a region) are stuck in the store; write 3 fills the next region and waits.
    eventually(lambda: len(added) >= 3, "three writes added")
    producer.join(0.3)
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


# --- the auto codec ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("batch", "expected"),
    [(incompressible(), ("none",)), (compressible(), ("lz4", "zstd"))],
    ids=["incompressible", "compressible"],
)
def test_the_writer_stores_with_the_codec_auto_chose(
    tmp_path: Path, batch: pa.RecordBatch, expected: tuple[str, ...]
) -> None:
    store = Store(str(tmp_path / "store"))
    partition = ResultPartitionID(IntermediateResultPartitionID("result-1", 0), uuid.uuid4().hex)
    writer = PartitionFileWriter(
        StoreSink(store, partition), 2, codec="auto", memory_budget=MIB, auto_bandwidth=64 * MIB
    )
    writer.add(0, batch)
    writer.add(1, batch.slice(0, 10))
    writer.commit()

    reader = PartitionFileReader(store, partition)

    assert reader.manifest.codec in expected
    back = pa.Table.from_batches(list(reader.read(SubpartitionRange(0, 1))))
    assert back.num_rows == batch.num_rows + 10
    assert pc.sum(back.column("key")).as_py() == (
        pc.sum(batch.column("key")).as_py() + pc.sum(batch.column("key").slice(0, 10)).as_py()
    )
    assert back.slice(0, batch.num_rows).equals(pa.Table.from_batches([batch]))


@pytest.mark.parametrize(("rows", "expected"), [(700, "none"), (20_000, "lz4")])
def test_auto_tries_a_codec_only_on_a_partition_large_enough_to_repay_it(
    tmp_path: Path, rows: int, expected: str
) -> None:
    """28 kB of compressible rows, all saved, are worth 0.8 ms at 64 MiB/s: less than a trial
    costs, though lz4 would save more than it costs on them; 800 kB are worth 24 ms, and lz4
    pays (each read back whole)."""
    store = Store(str(tmp_path / "store"))
    partition = ResultPartitionID(IntermediateResultPartitionID("result-1", 0), uuid.uuid4().hex)
    batch = compressible(rows)
    writer = PartitionFileWriter(
        StoreSink(store, partition), 2, codec="auto", memory_budget=MIB, auto_bandwidth=64 * MIB
    )
    writer.add(1, batch)
    writer.commit()

    reader = PartitionFileReader(store, partition)
    assert reader.manifest.codec == expected
    assert pa.Table.from_batches(list(reader.read(SubpartitionRange(1, 1)))).equals(
        pa.Table.from_batches([batch])
    )
