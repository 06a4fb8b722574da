"""netty_like's ShuffleMaster: descriptors point at the producer's process and data port.

Blocking partitions live on the configured store, so the master can check and delete them
itself wherever that store is shared with the producers (local disk on one host, object stores).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass, field

from netty_like.descriptor import NettyShuffleDescriptor
from netty_like.options import STORAGE_URL
from shuffle_api import (
    JobShuffleContext,
    PartitionCorruptedError,
    PartitionDescriptor,
    PartitionNotFoundError,
    PartitionWithMetrics,
    ProducerDescriptor,
    ResultPartitionID,
    ShuffleDescriptor,
    ShuffleError,
    ShuffleMaster,
    ShuffleMasterContext,
    ShuffleServiceClosedError,
)
from shuffle_api.format import PartitionFileReader, partition_directory
from shuffle_api.master import completed
from shuffle_api.store import Store

__all__ = ["NettyShuffleMaster"]


@dataclass
class _Job:
    context: JobShuffleContext
    partitions: dict[ResultPartitionID, tuple[PartitionDescriptor, NettyShuffleDescriptor]] = field(
        default_factory=dict
    )


class NettyShuffleMaster(ShuffleMaster):
    def __init__(self, context: ShuffleMasterContext) -> None:
        self._context = context
        self._store = Store(context.configuration.get(STORAGE_URL))
        self._jobs: dict[str, _Job] = {}
        self._lock = threading.Lock()
        self._started = False
        self._closed = False

    def start(self) -> None:
        self._started = True

    def close(self) -> None:
        if self._closed:
            return
        with self._lock:
            job_ids = list(self._jobs)
        for job_id in job_ids:
            self.unregister_job(job_id)
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise ShuffleServiceClosedError("netty_like shuffle master is closed")

    def register_job(self, context: JobShuffleContext) -> None:
        self._check_open()
        with self._lock:
            if context.job_id in self._jobs:
                raise ShuffleError(f"job {context.job_id!r} is already registered")
            self._jobs[context.job_id] = _Job(context)

    def unregister_job(self, job_id: str) -> None:
        with self._lock:
            job = self._jobs.pop(job_id, None)
        if job is None:
            return
        for partition_descriptor, descriptor in job.partitions.values():
            if not partition_descriptor.partition_type.is_persistent:
                self._delete(descriptor)

    def _job(self, job_id: str) -> _Job:
        with self._lock:
            job = self._jobs.get(job_id)
        if job is None:
            raise ShuffleError(f"job {job_id!r} is not registered with the shuffle master")
        return job

    def register_partition_with_producer(
        self,
        job_id: str,
        partition_descriptor: PartitionDescriptor,
        producer_descriptor: ProducerDescriptor,
    ) -> Future[ShuffleDescriptor]:
        self._check_open()
        job = self._job(job_id)
        partition = ResultPartitionID(
            partition_descriptor.partition_id, producer_descriptor.producer_execution_id
        )
        descriptor = NettyShuffleDescriptor(
            partition=partition,
            producer_location=producer_descriptor.producer_location,
            host=producer_descriptor.address,
            data_port=producer_descriptor.data_port,
            connection_index=partition_descriptor.connection_index,
            store_url=self._store.url,
        )
        with self._lock:
            job.partitions[partition] = (partition_descriptor, descriptor)
        return completed(descriptor)

    def release_partition_externally(self, shuffle_descriptor: ShuffleDescriptor) -> None:
        with self._lock:
            for job in self._jobs.values():
                job.partitions.pop(shuffle_descriptor.result_partition_id, None)
        if isinstance(shuffle_descriptor, NettyShuffleDescriptor):
            self._delete(shuffle_descriptor)

    def _delete(self, descriptor: NettyShuffleDescriptor) -> None:
        store = (
            self._store if descriptor.store_url == self._store.url else Store(descriptor.store_url)
        )
        # <result>/<index>/ too when this was their last attempt: nothing stays on the store.
        store.delete_tree(
            partition_directory(store, descriptor.result_partition_id), empty_parents=2
        )

    def partitions_with_metrics(self, job_id: str) -> Future[list[PartitionWithMetrics]]:
        """Blocking partitions with their manifest's statistics; ones whose files are gone are
        reported lost to the job's context."""
        job = self._job(job_id)
        with self._lock:
            tracked = list(job.partitions.values())
        result: list[PartitionWithMetrics] = []
        lost: list[ResultPartitionID] = []
        for partition_descriptor, descriptor in tracked:
            if not partition_descriptor.partition_type.is_reconsumable:
                continue
            try:
                reader = PartitionFileReader(self._store, descriptor.result_partition_id)
            except (PartitionNotFoundError, PartitionCorruptedError):
                lost.append(descriptor.result_partition_id)
                result.append(PartitionWithMetrics(descriptor, False, None))
                continue
            result.append(PartitionWithMetrics(descriptor, True, reader.manifest.statistics))
        if lost:
            with self._lock:
                for partition in lost:
                    job.partitions.pop(partition, None)
            job.context.stop_tracking_and_release_partitions(lost)
        return completed(result)
