"""The external service's ShuffleEnvironment: writers push to workers, gates fetch from them.
Nothing stays in this process, so it can go away as soon as its tasks are done."""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence

import grpc

from external_shuffle.allocator import keep_message_buffers
from external_shuffle.client.coordinators import Coordinators
from external_shuffle.client.descriptor import ExternalShuffleDescriptor
from external_shuffle.client.gate import ExternalGateSettings, ExternalInputGate
from external_shuffle.client.push import PushSettings, PushSink
from external_shuffle.options import (
    CLIENT_APPLICATION,
    CLIENT_RETRY_TIMEOUT,
    CLIENT_TIMEOUT,
    MAX_IN_FLIGHT,
    READ_FROM_STORE,
    REPLICATION_FACTOR,
    SORT_BUFFER_SIZE,
    USE_DATA_PORT,
    coordinator_addresses,
    message_chunk_size,
    message_data_limit,
)
from external_shuffle.wire.auth import data_port_client_tls
from external_shuffle.wire.channels import ChannelPool, ClientSettings, translate_rpc_error
from external_shuffle.wire.credentials import data_port_identity
from external_shuffle.wire.messages import WorkerAddress, key_of, statistics_from_pb
from external_shuffle.wire.stubs import pb, pb_grpc
from shuffle_api import (
    LOCAL_ONLY_PORT,
    InputGate,
    InputGateDeploymentDescriptor,
    InvalidOperationError,
    PartitionDescriptor,
    PartitionInfo,
    PartitionStatistics,
    ProducerDescriptor,
    ResultPartitionDeploymentDescriptor,
    ResultPartitionID,
    ResultPartitionType,
    ResultPartitionWriter,
    ShuffleDescriptor,
    ShuffleEnvironment,
    ShuffleEnvironmentContext,
    ShuffleError,
    ShuffleIOOwner,
    ShuffleServiceClosedError,
    TransportError,
)
from shuffle_api.options import (
    COMPRESSION_AUTO_BANDWIDTH,
    COMPRESSION_CODEC,
    READ_SOURCES_IN_FLIGHT,
    TARGET_BATCH_SIZE,
)
from shuffle_runtime.connections import ConnectionPool
from shuffle_runtime.format import SortMergePartitionWriter, check_merge_target
from shuffle_runtime.gate import OpenGates

__all__ = ["SUPPORTED_PARTITION_TYPES", "ExternalShuffleEnvironment"]

logger = logging.getLogger(__name__)

SUPPORTED_PARTITION_TYPES = (
    ResultPartitionType.BLOCKING,
    ResultPartitionType.BLOCKING_PERSISTENT,
    ResultPartitionType.HYBRID_FULL,
)
"""Partitions the daemon stores whole; it does not stream partitions while they are produced."""


_MERGED_BLOCKS_PER_TIMEOUT = 1_000_000
"""Blocks (sources x subpartitions) a merge is given the client timeout for: a worker merges
some 150,000 small blocks a second (docs/format.md), so a million leave it five times over."""


def _common_replicas(sources: Sequence[ShuffleDescriptor]) -> tuple[WorkerAddress, ...]:
    """The workers that hold every one of ``sources`` (by worker id: neighbouring merges of
    sources whose primaries differ still go to different workers), where they are all this
    service's and of one merge site (placed on the same workers); else none."""
    first = sources[0] if sources else None
    if not isinstance(first, ExternalShuffleDescriptor):
        return ()
    site = first.merge_site()
    if any(
        not isinstance(each, ExternalShuffleDescriptor) or each.merge_site() != site
        for each in sources
    ):
        return ()
    return tuple(sorted(first.replicas, key=lambda replica: replica.worker_id))


class ExternalShuffleEnvironment(ShuffleEnvironment):
    def __init__(self, context: ShuffleEnvironmentContext) -> None:
        config = context.configuration
        self._config = config
        self._resource_id = context.resource_id
        self._host = context.host
        settings = ClientSettings.from_configuration(config)
        keep_message_buffers(settings.max_message_size)
        self._channels = ChannelPool(settings)
        self._coordinators = Coordinators(
            coordinator_addresses(config),
            self._channels,
            retry_timeout=config.get(CLIENT_RETRY_TIMEOUT),
        )
        self._timeout = config.get(CLIENT_TIMEOUT)
        self._push = PushSettings(
            chunk_size=message_chunk_size(config),
            max_in_flight=config.get(MAX_IN_FLIGHT),
            timeout=self._timeout,
            application_id=config.get(CLIENT_APPLICATION),
        )
        self._gate_settings = ExternalGateSettings(
            read_from_store=config.get(READ_FROM_STORE),
            unknown_timeout=self._timeout,
            max_chunk_bytes=message_data_limit(config),
            timeout=self._timeout,
            sources_in_flight=config.get(READ_SOURCES_IN_FLIGHT),
        )
        self._data_ports = (
            ConnectionPool(
                settings.token.encode("utf-8"),
                identity=data_port_identity(settings.token),
                tls=data_port_client_tls(config),
            )
            if config.get(USE_DATA_PORT)
            else None
        )
        self._gates = OpenGates()
        # Workers whose data port is unreachable; gates add to it (a set's add is atomic).
        self._grpc_only: set[str] = set()
        self._closed = False

    @property
    def resource_id(self) -> str:
        return self._resource_id

    def start(self) -> int:
        return LOCAL_ONLY_PORT

    def producer_descriptor(self, producer_execution_id: str) -> ProducerDescriptor:
        return ProducerDescriptor(
            self._resource_id, producer_execution_id, self._host, LOCAL_ONLY_PORT
        )

    def _check_open(self) -> None:
        if self._closed:
            raise ShuffleServiceClosedError(f"shuffle environment {self._resource_id} is closed")

    def create_result_partition_writers(
        self, owner: ShuffleIOOwner, descriptors: Sequence[ResultPartitionDeploymentDescriptor]
    ) -> list[ResultPartitionWriter]:
        self._check_open()
        for descriptor in descriptors:
            if descriptor.partition_type not in SUPPORTED_PARTITION_TYPES:
                raise InvalidOperationError(
                    f"external_shuffle stores partitions whole and cannot stream a"
                    f" {descriptor.partition_type.name} partition; use one of"
                    f" {', '.join(t.name for t in SUPPORTED_PARTITION_TYPES)}"
                )
        return [self._new_writer(descriptor) for descriptor in descriptors]

    def _new_writer(self, descriptor: ResultPartitionDeploymentDescriptor) -> ResultPartitionWriter:
        return SortMergePartitionWriter(
            self.partition_sink(descriptor),
            descriptor.number_of_subpartitions,
            codec=self._config.get(COMPRESSION_CODEC),
            auto_bandwidth=self._config.get(COMPRESSION_AUTO_BANDWIDTH),
            memory_budget=self._config.get(SORT_BUFFER_SIZE),
            target_batch_bytes=self._config.get(TARGET_BATCH_SIZE),
        )

    def partition_sink(self, descriptor: ResultPartitionDeploymentDescriptor) -> PushSink:
        """Where a writer of ``descriptor``'s partition sends its files: its workers (placed
        now if the descriptor does not name them yet)."""
        partition = descriptor.result_partition_id
        shuffle_descriptor = descriptor.shuffle_descriptor
        if shuffle_descriptor.is_unknown:
            shuffle_descriptor = self._place(descriptor.partition_descriptor, partition)
        elif not isinstance(shuffle_descriptor, ExternalShuffleDescriptor):
            raise ShuffleError(
                f"external_shuffle cannot write {partition}: its descriptor is a"
                f" {type(shuffle_descriptor).__name__}"
            )
        return PushSink(shuffle_descriptor, self._channels, self._push, self.report_unreachable)

    def _place(
        self,
        descriptor: PartitionDescriptor,
        partition: ResultPartitionID,
        on: Sequence[WorkerAddress] = (),
    ) -> ExternalShuffleDescriptor:
        """Ask the coordinator where to push a partition whose descriptor is still unknown
        (the engine registers it with the master after the task; it gets the same place), or
        tell it the partition is to be ``on`` these workers.
        Placed for the application the master named, if it did: kept while it lives."""
        request = pb.RegisterPartitionRequest(
            application_id=self._push.application_id,
            partition=key_of(partition),
            number_of_subpartitions=descriptor.number_of_subpartitions,
            producer_host=self._host,
            replicas=len(on) or self._config.get(REPLICATION_FACTOR),
            persistent=descriptor.partition_type.is_persistent,
            placed_on=[worker.to_pb() for worker in on],
        )
        response = self._coordinators.first(
            f"placing {partition}",
            lambda address: self._coordinators.stub(address).RegisterPartition(
                request, timeout=self._timeout
            ),
        )
        # One that misses it learns it from the driver (this partition's registration).
        self._coordinators.announce(request, response.location)
        return ExternalShuffleDescriptor.placed(response)

    def merge_partitions(
        self,
        owner: ShuffleIOOwner,
        sources: Sequence[ShuffleDescriptor],
        merged: ResultPartitionDeploymentDescriptor,
    ) -> PartitionStatistics | None:
        """Merged by a worker that holds every source (one copy: the sources keep their
        replicas, and reducers read those where the merged partition fails); None for sources
        not all on the same workers, or a merged partition placed already on others. Placed
        already on several of them, each merges its copy; a replica whose merge fails is
        left out, as a push's is."""
        self._check_open()
        check_merge_target(merged)
        holders = _common_replicas(sources)
        if not holders:
            return None
        partition = merged.result_partition_id
        placed = merged.shuffle_descriptor
        if placed.is_unknown:
            # One copy, on one holder (merges of neighbours on the others): a lost one is
            # read from its sources, which keep their replicas.
            holder = holders[partition.partition_id.partition_index % len(holders)]
            placed = self._place(merged.partition_descriptor, partition, (holder,))
        if not isinstance(placed, ExternalShuffleDescriptor) or not {
            replica.worker_id for replica in placed.replicas
        } <= {holder.worker_id for holder in holders}:
            return None  # placed already, where the sources are not
        replicas = placed.replicas
        request = pb.MergePartitionsRequest(
            merged=key_of(partition),
            sources=[key_of(source.result_partition_id) for source in sources],
            number_of_subpartitions=merged.number_of_subpartitions,
            application_id=self._push.application_id,
            placement=placed.placement,
        )
        blocks = len(sources) * merged.number_of_subpartitions
        timeout = self._timeout * -(-blocks // _MERGED_BLOCKS_PER_TIMEOUT)
        calls = [
            (
                worker,
                pb_grpc.WorkerStub(self._channels.get(worker.target)).MergePartitions.future(
                    request, timeout=timeout
                ),
            )
            for worker in replicas
        ]
        statistics: PartitionStatistics | None = None
        failure: ShuffleError | None = None
        for worker, call in calls:
            try:
                response = call.result()
            except grpc.RpcError as error:
                failure = translate_rpc_error(error, f"merge into {partition} on {worker.target}")
                if isinstance(failure, TransportError):
                    self.report_unreachable(worker, failure)
                logger.warning("replica %s of %s not merged: %s", worker.target, partition, failure)
                continue
            statistics = statistics_from_pb(response.statistics)
        if statistics is None:
            assert failure is not None
            raise failure
        logger.debug("%s merged %d partitions into %s", owner.name, len(sources), partition)
        return statistics

    def report_unreachable(self, worker: WorkerAddress, error: ShuffleError) -> None:
        """Tell the coordinators, which check the worker at once (best effort)."""
        request = pb.ReportUnreachableWorkerRequest(worker_id=worker.worker_id, error=str(error))
        self._coordinators.each(
            f"reporting {worker.worker_id} unreachable",
            lambda address: self._coordinators.stub(address).ReportUnreachableWorker(
                request, timeout=self._timeout
            ),
        )

    def create_input_gates(
        self, owner: ShuffleIOOwner, descriptors: Sequence[InputGateDeploymentDescriptor]
    ) -> list[InputGate]:
        self._check_open()
        gates = [
            ExternalInputGate(
                descriptor,
                self._channels,
                self._gate_settings,
                self.report_unreachable,
                self._gates.forget,
                data_ports=self._data_ports,
                grpc_only=self._grpc_only,
            )
            for descriptor in descriptors
        ]
        self._gates.add(owner.execution_attempt_id, list(gates))
        return list(gates)

    def update_partition_info(
        self, consumer_attempt_id: str, partition_info: PartitionInfo
    ) -> bool:
        return self._gates.update(consumer_attempt_id, partition_info)

    def release_partitions_locally(self, partition_ids: Collection[ResultPartitionID]) -> None:
        """Nothing to free here: the data lives in the daemon (the master releases it)."""

    def partitions_occupying_local_resources(self) -> frozenset[ResultPartitionID]:
        return frozenset()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._gates.close_all()
        if self._data_ports is not None:
            self._data_ports.close()
        self._channels.close()
