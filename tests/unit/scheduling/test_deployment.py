"""Consumers' deployment descriptors: one shared compressed descriptor list per consumed group,
offloaded to the blob store above the threshold, stale lists dropped with their blobs."""

from __future__ import annotations

from pathlib import Path

import pytest

from blob import BlobStore, process_blob_cache
from netty_like.descriptor import NettyShuffleDescriptor
from scheduling.deployment import (
    DescriptorCache,
    GateReference,
    InlineDescriptors,
    OffloadedDescriptors,
    consumer_deployments,
    even_reads,
    resolve_gate,
)
from scheduling.graph import Stage, StageExchange, StageGraph
from scheduling.groups import (
    ConsumedPartitionGroup,
    ExchangeGroups,
    PartitionGroups,
    build_groups,
)
from scheduling.skew import InputSlice, ProducerRange
from shuffle_api import (
    BlobNotFoundError,
    DistributionPattern,
    IntermediateResultPartitionID,
    InvalidOperationError,
    ResultPartitionID,
    ShuffleDescriptor,
    ShuffleDescriptorGroup,
    SubpartitionRange,
    serialize,
)


def _descriptor(result_id: str, index: int) -> NettyShuffleDescriptor:
    return NettyShuffleDescriptor(
        ResultPartitionID(IntermediateResultPartitionID(result_id, index), f"attempt-{index}"),
        producer_location=f"executor-{index % 7}",
        host=f"10.0.0.{index % 7}",
        data_port=41000 + index % 7,
        connection_index=0,
        store_url="/tmp/pyshuffle-store",
    )


def _descriptors_of(group: ConsumedPartitionGroup) -> list[ShuffleDescriptor]:
    return [_descriptor(group.result_id, index) for index in group.partitions]


def _groups(producers: int, consumers: int, pattern: DistributionPattern) -> PartitionGroups:
    return build_groups(
        StageGraph(
            [Stage("map", producers), Stage("reduce", consumers)],
            [StageExchange("shuffled", "map", "reduce", pattern)],
        )
    )


def _deploy(
    groups: PartitionGroups, cache: DescriptorCache, subpartitions: int
) -> list[GateReference]:
    deployments = consumer_deployments(
        groups,
        "reduce",
        cache,
        _descriptors_of,
        even_reads(subpartitions),
    )
    return [reference for deployment in deployments for reference in deployment.inputs]


def test_every_consumer_of_a_group_shares_one_compressed_list(tmp_path: Path) -> None:
    groups = _groups(4, 3, DistributionPattern.ALL_TO_ALL)
    cache = DescriptorCache(blob_store=BlobStore(str(tmp_path)), offload_threshold=1_000)
    references = _deploy(groups, cache, subpartitions=6)
    assert len(references) == 3
    assert all(ref.group is references[0].group for ref in references)
    assert isinstance(references[0].group.descriptors, InlineDescriptors)
    # Consumer k of 3 over 6 subpartitions reads [2k, 2k + 1].
    assert [ref.subpartitions for ref in references] == [
        SubpartitionRange(0, 1),
        SubpartitionRange(2, 3),
        SubpartitionRange(4, 5),
    ]
    gate = resolve_gate(references[1], blob_cache_bytes=1 << 20)
    assert gate.shuffle_descriptors == tuple(_descriptor("shuffled", i) for i in range(4))
    assert gate.consumed_subpartitions == SubpartitionRange(2, 3)
    assert not list(tmp_path.rglob("*"))  # nothing offloaded below the threshold


def test_the_list_is_compressed_well_below_its_serialized_size() -> None:
    groups = _groups(2_000, 2, DistributionPattern.ALL_TO_ALL)
    cache = DescriptorCache(blob_store=None, offload_threshold=1 << 62)
    shared = _deploy(groups, cache, subpartitions=2)[0].group.descriptors
    assert isinstance(shared, InlineDescriptors)
    group = groups.exchanges[0].consumed[0]
    serialized = serialize(ShuffleDescriptorGroup(tuple(_descriptors_of(group))))
    assert len(shared.compressed) < 0.2 * len(serialized)


def test_a_big_group_is_offloaded_and_fetched_once_per_process(tmp_path: Path) -> None:
    store = BlobStore(str(tmp_path))
    groups = _groups(8, 4, DistributionPattern.ALL_TO_ALL)  # 8 x 4 = 32 >= 32
    cache = DescriptorCache(blob_store=store, offload_threshold=32)
    references = _deploy(groups, cache, subpartitions=4)
    shared = references[0].group.descriptors
    assert isinstance(shared, OffloadedDescriptors)
    assert store.exists(shared.blob_key) and shared.blob_store_url == store.url
    gates = [resolve_gate(reference, blob_cache_bytes=1 << 20) for reference in references]
    blobs = process_blob_cache(store.url, 1 << 20)  # this process's cache of that store
    assert blobs.misses == 1 and blobs.hits == 3
    assert gates[3].shuffle_descriptors[7] == _descriptor("shuffled", 7)


def test_invalidating_a_group_deletes_its_blob_and_rebuilds_it(tmp_path: Path) -> None:
    store = BlobStore(str(tmp_path))
    groups = _groups(8, 4, DistributionPattern.ALL_TO_ALL)
    cache = DescriptorCache(blob_store=store, offload_threshold=1)
    [reference, *_] = _deploy(groups, cache, subpartitions=4)
    shared = reference.group.descriptors
    assert isinstance(shared, OffloadedDescriptors)
    cache.invalidate(groups.exchanges[0].consumed[0])
    assert not store.exists(shared.blob_key)
    with pytest.raises(BlobNotFoundError):
        resolve_gate(reference, blob_cache_bytes=1 << 20)
    # A rerun producer's new descriptor makes a different list.
    group = groups.exchanges[0].consumed[0]
    rerun = [*_descriptors_of(group)[:-1], _descriptor("shuffled-rerun", 7)]
    assert cache.shared(group, lambda _: rerun) != shared


def test_pointwise_consumers_sharing_a_partition_split_its_subpartitions() -> None:
    groups = _groups(2, 6, DistributionPattern.POINTWISE)  # partition 0 -> consumers 0..2
    cache = DescriptorCache(blob_store=None, offload_threshold=1 << 62)
    references = _deploy(groups, cache, subpartitions=6)
    assert [ref.subpartitions for ref in references[:3]] == [
        SubpartitionRange(0, 1),
        SubpartitionRange(2, 3),
        SubpartitionRange(4, 5),
    ]
    assert references[0].group.descriptors is references[2].group.descriptors
    assert references[0].group.descriptors is not references[3].group.descriptors
    gate = resolve_gate(references[4], blob_cache_bytes=1 << 20)
    assert gate.shuffle_descriptors == (_descriptor("shuffled", 1),)


def test_a_reference_to_a_producer_range_resolves_to_those_producers_only() -> None:
    groups = _groups(5, 1, DistributionPattern.ALL_TO_ALL)
    cache = DescriptorCache(blob_store=None, offload_threshold=1 << 62)
    [whole] = _deploy(groups, cache, subpartitions=1)
    sliced = GateReference(whole.group, whole.subpartitions, ProducerRange(1, 2))
    gate = resolve_gate(sliced, blob_cache_bytes=1 << 20)
    assert gate.shuffle_descriptors == (_descriptor("shuffled", 1), _descriptor("shuffled", 2))


def test_a_descriptor_count_that_does_not_match_the_group_is_refused() -> None:
    groups = _groups(3, 1, DistributionPattern.ALL_TO_ALL)
    cache = DescriptorCache(blob_store=None, offload_threshold=1 << 62)
    with pytest.raises(InvalidOperationError, match="3 partitions but 2 descriptors"):
        cache.shared(groups.exchanges[0].consumed[0], lambda _: [_descriptor("shuffled", 0)] * 2)


def test_a_blob_shared_by_two_groups_stays_until_both_are_invalidated(tmp_path: Path) -> None:
    store = BlobStore(str(tmp_path))
    cache = DescriptorCache(blob_store=store, offload_threshold=1)
    # Two reads of the same result: two group objects, the same descriptors, one blob.
    first, second = (
        _groups(3, 2, DistributionPattern.ALL_TO_ALL).exchanges[0].consumed[0] for _ in range(2)
    )
    shared = cache.shared(first, _descriptors_of)
    assert cache.shared(second, _descriptors_of) == shared
    assert isinstance(shared, OffloadedDescriptors)
    cache.invalidate(first)
    assert store.exists(shared.blob_key)
    cache.invalidate(second)
    assert not store.exists(shared.blob_key)


def test_reads_that_do_not_cover_every_consumer_are_refused() -> None:
    groups = _groups(4, 3, DistributionPattern.ALL_TO_ALL)
    cache = DescriptorCache(blob_store=None, offload_threshold=1 << 62)

    def reads(input_index: int, exchange_groups: ExchangeGroups) -> list[InputSlice]:
        return [InputSlice(SubpartitionRange(0, 1), ProducerRange(0, 3))] * 2

    with pytest.raises(InvalidOperationError, match="2 reads of input shuffled for 3 consumers"):
        consumer_deployments(groups, "reduce", cache, _descriptors_of, reads)


def test_a_stage_that_reads_no_exchange_gets_a_deployment_per_vertex_with_no_inputs() -> None:
    groups = _groups(3, 2, DistributionPattern.ALL_TO_ALL)
    cache = DescriptorCache(blob_store=None, offload_threshold=1 << 62)
    deployments = consumer_deployments(groups, "map", cache, _descriptors_of, even_reads(2))
    assert [(d.stage, d.index, d.inputs) for d in deployments] == [
        ("map", 0, ()),
        ("map", 1, ()),
        ("map", 2, ()),
    ]
