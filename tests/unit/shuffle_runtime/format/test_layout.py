"""``shuffle_runtime.format.layout``: where partitions live on a store: each attempt apart,
spread over key prefixes on a shared store, found and released."""

from __future__ import annotations

import uuid

from shuffle_api import IntermediateResultPartitionID, ResultPartitionID
from shuffle_runtime.format import (
    PartitionFileReader,
    partition_directory,
    result_directories,
    stored_partitions,
)
from shuffle_runtime.store import Store
from tests.unit.shuffle_runtime.format.partitions import (
    SPREAD_WRITES,
    make_batch,
    read_keys,
    write_partition,
)


def test_another_attempt_of_the_same_partition_is_written_separately(
    store: Store, partition: ResultPartitionID
) -> None:
    write_partition(store, partition, [(0, make_batch(0, 3))])
    retry = ResultPartitionID(partition.partition_id, "retry-attempt")

    write_partition(store, retry, [(0, make_batch(50, 2))])

    assert read_keys(PartitionFileReader(store, partition), 0) == [0, 1, 2]
    assert read_keys(PartitionFileReader(store, retry), 0) == [50, 51]


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
