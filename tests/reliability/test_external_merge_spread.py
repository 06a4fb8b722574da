"""Merges on the external service spread over the workers that hold their sources: with
every map output on both workers, neighbouring merged partitions go to different workers,
whichever of them the coordinator made each source's primary (two merges on one worker
share its one interpreter while the other idles)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from external_shuffle.client.descriptor import ExternalShuffleDescriptor
from external_shuffle.local_cluster import LocalCluster
from shuffle_api import (
    ResultPartitionDeploymentDescriptor,
    ResultPartitionID,
    ShuffleIOOwner,
    UnknownShuffleDescriptor,
    new_id,
)
from tests.reliability.external_cluster import ROWS, batches, on_store, scenario_on

SOURCES = 4
SUBPARTITIONS = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("cluster"), workers=2) as running:
        yield running


def test_neighbouring_merges_go_to_different_holders(cluster: LocalCluster) -> None:
    with scenario_on(cluster, **{"external-shuffle.replication-factor": 2}) as scenario:
        outputs, _ = scenario.produce(batches(), partitions=SOURCES, subpartitions=SUBPARTITIONS)
        placed = [output for output in outputs if isinstance(output, ExternalShuffleDescriptor)]
        assert len(placed) == SOURCES
        first = placed[0]
        assert len(first.replicas) == 2
        holders = []
        # The same sources named with their replicas in each order: as sources whose
        # primaries differ are named.
        for group, replicas in enumerate((first.replicas, first.replicas[::-1])):
            sources = [dataclasses.replace(output, replicas=replicas) for output in placed]
            descriptor = scenario.partition_descriptor(
                SOURCES + group, partitions=SOURCES + 2, subpartitions=SUBPARTITIONS
            )
            merged = ResultPartitionID(descriptor.partition_id, "merge-" + new_id())
            written = scenario.producer.merge_partitions(
                ShuffleIOOwner("merge", merged.producer_attempt_id),
                sources,
                ResultPartitionDeploymentDescriptor(descriptor, UnknownShuffleDescriptor(merged)),
            )
            assert written is not None
            assert sum(written.rows_per_subpartition) == ROWS
            holders.append([index for index in range(2) if on_store(cluster, index, merged)])
        assert sorted(holders) == [[0], [1]]
