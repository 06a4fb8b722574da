"""netty_like's ShuffleEnvironment: writers, gates, the partition registry and the data port.

Given an executor process (``ShuffleEnvironmentContext.executor_pid``) and a local store, the
blocking partitions it writes are handed to that executor's host process
(:mod:`netty_like.executor_host`), which serves them after this process is gone; otherwise this
process serves them itself.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Collection, Sequence

from netty_like.client import CreditSettings
from netty_like.descriptor import NettyShuffleDescriptor
from netty_like.executor_host import ExecutorHost, ExecutorHostSettings
from netty_like.gate import NettyGateSettings, NettyInputGate, on_this_store
from netty_like.options import (
    CONNECT_RETRIES,
    CONNECT_RETRY_WAIT,
    DATA_PORT_ENABLED,
    DATA_PORT_HOST,
    DATA_PORT_PORT,
    IDLE_TIMEOUT,
    INITIAL_CREDIT,
    MAX_CREDIT,
    MAX_FRAME_SIZE,
    PARTITION_REQUEST_TIMEOUT,
    PIPELINED_SUBPARTITION_BUFFER,
    READ_FROM_SHARED_STORE,
    SORT_BUFFER_SIZE,
    STORAGE_URL,
    tls_files,
)
from netty_like.partition_manager import ResultPartitionManager
from netty_like.protocol import HostedState
from netty_like.server import DataServer, NettyDataPortLimits
from netty_like.writers import PipelinedPartitionWriter
from shuffle_api import (
    LOCAL_ONLY_PORT,
    InputGate,
    InputGateDeploymentDescriptor,
    InvalidOperationError,
    PartitionInfo,
    PartitionStatistics,
    ProducerDescriptor,
    ResultPartitionDeploymentDescriptor,
    ResultPartitionID,
    ResultPartitionWriter,
    ShuffleDescriptor,
    ShuffleEnvironment,
    ShuffleEnvironmentContext,
    ShuffleIOOwner,
    ShuffleServiceClosedError,
)
from shuffle_api.options import (
    COMPRESSION_AUTO_BANDWIDTH,
    COMPRESSION_CODEC,
    READ_SOURCES_IN_FLIGHT,
    READ_STORE_AHEAD_SIZE,
    READ_STORE_THREADS,
    TARGET_BATCH_SIZE,
)
from shuffle_runtime.connections import ConnectionPool
from shuffle_runtime.format import (
    SortMergePartitionWriter,
    StoreSink,
    check_merge_target,
    merge_partitions,
)
from shuffle_runtime.gate import OpenGates
from shuffle_runtime.store import Store
from shuffle_runtime.store_reads import StoreReads

__all__ = ["NettyShuffleEnvironment"]

_LOG = logging.getLogger(__name__)


class NettyShuffleEnvironment(ShuffleEnvironment):
    def __init__(self, context: ShuffleEnvironmentContext) -> None:
        config = context.configuration
        self._config = config
        self._resource_id = context.resource_id
        self._secret = context.secret
        self._executor_pid = context.executor_pid
        default_store = (
            "" if context.local_directory is None else f"{context.local_directory}/pyshuffle"
        )
        self._store = Store(config.get(STORAGE_URL) or default_store)
        self._manager = ResultPartitionManager(self._store, config.get(PARTITION_REQUEST_TIMEOUT))
        self._host = config.get(DATA_PORT_HOST) or context.host
        self._server: DataServer | None = None
        self._executor_host: ExecutorHost | None = None
        self._port = LOCAL_ONLY_PORT
        self._gates = OpenGates()
        self._tls = tls_files(config)
        self._data_ports = ConnectionPool(self._secret, tls=self._tls.client_context())
        self._store_reads = StoreReads(
            threads=config.get(READ_STORE_THREADS), ahead_bytes=config.get(READ_STORE_AHEAD_SIZE)
        )
        self._closed = False
        self._gate_settings = NettyGateSettings(
            resource_id=self._resource_id,
            credit=CreditSettings(
                initial_credit=config.get(INITIAL_CREDIT),
                max_credit=max(config.get(MAX_CREDIT), config.get(INITIAL_CREDIT)),
                max_frame_size=config.get(MAX_FRAME_SIZE),
                connect_timeout=config.get(PARTITION_REQUEST_TIMEOUT),
                connect_retries=config.get(CONNECT_RETRIES),
                connect_retry_wait=config.get(CONNECT_RETRY_WAIT),
            ),
            unknown_timeout=config.get(PARTITION_REQUEST_TIMEOUT),
            store_url=self._store.url,
            read_from_shared_store=config.get(READ_FROM_SHARED_STORE),
            sources_in_flight=config.get(READ_SOURCES_IN_FLIGHT),
        )

    @property
    def resource_id(self) -> str:
        return self._resource_id

    @property
    def store(self) -> Store:
        return self._store

    @property
    def data_server(self) -> DataServer | None:
        return self._server

    def start(self) -> int:
        if self._port != LOCAL_ONLY_PORT or not self._config.get(DATA_PORT_ENABLED):
            return self._port
        if self._shared_store_only:
            # Every blocking partition is read from the store, which outlives this process
            # and its executor: nothing for a data port to serve.
            _LOG.info("store %s is shared: no data port", self._store.url)
            return self._port
        if self._executor_pid is not None and self._store.is_local:
            self._executor_host = ExecutorHost(
                ExecutorHostSettings(
                    owner_pid=self._executor_pid,
                    secret=self._secret,
                    store_url=self._store.url,
                    bind_host=self._host,
                    advertised_host=self._advertised_host(),
                    max_frame_size=self._config.get(MAX_FRAME_SIZE),
                    request_timeout=self._config.get(PARTITION_REQUEST_TIMEOUT),
                    idle_timeout=self._config.get(IDLE_TIMEOUT),
                    tls=self._tls,
                )
            )
            self._port = self._executor_host.port
            self._gate_settings = dataclasses.replace(
                self._gate_settings, executor_location=self._executor_host.resource_id
            )
            return self._port
        if self._executor_pid is not None:
            _LOG.warning(
                "store %s is not a local directory that another process of this executor"
                " could serve: this process serves its partitions itself, and they are lost"
                " when it exits",
                self._store.url,
            )
        self._server = DataServer(
            self._manager,
            self._host,
            self._config.get(DATA_PORT_PORT),
            secret=self._secret,
            limits=NettyDataPortLimits(
                max_frame_size=self._config.get(MAX_FRAME_SIZE),
                idle_timeout=self._config.get(IDLE_TIMEOUT),
            ),
            tls=self._tls.server_context(),
        )
        self._port = self._server.start()
        return self._port

    @property
    def _shared_store_only(self) -> bool:
        """An executor's process on a shared store: it serves no data port."""
        return self._executor_pid is not None and self._store.is_shared

    def _advertised_host(self) -> str:
        """Where consumers reach the data port: its bind address, unless that is a wildcard."""
        return self._host if self._host not in ("", "0.0.0.0", "::") else "127.0.0.1"

    def producer_descriptor(self, producer_execution_id: str) -> ProducerDescriptor:
        if self._executor_host is not None:
            # The host's port, not start()'s: a host that went away was replaced.
            return ProducerDescriptor(
                self._executor_host.resource_id,
                producer_execution_id,
                self._executor_host.address,
                self._executor_host.port,
            )
        return ProducerDescriptor(
            self._resource_id, producer_execution_id, self._advertised_host(), self._port
        )

    def describe_unregistered(
        self, partition: ResultPartitionID, producer: ProducerDescriptor
    ) -> NettyShuffleDescriptor:
        # What the master makes of a registration, which needs nothing but the producer.
        return NettyShuffleDescriptor.of_producer(
            partition,
            producer,
            connection_index=0,
            store_url=self._store.url,
            on_shared_store=self._store.is_shared,
        )

    def _check_open(self) -> None:
        if self._closed:
            raise ShuffleServiceClosedError(f"shuffle environment {self._resource_id} is closed")

    def create_result_partition_writers(
        self, owner: ShuffleIOOwner, descriptors: Sequence[ResultPartitionDeploymentDescriptor]
    ) -> list[ResultPartitionWriter]:
        self._check_open()
        return [self._new_writer(descriptor) for descriptor in descriptors]

    def _new_writer(self, descriptor: ResultPartitionDeploymentDescriptor) -> ResultPartitionWriter:
        target = self._config.get(TARGET_BATCH_SIZE)
        partition = descriptor.result_partition_id
        if descriptor.partition_type.must_be_pipelined:
            if self._executor_host is not None or self._shared_store_only:
                raise InvalidOperationError(
                    f"{descriptor.partition_type.name} partitions live in the memory of the"
                    " process that writes them; with an executor host, or an executor's"
                    " shared store (no data port), this environment writes blocking"
                    " partitions only"
                )
            pipelined = self._manager.new_pipelined(
                partition,
                descriptor.number_of_subpartitions,
                self._config.get(PIPELINED_SUBPARTITION_BUFFER),
            )
            return PipelinedPartitionWriter(
                pipelined, target_batch_bytes=target, on_fail=self._manager.mark_failed
            )
        # BLOCKING, BLOCKING_PERSISTENT and HYBRID_FULL are written in full to the store.
        return SortMergePartitionWriter(
            StoreSink(self._store, partition),
            descriptor.number_of_subpartitions,
            codec=self._config.get(COMPRESSION_CODEC),
            auto_bandwidth=self._config.get(COMPRESSION_AUTO_BANDWIDTH),
            memory_budget=self._config.get(SORT_BUFFER_SIZE),
            target_batch_bytes=target,
            on_commit=self._committer(partition),
        )

    def _committer(self, partition: ResultPartitionID) -> Callable[[ResultPartitionID], None]:
        """Whom a blocking partition's commit tells: this process's manager, or its executor
        host (told of the partition now, so that it deletes the files if this process dies
        before the commit)."""
        if self._executor_host is None:
            return self._manager.register_blocking
        self._executor_host.hand_over(HostedState.WRITING, partition)
        return functools.partial(self._executor_host.hand_over, HostedState.COMMITTED)

    def merge_partitions(
        self,
        owner: ShuffleIOOwner,
        sources: Sequence[ShuffleDescriptor],
        merged: ResultPartitionDeploymentDescriptor,
    ) -> PartitionStatistics | None:
        """Merged on this process's store, as its own blocking partition, from sources this
        process reads from a store: its own, its executor's, a shared one."""
        self._check_open()
        check_merge_target(merged)
        stores = [self._store_of(source) for source in sources]
        readable = [
            (store, source.result_partition_id)
            for store, source in zip(stores, sources, strict=True)
            if store is not None
        ]
        if not sources or len(readable) < len(sources):
            return None
        partition = merged.result_partition_id
        commit = self._committer(partition)
        written = merge_partitions(
            readable, self._store, partition, subpartitions=merged.number_of_subpartitions
        )
        commit(partition)
        _LOG.debug("%s merged %d partitions into %s", owner.name, len(sources), partition)
        return written.statistics

    def _store_of(self, source: ShuffleDescriptor) -> Store | None:
        """The store this process reads the blocking partition ``source`` from, if any."""
        if not isinstance(source, NettyShuffleDescriptor):
            return None
        if source.on_shared_store:
            return self._store if source.store_url == self._store.url else Store(source.store_url)
        if source.is_local_to(self._resource_id) or on_this_store(self._gate_settings, source):
            return self._store
        return None

    def create_input_gates(
        self, owner: ShuffleIOOwner, descriptors: Sequence[InputGateDeploymentDescriptor]
    ) -> list[InputGate]:
        self._check_open()
        gates = [
            NettyInputGate(
                descriptor,
                self._manager,
                self._gate_settings,
                self._gates.forget,
                data_ports=self._data_ports,
                store_reads=self._store_reads,
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
        self._manager.release(partition_ids)

    def queued_bytes(self) -> int:
        """Bytes held in pipelined queues (bounded by the subpartition buffer option)."""
        return self._manager.queued_bytes()

    def partitions_occupying_local_resources(self) -> frozenset[ResultPartitionID]:
        # With an executor host, nothing: the host holds what this process wrote; nor what
        # it committed to a shared store, which the master releases.
        return self._manager.occupying()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._server is not None:
            self._server.stop()
        if self._executor_host is not None:
            self._executor_host.close()
        self._gates.close_all()
        self._data_ports.close()
        self._store_reads.close()
        self._manager.release(self._manager.occupying())
