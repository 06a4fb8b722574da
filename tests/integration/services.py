"""The shuffle services the PySpark integration tests run on: each test module runs once per
service (the ``service`` fixture in conftest.py)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from external_shuffle import ExternalShuffleDescriptor
from external_shuffle.local_cluster import LocalCluster
from netty_like.descriptor import NettyShuffleDescriptor
from shuffle_api import ShuffleDescriptor
from shuffle_api.format import partition_directory
from shuffle_api.store import Store

__all__ = ["DEFAULT_SERVICE_ONLY", "ShuffleService", "external_service", "netty_service"]


DEFAULT_SERVICE_ONLY = pytest.mark.parametrize(
    "service", ["netty_like"], indirect=True, scope="module"
)
"""For tests whose variants differ in data, not in what a service does with it: the services
move the same Arrow IPC bytes, so these run on the default service alone (each operation runs
on both in test_pyspark_every_operation.py, and its plain case in its own module)."""


@dataclass
class ShuffleService:
    """How to configure a SparkShuffle for one service, and where its partitions land."""

    name: str
    settings: dict[str, object]
    stores: list[Path]
    cluster: LocalCluster | None = field(default=None, repr=False)

    def config(self, **extra: object) -> dict[str, object]:
        return {**self.settings, **extra}

    def stored_paths(self) -> set[str]:
        """Every file and directory under the service's stores (worker ids excluded)."""
        return {
            os.path.join(where, name)
            for store in self.stores
            for where, directories, files in os.walk(store)
            for name in [*directories, *files]
            if not name.startswith(".")
        }

    @staticmethod
    def partition_directories(descriptor: ShuffleDescriptor) -> list[str]:
        """Where the partition's files are: one directory per replica."""
        partition = descriptor.result_partition_id
        if isinstance(descriptor, NettyShuffleDescriptor):
            return [partition_directory(Store(descriptor.store_url), partition)]
        assert isinstance(descriptor, ExternalShuffleDescriptor)
        return [
            partition_directory(Store(replica.store_url), partition)
            for replica in descriptor.replicas
        ]


def netty_service(store: Path) -> ShuffleService:
    return ShuffleService("netty_like", {"netty-like.storage.url": str(store)}, [store])


def external_service(cluster: LocalCluster) -> ShuffleService:
    stores = [cluster.worker_store(index) for index in range(len(cluster.worker_ports))]
    return ShuffleService("external_shuffle", cluster.client_config(), stores, cluster)
