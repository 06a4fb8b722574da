"""``shuffle_runtime.format.merge``: map outputs merged per subpartition read as the same
rows, in the sources' order, as reading every source; one run per subpartition; what cannot
be merged (another schema, broadcast runs, a corrupt or missing source) commits nothing."""

from __future__ import annotations

import dataclasses
import uuid

import pyarrow as pa
import pytest

from shuffle_api import (
    BROADCAST,
    ChecksumMismatchError,
    IntermediateResultPartitionID,
    PartitionNotFoundError,
    ResultPartitionID,
    ShuffleError,
    SubpartitionRange,
)
from shuffle_runtime.format import PartitionFileReader, is_readable, merge, merge_partitions
from shuffle_runtime.format.manifest import DATA_FILE, MANIFEST_FILE, PartitionManifest
from shuffle_runtime.store import Store
from tests.unit.shuffle_runtime.format.partitions import (
    file_path,
    keys_of,
    make_batch,
    read_keys,
    rewrite,
    write_partition,
)

SUBPARTITIONS = 5


def _map_output(map_index: int) -> ResultPartitionID:
    return ResultPartitionID(IntermediateResultPartitionID("maps", map_index), uuid.uuid4().hex)


def _merged() -> ResultPartitionID:
    return ResultPartitionID(IntermediateResultPartitionID("merged", 0), uuid.uuid4().hex)


def _writes(map_index: int, batches_each: int = 2) -> list[tuple[int, pa.RecordBatch]]:
    """Map output ``map_index``: keys ``map_index * 1000 + ...`` in every subpartition but the
    map's own modulo (empty there), a few batches each."""
    return [
        (subpartition, make_batch(map_index * 1000 + subpartition * 100 + 10 * batch, 3))
        for batch in range(batches_each)
        for subpartition in range(SUBPARTITIONS)
        if subpartition != map_index % SUBPARTITIONS
    ]


def _write_maps(store: Store, maps: int) -> list[ResultPartitionID]:
    outputs = []
    for map_index in range(maps):
        output = _map_output(map_index)
        write_partition(store, output, _writes(map_index), subpartitions=SUBPARTITIONS)
        outputs.append(output)
    return outputs


def _unmerged_keys(store: Store, outputs: list[ResultPartitionID], subpartition: int) -> list[int]:
    return [
        key
        for output in outputs
        for key in read_keys(PartitionFileReader(store, output), subpartition)
    ]


def test_a_merged_partition_reads_as_every_source_in_order_one_run_each(store: Store) -> None:
    outputs = _write_maps(store, 7)
    merged = merge_partitions([(store, output) for output in outputs], store, _merged())

    reader = PartitionFileReader(store, merged.partition)
    assert reader.manifest.merged_from == tuple(outputs)
    for subpartition in range(SUBPARTITIONS):
        assert read_keys(reader, subpartition) == _unmerged_keys(store, outputs, subpartition)
        assert len(list(reader.runs(SubpartitionRange.single(subpartition)))) == 1
    unmerged_rows = [
        PartitionFileReader(store, output).manifest.statistics.rows_per_subpartition
        for output in outputs
    ]
    assert merged.statistics.rows_per_subpartition == tuple(
        map(sum, zip(*unmerged_rows, strict=True))
    )
    assert reader.manifest.statistics == merged.statistics


def test_a_merged_partition_is_sent_to_readers_without_its_sources(store: Store) -> None:
    outputs = _write_maps(store, 7)
    merged = merge_partitions([(store, output) for output in outputs], store, _merged())
    plain = _write_maps(store, 1)[0]

    reader = PartitionFileReader(store, merged.partition)
    sent = PartitionManifest.from_json(reader.manifest_to_send, "sent")

    assert b"merged_from" in reader.manifest_bytes
    assert b"merged_from" not in reader.manifest_to_send
    assert len(reader.manifest_to_send) < len(reader.manifest_bytes)
    assert sent == dataclasses.replace(reader.manifest, merged_from=())
    # What is not merged is sent as it is stored.
    assert PartitionFileReader(store, plain).manifest_to_send == store.read_bytes(
        file_path(store, plain, MANIFEST_FILE)
    )


def test_a_merged_run_of_many_batches_of_many_codecs_reads_in_one_call(store: Store) -> None:
    outputs = []
    for map_index in range(24):  # ~19 batches a subpartition: read by Arrow's stream reader
        output = _map_output(map_index)
        codec = ("none", "lz4", "zstd")[map_index % 3]
        write_partition(store, output, _writes(map_index), subpartitions=SUBPARTITIONS, codec=codec)
        outputs.append(output)
    merged = merge_partitions([(store, output) for output in outputs], store, _merged())

    reader = PartitionFileReader(store, merged.partition)
    for subpartition in range(SUBPARTITIONS):
        [run] = reader.runs(SubpartitionRange.single(subpartition))
        assert run.batches >= 16
        assert read_keys(reader, subpartition) == _unmerged_keys(store, outputs, subpartition)


def test_plain_pyarrow_reads_a_merged_partition_as_a_stream(store: Store) -> None:
    outputs = _write_maps(store, 3)
    merged = merge_partitions([(store, output) for output in outputs], store, _merged())

    data = store.read_bytes(file_path(store, merged.partition, DATA_FILE))
    batches = list(pa.ipc.open_stream(data))
    expected = [key for s in range(SUBPARTITIONS) for key in _unmerged_keys(store, outputs, s)]
    assert keys_of(batches) == expected


def test_sources_of_other_codecs_and_of_several_regions_merge(store: Store) -> None:
    many_regions = _map_output(1)
    # A budget smaller than two batches: each spill is a region of its own.
    write_partition(
        store,
        many_regions,
        _writes(1, batches_each=6),
        subpartitions=SUBPARTITIONS,
        codec="zstd",
        memory_budget=256,
    )
    assert PartitionFileReader(store, many_regions).manifest.num_regions > 1
    plain = _map_output(2)
    write_partition(store, plain, _writes(2), subpartitions=SUBPARTITIONS, codec="none")
    outputs = [many_regions, plain]

    merged = merge_partitions([(store, output) for output in outputs], store, _merged())

    reader = PartitionFileReader(store, merged.partition)
    assert reader.manifest.codec == "mixed"
    for subpartition in range(SUBPARTITIONS):
        assert read_keys(reader, subpartition) == _unmerged_keys(store, outputs, subpartition)


def test_passes_smaller_than_a_subpartition_give_the_same_partition(store: Store) -> None:
    outputs = _write_maps(store, 4)
    sources = [(store, output) for output in outputs]
    whole = merge_partitions(sources, store, _merged())
    by_one = merge_partitions(sources, store, _merged(), pass_bytes=1)

    for merged in (whole, by_one):
        reader = PartitionFileReader(store, merged.partition)
        for subpartition in range(SUBPARTITIONS):
            assert read_keys(reader, subpartition) == _unmerged_keys(store, outputs, subpartition)
    assert store.read_bytes(file_path(store, whole.partition, DATA_FILE)) == store.read_bytes(
        file_path(store, by_one.partition, DATA_FILE)
    )


def test_a_merged_run_is_cut_as_the_writer_cuts_runs(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    outputs = _write_maps(store, 6)
    monkeypatch.setattr(merge, "MAX_RUN_BYTES", 1)  # a run closes after each source run
    merged = merge_partitions([(store, output) for output in outputs], store, _merged())

    reader = PartitionFileReader(store, merged.partition)
    for subpartition in range(SUBPARTITIONS):
        runs = list(reader.runs(SubpartitionRange.single(subpartition)))
        # One a source that has rows for it (map m has none for subpartition m % 5).
        assert len(runs) == sum(1 for m in range(6) if m % SUBPARTITIONS != subpartition)
        assert read_keys(reader, subpartition) == _unmerged_keys(store, outputs, subpartition)


@pytest.mark.parametrize("pass_bytes", [1, 64 << 20], ids=["a-subpartition-a-pass", "one-pass"])
def test_a_merged_run_closes_after_the_source_run_that_fills_it(
    store: Store, monkeypatch: pytest.MonkeyPatch, pass_bytes: int
) -> None:
    """With runs of a few source runs each: a run closes once it holds the most a run may,
    whether a pass holds one subpartition or all of them (sources read piece by piece)."""
    outputs = _write_maps(store, 7)
    lengths = {
        subpartition: [
            run.length
            for output in outputs
            for run in PartitionFileReader(store, output).runs(
                SubpartitionRange.single(subpartition)
            )
        ]
        for subpartition in range(SUBPARTITIONS)
    }
    most = 2 * max(max(each) for each in lengths.values()) + 1
    monkeypatch.setattr(merge, "MAX_RUN_BYTES", most)
    merged = merge_partitions(
        [(store, output) for output in outputs], store, _merged(), pass_bytes=pass_bytes
    )

    reader = PartitionFileReader(store, merged.partition)
    for subpartition, sources in lengths.items():
        expected, held = [], 0
        for length in sources:
            if held >= most:
                expected.append(held)
                held = 0
            held += length
        expected.append(held)
        one = SubpartitionRange.single(subpartition)
        assert [run.length for run in reader.runs(one)] == expected
        assert len(expected) > 1
        assert read_keys(reader, subpartition) == _unmerged_keys(store, outputs, subpartition)


def test_sources_without_rows_add_nothing(store: Store) -> None:
    empty = _map_output(9)
    write_partition(store, empty, [], subpartitions=SUBPARTITIONS)
    outputs = _write_maps(store, 2)

    merged = merge_partitions([(store, empty), *((store, o) for o in outputs)], store, _merged())

    reader = PartitionFileReader(store, merged.partition)
    assert read_keys(reader, 3) == _unmerged_keys(store, outputs, 3)
    only_empty = merge_partitions([(store, empty)], store, _merged())
    assert PartitionFileReader(store, only_empty.partition).schema is None
    assert read_keys(PartitionFileReader(store, only_empty.partition), 0) == []


def test_a_corrupt_source_fails_the_merge_and_commits_nothing(store: Store) -> None:
    outputs = _write_maps(store, 3)
    data_path = file_path(store, outputs[1], DATA_FILE)
    data = bytearray(store.read_bytes(data_path))
    data[len(data) // 2] ^= 0xFF
    rewrite(store, data_path, bytes(data))
    merged = _merged()

    with pytest.raises(ChecksumMismatchError):
        merge_partitions([(store, output) for output in outputs], store, merged)
    assert not is_readable(store, merged)
    assert not store.exists(file_path(store, merged, MANIFEST_FILE))


def test_a_missing_source_fails_the_merge(store: Store) -> None:
    outputs = _write_maps(store, 2)
    merged = _merged()
    with pytest.raises(PartitionNotFoundError):
        merge_partitions([(store, outputs[0]), (store, _map_output(5))], store, merged)
    assert not is_readable(store, merged)


@pytest.mark.parametrize("what", ["schema", "subpartitions", "broadcast"])
def test_sources_that_cannot_be_merged_are_refused(store: Store, what: str) -> None:
    [first] = _write_maps(store, 1)
    other = _map_output(1)
    if what == "schema":
        batch = pa.record_batch([pa.array([1, 2])], names=["other"])
        write_partition(store, other, [(0, batch)], subpartitions=SUBPARTITIONS)
    elif what == "subpartitions":
        write_partition(store, other, _writes(1), subpartitions=SUBPARTITIONS + 1)
    else:
        write_partition(store, other, [(BROADCAST, make_batch(0, 2))], subpartitions=SUBPARTITIONS)
    merged = _merged()

    with pytest.raises(ShuffleError):
        merge_partitions([(store, first), (store, other)], store, merged)
    assert not is_readable(store, merged)
