"""The external service's coordinator spreads partitions evenly over its workers (balanced
placement from scheduling.placement). Real daemon processes on 127.0.0.1 (LocalCluster)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest

from external_shuffle.client.descriptor import ExternalShuffleDescriptor
from external_shuffle.local_cluster import LocalCluster
from shuffle_api import Configuration, ShuffleDescriptor, ShuffleError
from shuffle_api.testing import ConformanceHarness, ShuffleScenario

WORKERS = 3
PARTITIONS = 30


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("placement"), workers=WORKERS) as running:
        yield running


def register_partitions(cluster: LocalCluster, **settings: object) -> list[ShuffleDescriptor]:
    """Register PARTITIONS partitions of one result through the master (nothing written)."""
    config = Configuration.load(cluster.client_config(**settings), environ={})
    with ShuffleScenario.open(ConformanceHarness(config)) as scenario:
        return [
            scenario.register(
                scenario.partition_descriptor(i, partitions=PARTITIONS, subpartitions=1)
            )
            for i in range(PARTITIONS)
        ]


def replica_worker_ids(descriptor: ShuffleDescriptor) -> list[str]:
    assert isinstance(descriptor, ExternalShuffleDescriptor)
    return [replica.worker_id for replica in descriptor.replicas]


def test_coordinator_places_30_partitions_10_on_each_of_3_workers(cluster: LocalCluster) -> None:
    descriptors = register_partitions(cluster, **{"external-shuffle.replication-factor": 1})
    held = Counter(worker for d in descriptors for worker in replica_worker_ids(d))
    assert len(held) == WORKERS, f"placed on {sorted(held)}"
    assert sorted(held.values()) == [10, 10, 10]


def test_coordinator_places_two_replicas_on_distinct_workers_20_on_each(
    cluster: LocalCluster,
) -> None:
    descriptors = register_partitions(cluster, **{"external-shuffle.replication-factor": 2})
    assert all(len(set(replica_worker_ids(d))) == 2 for d in descriptors)
    held = Counter(worker for d in descriptors for worker in replica_worker_ids(d))
    assert len(held) == WORKERS, f"placed on {sorted(held)}"
    assert sorted(held.values()) == [20, 20, 20]


def test_a_coordinator_without_workers_refuses_to_place_and_says_why(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    with (
        LocalCluster(tmp_path_factory.mktemp("no-workers"), workers=0) as empty,
        pytest.raises(ShuffleError, match="no live worker takes partitions") as refused,
    ):
        # Retried a while (workers register soon after a coordinator restarts), then refused.
        register_partitions(empty, **{"external-shuffle.client.retry-timeout": 0.5})
    assert "gave up after retrying for 0.5 s" in str(refused.value)
