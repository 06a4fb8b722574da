"""Shared by the tests of the external service on real daemons (LocalCluster): data, clients,
and what the workers' stores hold."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import grpc
import pyarrow as pa

from external_shuffle.client.descriptor import ExternalShuffleDescriptor
from external_shuffle.client.master import ExternalShuffleMaster
from external_shuffle.local_cluster import LocalCluster
from external_shuffle.wire.messages import WorkerAddress
from external_shuffle.wire.stubs import pb, pb_grpc
from shuffle_api import (
    Configuration,
    ResultPartitionID,
    ShuffleDescriptor,
    ShuffleMaster,
    SubpartitionRange,
)
from shuffle_api.testing import ConformanceHarness, ShuffleScenario, make_batches
from shuffle_runtime.format import partition_directory
from shuffle_runtime.store import Store

ROWS = 4_000
PARTITIONS = 4
SUBPARTITIONS = 2
ALL = SubpartitionRange(0, SUBPARTITIONS - 1)


def batches(rows: int = ROWS) -> list[pa.RecordBatch]:
    return make_batches(rows, batch_rows=500)


def client_config(cluster: LocalCluster, **extra: object) -> Configuration:
    """Small buffers, reads that go to the workers (not straight to their stores), and one
    replica unless ``extra`` says otherwise: what a worker's loss costs is seen whole."""
    return Configuration.load(
        cluster.client_config(
            **{
                "external-shuffle.replication-factor": 1,
                "external-shuffle.client.sort-buffer.size": "64k",
                "external-shuffle.client.read-from-store": False,
                "external-shuffle.client.timeout": 10.0,
                **extra,
            }
        ),
        environ={},
    )


@contextmanager
def scenario_on(cluster: LocalCluster, **extra: object) -> Iterator[ShuffleScenario]:
    with ShuffleScenario.open(ConformanceHarness(client_config(cluster, **extra))) as scenario:
        yield scenario


def rows_of(table: pa.Table) -> list[int]:
    return sorted(table.column("row").to_pylist())


def external(master: ShuffleMaster) -> ExternalShuffleMaster:
    assert isinstance(master, ExternalShuffleMaster)
    return master


def replicas(descriptor: ShuffleDescriptor) -> tuple[WorkerAddress, ...]:
    assert isinstance(descriptor, ExternalShuffleDescriptor)
    return descriptor.replicas


def worker_index(cluster: LocalCluster, address: WorkerAddress) -> int:
    return cluster.worker_ports.index(address.port)


def placed_on(cluster: LocalCluster, descriptor: ShuffleDescriptor) -> set[int]:
    return {worker_index(cluster, replica) for replica in replicas(descriptor)}


def partition_files(cluster: LocalCluster, index: int) -> list[Path]:
    """Files of partitions on a worker's store (not its identity file)."""
    return cluster.partition_files(index)


def on_store(cluster: LocalCluster, index: int, partition: ResultPartitionID) -> bool:
    store = Store(str(cluster.worker_store(index)))
    return Path(partition_directory(store, partition)).exists()


def on_any_store(cluster: LocalCluster, partition: ResultPartitionID) -> bool:
    return any(on_store(cluster, i, partition) for i in range(len(cluster.worker_ports)))


def ids(descriptors: Sequence[ShuffleDescriptor]) -> list[ResultPartitionID]:
    return sorted(descriptor.result_partition_id for descriptor in descriptors)


def list_workers(cluster: LocalCluster) -> list[pb.ListWorkersResponse.Entry]:
    token = cluster.token_file.read_text().strip()
    with grpc.insecure_channel(cluster.coordinator_targets[0]) as channel:
        answer = pb_grpc.CoordinatorStub(channel).ListWorkers(
            pb.ListWorkersRequest(), metadata=[("authorization", f"Bearer {token}")], timeout=10
        )
    return list(answer.workers)


def scrape(cluster: LocalCluster, name: str) -> dict[str, float]:
    """The samples of one daemon's /metrics endpoint (``metrics=True``), by name with labels."""
    url = f"http://127.0.0.1:{cluster.metrics_ports[name]}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            sample, _, value = line.rpartition(" ")
            samples[sample] = float(value)
    return samples
