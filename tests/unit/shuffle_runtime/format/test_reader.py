"""``shuffle_runtime.format.reader``: reading committed partitions: ranges, cached layouts,
runs read, sent and verified, and every file missing, truncated or corrupt."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable

import pyarrow as pa
import pytest

from shuffle_api import (
    ChecksumMismatchError,
    PartitionCorruptedError,
    PartitionNotFoundError,
    ResultPartitionID,
    ShuffleError,
    SubpartitionRange,
    UnsupportedFormatVersionError,
)
from shuffle_runtime.format import (
    Layouts,
    PartitionFileReader,
    PartitionFileWriter,
    StoreSink,
    decode_run,
    is_committed,
    partition_directory,
)
from shuffle_runtime.format.manifest import DATA_FILE, INDEX_FILE, MANIFEST_FILE
from shuffle_runtime.format.reader import Run
from shuffle_runtime.store import Store
from tests.unit.shuffle_runtime.format.partitions import (
    SPREAD_WRITES,
    edit_manifest,
    expected_keys,
    file_path,
    keys_of,
    make_batch,
    read_keys,
    rewrite,
    write_partition,
)

# --- round trips ---------------------------------------------------------------------------


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


def test_a_manifest_claiming_too_many_subpartitions_is_corrupt_and_allocates_nothing(
    store: Store, partition: ResultPartitionID
) -> None:
    write_partition(store, partition, SPREAD_WRITES)
    # A reader's lookup table grows with the count: a billion would take gigabytes.
    edit_manifest(store, partition, lambda document: document.update(number_of_subpartitions=10**9))

    for layouts in Layouts:
        with pytest.raises(PartitionCorruptedError, match="1000000000 subpartitions"):
            PartitionFileReader(store, partition, layouts)


# --- whether a partition is committed --------------------------------------------------------


def test_is_committed_reads_a_local_partition_and_looks_up_an_object_stores_manifest(
    store: Store, partition: ResultPartitionID
) -> None:
    assert not is_committed(store, partition)
    write_partition(store, partition, SPREAD_WRITES)
    assert is_committed(store, partition)
    # An index damaged behind the store's back: a local disk's check reads and finds it; an
    # object store's takes the manifest for the commit (the read that meets it fails).
    rewrite(store, file_path(store, partition, INDEX_FILE), b"not an index")
    assert is_committed(store, partition) is (not store.is_local)
    store.filesystem.rm(file_path(store, partition, MANIFEST_FILE))
    assert not is_committed(store, partition)


# --- runs decoded from their bytes (as fetched from a worker or a data port) -----------------


def _run_bytes(batches: list[pa.RecordBatch]) -> pa.Buffer:
    stream = pa.BufferOutputStream()
    for batch in batches:
        stream.write(batch.serialize())
    return stream.getvalue()


@pytest.mark.parametrize("sizes", [[1000, 4, 4], [4] * 3, [5000]], ids=repr)
def test_a_run_decodes_to_its_batches_whatever_their_sizes(
    partition: ResultPartitionID, sizes: list[int]
) -> None:
    batches = [make_batch(100 * number, size) for number, size in enumerate(sizes)]
    decoded = list(decode_run(_run_bytes(batches), batches[0].schema, partition))
    assert [batch.num_rows for batch in decoded] == sizes
    assert all(got.equals(sent) for got, sent in zip(decoded, batches, strict=True))


@pytest.mark.parametrize("count", [16, 40, 4000])
def test_a_run_of_many_small_batches_decodes_as_one_batch_of_their_rows(
    partition: ResultPartitionID, count: int
) -> None:
    """A merged run, of a block of every map output: one batch for the reducer to take."""
    batches = [make_batch(10 * number, 4) for number in range(count)]
    [decoded] = decode_run(_run_bytes(batches), batches[0].schema, partition)
    assert decoded.equals(pa.Table.from_batches(batches).combine_chunks().to_batches()[0])
    assert decoded.num_rows == 4 * count


@pytest.mark.parametrize("cut", ["truncated", "overlong-message"])
def test_a_run_of_many_small_batches_damaged_late_is_corrupt(
    partition: ResultPartitionID, cut: str
) -> None:
    batches = [make_batch(0, 4) for _ in range(40)]
    data = bytearray(_run_bytes(batches).to_pybytes())
    if cut == "truncated":
        del data[-10:]
    else:  # the 31st message claims metadata past the run's end
        late = sum(batch.serialize().size for batch in batches[:30])
        data[late + 4 : late + 8] = (0x7FFFFFF0).to_bytes(4, "little")
    with pytest.raises(PartitionCorruptedError, match="does not decode"):
        list(decode_run(pa.py_buffer(bytes(data)), batches[0].schema, partition))
