"""external_shuffle passes the conformance suite against real daemon processes: reading
straight from the workers' shared stores, and fetching over gRPC from two replicas."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from external_shuffle.client.environment import SUPPORTED_PARTITION_TYPES
from external_shuffle.local_cluster import LocalCluster
from shuffle_api import Configuration, ShuffleDescriptor
from shuffle_api.testing import ConformanceHarness, ShuffleScenario, ShuffleServiceConformance
from shuffle_runtime.format import partition_directory
from shuffle_runtime.store import Store


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("cluster"), workers=2) as running:
        yield running


def stored_files(cluster: LocalCluster) -> list[str]:
    """Partition files on every worker's store (not the worker's identity file)."""
    return sorted(
        str(path)
        for index in range(len(cluster.worker_ports))
        for path in cluster.worker_store(index).rglob("*")
        if path.is_file() and not path.name.startswith(".")
    )


def delete_from_workers(
    cluster: LocalCluster,
) -> Callable[[ShuffleScenario, ShuffleDescriptor], None]:
    """Data lost behind the service's back: the partition's files vanish from the stores."""

    def lose(scenario: ShuffleScenario, descriptor: ShuffleDescriptor) -> None:
        for index in range(len(cluster.worker_ports)):
            store = Store(str(cluster.worker_store(index)))
            store.delete_tree(partition_directory(store, descriptor.result_partition_id))

    return lose


def _harness(cluster: LocalCluster, **settings: object) -> ConformanceHarness:
    config = Configuration.load(
        cluster.client_config(**{"external-shuffle.client.sort-buffer.size": "4m", **settings}),
        environ={},
    )
    return ConformanceHarness(
        config,
        stored_files=lambda: stored_files(cluster),
        partition_types=SUPPORTED_PARTITION_TYPES,
        lose_partition=delete_from_workers(cluster),
        merges=True,
    )


class TestExternalShuffleReadingSharedStores(ShuffleServiceConformance):
    @pytest.fixture
    def harness(self, cluster: LocalCluster) -> ConformanceHarness:
        return _harness(cluster)


class TestExternalShuffleFetchingFromReplicas(ShuffleServiceConformance):
    @pytest.fixture
    def harness(self, cluster: LocalCluster) -> ConformanceHarness:
        return _harness(
            cluster,
            **{
                "external-shuffle.client.read-from-store": False,
                "external-shuffle.replication-factor": 2,
                "shuffle.compression.codec": "zstd",
                "external-shuffle.client.chunk-size": "64k",
                # Runs longer than a message: the worker cuts them, the gate joins them.
                "external-shuffle.max-message-size": "128k",
            },
        )
