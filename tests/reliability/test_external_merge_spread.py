"""Merges on the external service spread over the workers that hold their sources: with
every map output on both workers, neighbouring merged partitions go to different workers,
whichever of them the coordinator made each source's primary (two merges on one worker
share its one interpreter while the other idles)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from external_shuffle.client.descriptor import ExternalShuffleDescriptor
from external_shuffle.local_cluster import LocalCluster
from shuffle_api import (
    Configuration,
    ResultPartitionDeploymentDescriptor,
    ResultPartitionID,
    ShuffleIOOwner,
    UnknownShuffleDescriptor,
    new_id,
)
from shuffle_api.testing import ConformanceHarness, ShuffleScenario, make_batches
from shuffle_runtime.format import partition_directory
from shuffle_runtime.store import Store

SOURCES = 4
SUBPARTITIONS = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("cluster"), workers=2) as running:
        yield running


def _holders(cluster: LocalCluster, partition: ResultPartitionID) -> list[int]:
    """The workers (by index) whose stores hold ``partition``."""
    held = []
    for index in range(len(cluster.worker_ports)):
        store = Store(str(cluster.worker_store(index)))
        if Path(partition_directory(store, partition)).is_dir():
            held.append(index)
    return held


def test_neighbouring_merges_go_to_different_holders(cluster: LocalCluster) -> None:
    config = Configuration.load(
        cluster.client_config(**{"external-shuffle.replication-factor": 2}), environ={}
    )
    with ShuffleScenario.open(ConformanceHarness(config, merges=True)) as scenario:
        outputs, _ = scenario.produce(
            make_batches(2_000, batch_rows=250), partitions=SOURCES, subpartitions=SUBPARTITIONS
        )
        placed_outputs = [
            output for output in outputs if isinstance(output, ExternalShuffleDescriptor)
        ]
        assert len(placed_outputs) == SOURCES
        first = placed_outputs[0]
        assert len(first.replicas) == 2
        placed = []
        # The same sources named with their replicas in each order: as sources whose
        # primaries differ are named.
        for group, replicas in enumerate((first.replicas, first.replicas[::-1])):
            sources = [dataclasses.replace(output, replicas=replicas) for output in placed_outputs]
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
            assert sum(written.rows_per_subpartition) == 2_000
            placed.append(_holders(cluster, merged))
        assert sorted(placed) == [[0], [1]]
