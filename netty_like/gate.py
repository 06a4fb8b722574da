"""netty_like's input gate: local partitions from memory, blocking ones from this process's
store when the producer wrote them there (the same executor, or a store the executors share),
the rest over the producer's data port."""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass

import pyarrow as pa

from netty_like.client import CreditSettings, read_remote
from netty_like.descriptor import NettyShuffleDescriptor
from netty_like.partition_manager import ResultPartitionManager
from shuffle_api import (
    LOCAL_ONLY_PORT,
    InputGateDeploymentDescriptor,
    PartitionNotFoundError,
    ResultPartitionID,
    ShuffleDescriptor,
    ShuffleError,
    TransportError,
)
from shuffle_runtime.connections import ConnectionPool
from shuffle_runtime.gate import END_OF_PARTITION, Asker, SequentialInputGate
from shuffle_runtime.store_reads import StoreReads

__all__ = ["NettyGateSettings", "NettyInputGate", "on_this_store"]


@dataclass(frozen=True, slots=True)
class NettyGateSettings:
    resource_id: str
    credit: CreditSettings
    unknown_timeout: float
    store_url: str
    """This process's store: a producer that wrote to the same store URL may have left its
    files where this process sees them."""
    read_from_shared_store: bool = True
    sources_in_flight: int = 1
    executor_location: str | None = None
    """The resource id of this process's executor host, if it has one: the partitions that
    host serves were written by this executor's processes, to this process's store."""


def on_this_store(settings: NettyGateSettings, descriptor: NettyShuffleDescriptor) -> bool:
    """Whether the partition is written to the store a process of ``settings`` reads from (a
    shared one, or its executor's own): then it is read there, not asked of its producer.

    A descriptor names the master's store, which is the producer's only where every process
    is given one store URL; its executor is known by its host."""
    return settings.read_from_shared_store and (
        descriptor.store_url == settings.store_url
        or (
            settings.executor_location is not None
            and descriptor.producer_location == settings.executor_location
        )
    )


class NettyInputGate(SequentialInputGate):
    """Reads partition after partition: local ones from this process, blocking ones from a
    shared store, the rest from the producer's data port."""

    def __init__(
        self,
        descriptor: InputGateDeploymentDescriptor,
        manager: ResultPartitionManager,
        settings: NettyGateSettings,
        on_close: Callable[[SequentialInputGate], None],
        *,
        data_ports: ConnectionPool,
        store_reads: StoreReads,
    ) -> None:
        """``data_ports``: connections to producers' data ports, and ``store_reads``: reads
        from shared stores, both shared by the gates of an environment."""
        super().__init__(
            descriptor,
            unknown_timeout=settings.unknown_timeout,
            on_close=on_close,
            sources_in_flight=settings.sources_in_flight,
        )
        self._manager = manager
        self._settings = settings
        self._data_ports = data_ports
        self._store_reads = store_reads
        self._pipelined = descriptor.consumed_partition_type.must_be_pipelined

    def _read(self, descriptor: ShuffleDescriptor) -> Generator[pa.RecordBatch]:
        if not isinstance(descriptor, NettyShuffleDescriptor):
            raise ShuffleError(
                f"netty_like cannot read {descriptor.result_partition_id}: its descriptor is a"
                f" {type(descriptor).__name__}"
            )
        partition = descriptor.result_partition_id
        pipelined = self._pipelined
        if descriptor.is_local_to(self._settings.resource_id):
            yield from self._read_local(partition, pipelined)
            return
        if descriptor.on_shared_store:
            # Its producer may be long gone: the store is the only place to look, with the
            # partitions read after this one there read ahead.
            store = self._shared_store(descriptor.store_url)

            def ask(partitions: list[ResultPartitionID]) -> Iterator[pa.RecordBatch | None]:
                return self._store_reads.read(store, partitions, self.subpartitions)

            yield from self._batched(_store_source(descriptor), partition, ask)
            return
        # Another store's partition is asked of its producer, unless it has no data port
        # (the store may still be this one under another URL).
        if (
            not pipelined
            and (
                self._on_this_store(descriptor)
                or (
                    self._settings.read_from_shared_store
                    and descriptor.data_port == LOCAL_ONLY_PORT
                )
            )
            and (reader := self._open_on_store(self._settings.store_url, partition)) is not None
        ):
            yield from reader.read(self.subpartitions)
            return
        if descriptor.data_port != LOCAL_ONLY_PORT:
            yield from self._read_remote(descriptor, pipelined)
        elif pipelined:
            raise PartitionNotFoundError(
                f"pipelined partition {partition} lives in another process that serves no data"
                " port (netty-like.data-port.enabled = false)",
                partition,
            )
        else:
            raise PartitionNotFoundError(
                f"blocking partition {partition} {self._not_on_store()}, and its"
                " producer serves no data port",
                partition,
            )

    def _on_this_store(self, descriptor: NettyShuffleDescriptor) -> bool:
        return on_this_store(self._settings, descriptor)

    def _not_on_store(self) -> str:
        """Why the store did not serve a blocking partition, for an error message."""
        if not self._settings.read_from_shared_store:
            return "is not read from the store here (netty-like.read-from-shared-store = false)"
        return f"is not on this process's store {self._settings.store_url!r}"

    def _batch_source(self, index: int) -> str | None:
        """The shared store of a partition there, or the producer's data port, for a
        blocking partition of another process that is not on this process's store."""
        descriptor = self._shuffle_descriptors[index]
        if (
            isinstance(descriptor, NettyShuffleDescriptor)
            and descriptor.on_shared_store
            and not descriptor.is_local_to(self._settings.resource_id)
        ):
            return _store_source(descriptor)
        if (
            not isinstance(descriptor, NettyShuffleDescriptor)
            or self._pipelined
            or descriptor.data_port == LOCAL_ONLY_PORT
            or descriptor.is_local_to(self._settings.resource_id)
            or self._on_this_store(descriptor)
        ):
            return None
        return f"{descriptor.host}:{descriptor.data_port}"

    def _read_remote(
        self, descriptor: NettyShuffleDescriptor, pipelined: bool
    ) -> Iterator[pa.RecordBatch]:
        partition = descriptor.result_partition_id
        source = f"{descriptor.host}:{descriptor.data_port}"
        read_any = False
        try:
            for batches in self._answers(descriptor, source, pipelined):
                read_any = True
                yield from batches
        except TransportError as error:
            if pipelined or read_any:
                raise
            # Not on the store and no producer to ask: the engine must rerun the producer.
            raise PartitionNotFoundError(
                f"blocking partition {partition} {self._not_on_store()}, and its"
                f" producer does not answer ({error}): it was released, or its producer's"
                " process is gone",
                partition,
            ) from error

    def _asker(self, index: int) -> Asker | None:
        descriptor = self._shuffle_descriptors[index]
        if (
            not isinstance(descriptor, NettyShuffleDescriptor)
            or descriptor.on_shared_store  # read ahead when its turn comes, not asked ahead
            or self._batch_source(index) is None
        ):
            return None
        return self._ask(descriptor, pipelined=False)

    def _ask(self, descriptor: NettyShuffleDescriptor, *, pipelined: bool) -> Asker:
        """Asks the producer's data port for partitions of the producer."""

        def ask(partitions: list[ResultPartitionID]) -> Iterator[list[pa.RecordBatch] | None]:
            return read_remote(
                descriptor.host,
                descriptor.data_port,
                partitions,
                self.subpartitions,
                pipelined=pipelined,
                settings=self._settings.credit,
                connections=self._data_ports,
            )

        return ask

    def _answers(
        self, descriptor: NettyShuffleDescriptor, source: str, pipelined: bool
    ) -> Iterator[list[pa.RecordBatch]]:
        """The batches of each buffer of the partition, from its producer's data port."""
        ask = self._ask(descriptor, pipelined=pipelined)
        partition = descriptor.result_partition_id
        if pipelined:
            # Streamed while produced: each partition on a channel of its own.
            return (answer for answer in ask([partition]) if answer is not END_OF_PARTITION)
        return self._batched(source, partition, ask)

    def _read_local(
        self, partition: ResultPartitionID, pipelined: bool
    ) -> Iterator[pa.RecordBatch]:
        if not pipelined:  # read as any partition on this process's store
            yield from self._manager.blocking_reader(partition).read(self.subpartitions)
            return
        view = self._manager.create_view(partition, self.subpartitions, pipelined=True)
        try:
            # Batches straight from memory (no timeout: never False).
            while (item := view.poll(None)) is not None:
                if isinstance(item, pa.RecordBatch):
                    yield item
        finally:
            view.release()


def _store_source(descriptor: NettyShuffleDescriptor) -> str:
    return f"store {descriptor.store_url}"
