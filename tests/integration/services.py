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
from shuffle_runtime.format import partition_directory
from shuffle_runtime.format.manifest import DATA_FILE
from shuffle_runtime.store import Store

__all__ = [
    "DEFAULT_SERVICE_ONLY",
    "ShuffleService",
    "external_service",
    "netty_service",
    "object_store_service",
]


DEFAULT_SERVICE_ONLY = pytest.mark.parametrize(
    "service", ["netty_like"], indirect=True, scope="module"
)
"""For tests whose variants differ in data, not in what a service does with it: the services
move the same Arrow IPC bytes, so these run on the default service alone (each operation runs
on both in test_pyspark_every_operation.py, and its plain case in its own module)."""


@dataclass
class ShuffleService:
    """How to configure a SparkShuffle for one service, and where its partitions land
    (``stores``: its local directories, none on an object store)."""

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
        return [
            partition_directory(store, descriptor.result_partition_id)
            for store in _stores_of(descriptor)
        ]

    @staticmethod
    def partition_stored(descriptor: ShuffleDescriptor) -> bool:
        """Whether any of the partition's files are on any of its stores."""
        partition = descriptor.result_partition_id
        return any(
            store.exists(partition_directory(store, partition)) for store in _stores_of(descriptor)
        )

    @staticmethod
    def delete_partition(descriptor: ShuffleDescriptor) -> None:
        """Delete the partition's files behind the service's back, from every replica."""
        for store in _stores_of(descriptor):
            store.delete_tree(partition_directory(store, descriptor.result_partition_id))

    @staticmethod
    def corrupt_partition(descriptor: ShuffleDescriptor) -> None:
        """Flip a byte three quarters into the partition's data file, on every replica: the
        runs before it read well, the one it is in fails its checksum."""
        for store in _stores_of(descriptor):
            directory = partition_directory(store, descriptor.result_partition_id)
            data = Path(directory) / DATA_FILE
            content = bytearray(data.read_bytes())
            content[len(content) * 3 // 4] ^= 0xFF
            data.write_bytes(bytes(content))


def _stores_of(descriptor: ShuffleDescriptor) -> list[Store]:
    if isinstance(descriptor, NettyShuffleDescriptor):
        return [Store(descriptor.store_url)]
    assert isinstance(descriptor, ExternalShuffleDescriptor)
    return [Store(replica.store_url) for replica in descriptor.replicas]


def netty_service(store: Path) -> ShuffleService:
    return ShuffleService("netty_like", {"netty-like.storage.url": str(store)}, [store])


def external_service(cluster: LocalCluster) -> ShuffleService:
    stores = [cluster.worker_store(index) for index in range(len(cluster.worker_ports))]
    return ShuffleService("external_shuffle", cluster.client_config(), stores, cluster)


def object_store_service(name: str, store_url: str, cluster: LocalCluster | None) -> ShuffleService:
    """A service on an object store: the default one with ``store_url`` as its storage, or
    ``cluster``'s workers (whose stores are under ``store_url``) read from it straight."""
    if cluster is None:
        return ShuffleService(name, {"netty-like.storage.url": store_url}, [])
    return ShuffleService(name, cluster.client_config(), [], cluster)
