"""The external service's ShuffleMaster: one application on the coordinator.

A heartbeat thread keeps the application alive (the coordinator deletes the data of an
application whose heartbeats stop) and brings back partitions lost with a worker, which are
reported to their job's :class:`~shuffle_api.JobShuffleContext`.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from concurrent.futures import Future

import grpc

from external_shuffle._proto import external_shuffle_pb2 as pb
from external_shuffle._proto import external_shuffle_pb2_grpc as pb_grpc
from external_shuffle.channels import ChannelPool, ClientSettings, as_future, calling
from external_shuffle.descriptor import ExternalShuffleDescriptor
from external_shuffle.options import (
    CLIENT_HEARTBEAT_INTERVAL,
    COORDINATOR_ADDRESS,
    REPLICATION_FACTOR,
)
from external_shuffle.wire import WorkerAddress, key_of, partition_of, statistics_from_pb
from shuffle_api import (
    JobShuffleContext,
    PartitionDescriptor,
    PartitionWithMetrics,
    ProducerDescriptor,
    ResultPartitionID,
    ShuffleDescriptor,
    ShuffleError,
    ShuffleMaster,
    ShuffleMasterContext,
    ShuffleServiceClosedError,
    new_id,
)
from shuffle_api.master import completed

__all__ = ["ExternalShuffleMaster"]

logger = logging.getLogger(__name__)


def descriptor_of(location: pb.PartitionLocation) -> ExternalShuffleDescriptor:
    return ExternalShuffleDescriptor(
        partition_of(location.partition),
        tuple(WorkerAddress.from_pb(replica) for replica in location.replicas),
    )


class ExternalShuffleMaster(ShuffleMaster):
    def __init__(self, context: ShuffleMasterContext) -> None:
        config = context.configuration
        self._settings = ClientSettings.from_configuration(config)
        self._channels = ChannelPool(self._settings)
        self._coordinator = config.get(COORDINATOR_ADDRESS)
        self._interval = config.get(CLIENT_HEARTBEAT_INTERVAL)
        self._replicas = config.get(REPLICATION_FACTOR)
        self.application_id = "app-" + new_id()
        self._jobs: dict[str, JobShuffleContext] = {}
        # What each job registered, so partitions the coordinator no longer knows (it lost
        # them, or the application expired) are reported unavailable, not forgotten.
        self._registered: dict[str, dict[ResultPartitionID, ExternalShuffleDescriptor]] = (
            defaultdict(dict)
        )
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._heartbeats: threading.Thread | None = None
        self._closed = False

    def _stub(self) -> pb_grpc.CoordinatorStub:
        return pb_grpc.CoordinatorStub(self._channels.get(self._coordinator))

    def _what(self, call: str) -> str:
        return f"{call} on coordinator {self._coordinator}"

    def _check_open(self) -> None:
        if self._closed:
            raise ShuffleServiceClosedError("external shuffle master is closed")

    def start(self) -> None:
        self._check_open()
        if self._heartbeats is not None:
            return
        with calling(self._what("registering application " + self.application_id)):
            self._stub().RegisterApplication(
                pb.RegisterApplicationRequest(application_id=self.application_id),
                timeout=self._settings.timeout,
            )
        self._heartbeats = threading.Thread(
            target=self._heartbeat_loop, name="pyshuffle-application-heartbeat", daemon=True
        )
        self._heartbeats.start()

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.heartbeat()
            except ShuffleError as error:
                logger.warning("application heartbeat failed: %s", error)

    def heartbeat(self) -> None:
        """Keep the application alive; report partitions the coordinator lost to their jobs."""
        with calling(self._what("application heartbeat")):
            response = self._stub().ApplicationHeartbeat(
                pb.ApplicationHeartbeatRequest(application_id=self.application_id),
                timeout=self._settings.timeout,
            )
        if not response.known:
            logger.error(
                "the coordinator expired application %s: its shuffle data is gone",
                self.application_id,
            )
            self._register_again()
            return
        lost: dict[str, list[ResultPartitionID]] = defaultdict(list)
        for item in response.lost:
            lost[item.job_id].append(partition_of(item.partition))
        for job_id, partitions in lost.items():
            self._report_lost(job_id, partitions)

    def _register_again(self) -> None:
        with calling(self._what("registering application " + self.application_id)):
            self._stub().RegisterApplication(
                pb.RegisterApplicationRequest(application_id=self.application_id),
                timeout=self._settings.timeout,
            )
            with self._lock:
                job_ids = list(self._jobs)
            for job_id in job_ids:
                self._stub().RegisterJob(
                    pb.RegisterJobRequest(application_id=self.application_id, job_id=job_id),
                    timeout=self._settings.timeout,
                )
        for job_id in job_ids:
            with self._lock:
                gone = list(self._registered[job_id])
            self._report_lost(job_id, gone)

    def _report_lost(self, job_id: str, partitions: list[ResultPartitionID]) -> None:
        with self._lock:
            context = self._jobs.get(job_id)
            registered = self._registered[job_id]
            # Each once: a heartbeat can bring one partitions_with_metrics already reported.
            partitions = [p for p in partitions if registered.pop(p, None) is not None]
        if context is not None and partitions:
            context.stop_tracking_and_release_partitions(partitions)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._heartbeats is not None:
            self._heartbeats.join(timeout=self._settings.timeout)
            try:
                self._stub().UnregisterApplication(
                    pb.UnregisterApplicationRequest(application_id=self.application_id),
                    timeout=self._settings.timeout,
                )
            except grpc.RpcError as error:
                logger.warning(
                    "unregistering application %s failed (the coordinator deletes its data"
                    " when it expires): %s",
                    self.application_id,
                    error,
                )
        self._channels.close()

    def register_job(self, context: JobShuffleContext) -> None:
        self._check_open()
        with calling(self._what("registering job " + context.job_id)):
            self._stub().RegisterJob(
                pb.RegisterJobRequest(application_id=self.application_id, job_id=context.job_id),
                timeout=self._settings.timeout,
            )
        with self._lock:
            if context.job_id in self._jobs:
                raise ShuffleError(f"job {context.job_id!r} is already registered")
            self._jobs[context.job_id] = context

    def unregister_job(self, job_id: str) -> None:
        with self._lock:
            if self._jobs.pop(job_id, None) is None:
                return
            self._registered.pop(job_id, None)
        with calling(self._what("unregistering job " + job_id)):
            self._stub().UnregisterJob(
                pb.UnregisterJobRequest(
                    application_id=self.application_id, job_id=job_id, keep_persistent=True
                ),
                timeout=self._settings.timeout,
            )

    def register_partition_with_producer(
        self,
        job_id: str,
        partition_descriptor: PartitionDescriptor,
        producer_descriptor: ProducerDescriptor,
    ) -> Future[ShuffleDescriptor]:
        self._check_open()
        partition = ResultPartitionID(
            partition_descriptor.partition_id, producer_descriptor.producer_execution_id
        )
        call = self._stub().RegisterPartition.future(
            pb.RegisterPartitionRequest(
                application_id=self.application_id,
                job_id=job_id,
                partition=key_of(partition),
                number_of_subpartitions=partition_descriptor.number_of_subpartitions,
                producer_host=producer_descriptor.address,
                replicas=self._replicas,
                persistent=partition_descriptor.partition_type.is_persistent,
            ),
            timeout=self._settings.timeout,
        )

        def registered(response: pb.RegisterPartitionResponse) -> ShuffleDescriptor:
            descriptor = descriptor_of(response.location)
            with self._lock:
                self._registered[job_id][partition] = descriptor
            return descriptor

        # NOT_FOUND here names an unknown application or job, never a lost partition.
        return as_future(call, registered, self._what(f"registering {partition}"))

    def release_partition_externally(self, shuffle_descriptor: ShuffleDescriptor) -> None:
        partition = shuffle_descriptor.result_partition_id
        with self._lock:
            for registered in self._registered.values():
                registered.pop(partition, None)
        with calling(self._what(f"releasing {partition}")):
            self._stub().ReleasePartitions(
                pb.ReleasePartitionsRequest(
                    application_id=self.application_id, partitions=[key_of(partition)]
                ),
                timeout=self._settings.timeout,
            )

    def partitions_with_metrics(self, job_id: str) -> Future[list[PartitionWithMetrics]]:
        """Every partition the job registered: available with its statistics if a live worker
        has it committed; the others are reported lost to the job (and their leftovers
        deleted)."""
        with calling(self._what(f"status of job {job_id}")):
            response = self._stub().GetPartitionStatus(
                pb.GetPartitionStatusRequest(application_id=self.application_id, job_id=job_id),
                timeout=self._settings.timeout,
            )
        known = {partition_of(status.location.partition): status for status in response.partitions}
        with self._lock:
            registered = dict(self._registered.get(job_id, {}))
        result: list[PartitionWithMetrics] = []
        lost: list[ResultPartitionID] = []
        for partition, descriptor in registered.items():
            status = known.get(partition)
            if status is None or not status.available:
                lost.append(partition)
                result.append(PartitionWithMetrics(descriptor, False, None))
            else:
                statistics = statistics_from_pb(status.statistics)
                result.append(PartitionWithMetrics(descriptor, True, statistics))
        if lost:
            self._report_lost(job_id, lost)
            self._release_quietly(lost)
        return completed(result)

    def _release_quietly(self, partitions: list[ResultPartitionID]) -> None:
        try:
            self._stub().ReleasePartitions(
                pb.ReleasePartitionsRequest(
                    application_id=self.application_id,
                    partitions=[key_of(partition) for partition in partitions],
                ),
                timeout=self._settings.timeout,
            )
        except grpc.RpcError as error:
            logger.warning("releasing lost partitions failed: %s", error)
