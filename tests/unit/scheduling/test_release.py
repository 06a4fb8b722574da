"""Partitions are released through the real default service's master once every region that
consumes them has finished; persistent ones stay; a rerun producer's group is rebuilt."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from blob import BlobStore
from scheduling.deployment import DescriptorCache, OffloadedDescriptors
from scheduling.graph import ExecutionVertexID, Stage, StageExchange, StageGraph
from scheduling.groups import build_groups
from scheduling.regions import RegionTopology, build_regions
from scheduling.release import PartitionReleaser
from shuffle_api import (
    Configuration,
    DistributionPattern,
    ResultPartitionType,
    ShuffleDescriptor,
)
from shuffle_api.testing import ConformanceHarness, ShuffleScenario, make_batches


@pytest.fixture
def scenario(tmp_path: Path) -> Iterator[ShuffleScenario]:
    harness = ConformanceHarness(Configuration.load({"netty-like.storage.url": str(tmp_path)}))
    with ShuffleScenario.open(harness) as opened:
        yield opened


def _stored(scenario: ShuffleScenario) -> set[ShuffleDescriptor]:
    metrics = scenario.master.partitions_with_metrics(scenario.job.job_id).result()
    return {each.shuffle_descriptor for each in metrics if each.available}


def _graph(
    result_id: str,
    consumers: int,
    pattern: DistributionPattern,
    partition_type: ResultPartitionType = ResultPartitionType.BLOCKING,
) -> StageGraph:
    return StageGraph(
        [Stage("map", 3), Stage("reduce", consumers)],
        [StageExchange(result_id, "map", "reduce", pattern, partition_type)],
    )


def _tracked(
    scenario: ShuffleScenario,
    graph: StageGraph,
    descriptors: list[ShuffleDescriptor],
    cache: DescriptorCache | None = None,
) -> tuple[RegionTopology, PartitionReleaser]:
    """Regions of ``graph`` and a releaser tracking the produced ``descriptors``."""
    regions = build_regions(graph)
    releaser = PartitionReleaser(
        build_groups(graph), regions, scenario.master, descriptor_cache=cache
    )
    for index, descriptor in enumerate(descriptors):
        releaser.track(scenario.result_id, index, descriptor)
    return regions, releaser


def test_all_to_all_partitions_go_when_the_last_consumer_region_finishes(
    scenario: ShuffleScenario,
) -> None:
    descriptors, _ = scenario.produce(
        make_batches(300, batch_rows=50), partitions=3, subpartitions=2
    )
    graph = _graph(scenario.result_id, 2, DistributionPattern.ALL_TO_ALL)
    regions, releaser = _tracked(scenario, graph, descriptors)
    first, second = (regions.region_of(ExecutionVertexID("reduce", i)) for i in range(2))
    assert releaser.region_finished(first) == []
    assert _stored(scenario) == set(descriptors)
    assert sorted(releaser.region_finished(second), key=str) == sorted(descriptors, key=str)
    assert _stored(scenario) == set()
    assert releaser.tracked() == []


def test_pointwise_partitions_go_as_soon_as_their_own_consumer_finishes(
    scenario: ShuffleScenario,
) -> None:
    descriptors, _ = scenario.produce(
        make_batches(300, batch_rows=50), partitions=3, subpartitions=1
    )
    # 3 producers -> 2 consumers: consumer 0 reads partition 0, consumer 1 partitions 1 and 2.
    graph = _graph(scenario.result_id, 2, DistributionPattern.POINTWISE)
    regions, releaser = _tracked(scenario, graph, descriptors)
    assert releaser.region_finished(regions.region_of(ExecutionVertexID("reduce", 1))) == [
        descriptors[1],
        descriptors[2],
    ]
    assert _stored(scenario) == {descriptors[0]}


def test_a_restarted_consumer_region_holds_its_partitions_again(
    scenario: ShuffleScenario,
) -> None:
    descriptors, _ = scenario.produce(
        make_batches(100, batch_rows=50), partitions=3, subpartitions=2
    )
    graph = _graph(scenario.result_id, 2, DistributionPattern.ALL_TO_ALL)
    regions, releaser = _tracked(scenario, graph, descriptors)
    first, second = (regions.region_of(ExecutionVertexID("reduce", i)) for i in range(2))
    releaser.region_finished(first)
    releaser.region_restarted(first)  # failover: it must read them again
    assert releaser.region_finished(second) == []
    assert _stored(scenario) == set(descriptors)
    assert len(releaser.region_finished(first)) == 3


def test_persistent_partitions_are_kept(scenario: ShuffleScenario) -> None:
    persistent = ResultPartitionType.BLOCKING_PERSISTENT
    descriptors, _ = scenario.produce(
        make_batches(100, batch_rows=50), partitions=3, subpartitions=1, partition_type=persistent
    )
    graph = _graph(scenario.result_id, 1, DistributionPattern.ALL_TO_ALL, persistent)
    regions, releaser = _tracked(scenario, graph, descriptors)
    assert releaser.region_finished(regions.region_of(ExecutionVertexID("reduce", 0))) == []
    assert _stored(scenario) == set(descriptors)


def test_a_rerun_producer_and_a_released_group_drop_the_shared_blob(
    scenario: ShuffleScenario, tmp_path: Path
) -> None:
    descriptors, _ = scenario.produce(
        make_batches(100, batch_rows=50), partitions=3, subpartitions=2
    )
    graph = _graph(scenario.result_id, 2, DistributionPattern.ALL_TO_ALL)
    regions = build_regions(graph)
    groups = build_groups(graph)
    store = BlobStore(str(tmp_path / "blobs"))
    cache = DescriptorCache(blob_store=store, offload_threshold=1)
    releaser = PartitionReleaser(groups, regions, scenario.master, descriptor_cache=cache)
    for index, descriptor in enumerate(descriptors):
        releaser.track(scenario.result_id, index, descriptor)
        groups.partition_finished(scenario.result_id, index)
    [group] = groups.exchanges[0].consumed
    shared = cache.shared(group, lambda _: descriptors)
    assert isinstance(shared, OffloadedDescriptors) and store.exists(shared.blob_key)
    assert releaser.producer_rerun(scenario.result_id, 1) == descriptors[1]
    assert not store.exists(shared.blob_key)
    assert not group.is_ready  # waits for the rerun's partition
    rebuilt = cache.shared(group, lambda _: descriptors)
    assert isinstance(rebuilt, OffloadedDescriptors)
    for index in range(2):
        releaser.region_finished(regions.region_of(ExecutionVertexID("reduce", index)))
    assert not store.exists(rebuilt.blob_key)
    # Partition 1 is no longer tracked, so the releaser left it to the caller.
    assert _stored(scenario) == {descriptors[1]}
