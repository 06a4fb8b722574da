"""netty_like's input gate: local partitions from memory, blocking ones from a store this
process shares with the producer, the rest over the producer's data port."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass

import pyarrow as pa

from netty_like.client import CreditSettings, read_remote
from netty_like.descriptor import NettyShuffleDescriptor
from netty_like.partition_manager import EncodedRun, ResultPartitionManager
from shuffle_api import (
    LOCAL_ONLY_PORT,
    InputGate,
    InputGateDeploymentDescriptor,
    PartitionError,
    PartitionInfo,
    PartitionNotFoundError,
    ResultPartitionID,
    ShuffleDescriptor,
    ShuffleError,
    ShuffleServiceClosedError,
    SubpartitionRange,
    TransportError,
)
from shuffle_api.format import PartitionFileReader, decode_run
from shuffle_api.store import Store

__all__ = ["GateSettings", "NettyInputGate"]


@dataclass(frozen=True, slots=True)
class GateSettings:
    resource_id: str
    credit: CreditSettings
    unknown_timeout: float
    read_from_shared_store: bool = True


class NettyInputGate(InputGate):
    """Reads partition after partition; an unknown descriptor is waited for until
    :meth:`update` replaces it."""

    def __init__(
        self,
        descriptor: InputGateDeploymentDescriptor,
        manager: ResultPartitionManager,
        settings: GateSettings,
        on_close: Callable[[NettyInputGate], None],
    ) -> None:
        self._descriptor = descriptor
        self._manager = manager
        self._settings = settings
        self._on_close = on_close
        self._channels: list[ShuffleDescriptor] = list(descriptor.shuffle_descriptors)
        self._condition = threading.Condition()
        self._closed = False
        self._reading: Generator[pa.RecordBatch] | None = None

    @property
    def result_id(self) -> str:
        return self._descriptor.result_id

    @property
    def subpartitions(self) -> SubpartitionRange:
        return self._descriptor.consumed_subpartitions

    def update(self, info: PartitionInfo) -> bool:
        """Replace the unknown descriptor of the same partition; False if there is none."""
        wanted = info.shuffle_descriptor.result_partition_id.partition_id
        with self._condition:
            for index, current in enumerate(self._channels):
                if current.is_unknown and current.result_partition_id.partition_id == wanted:
                    self._channels[index] = info.shuffle_descriptor
                    self._condition.notify_all()
                    return True
        return False

    def _known(self, index: int) -> ShuffleDescriptor:
        with self._condition:
            self._condition.wait_for(
                lambda: self._closed or not self._channels[index].is_unknown,
                self._settings.unknown_timeout,
            )
            if self._closed:
                raise ShuffleServiceClosedError(f"input gate of {self.result_id} is closed")
            descriptor = self._channels[index]
        if descriptor.is_unknown:
            raise PartitionNotFoundError(
                f"the descriptor of {descriptor.result_partition_id} was still unknown after"
                f" {self._settings.unknown_timeout} s (no update_partition_info)",
                descriptor.result_partition_id,
            )
        return descriptor

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        for index in range(len(self._channels)):
            descriptor = self._known(index)
            if not isinstance(descriptor, NettyShuffleDescriptor):
                raise ShuffleError(
                    f"netty_like cannot read {descriptor.result_partition_id}: its descriptor is a"
                    f" {type(descriptor).__name__}"
                )
            self._reading = self._read(descriptor)
            try:
                yield from self._reading
            except PartitionError:
                raise
            except ShuffleError as error:
                partition = descriptor.result_partition_id
                message = str(error)
                if str(partition) not in message:
                    message = f"reading {partition} failed: {message}"
                raise PartitionError(message, partition) from error
            finally:
                self._reading = None

    def _read(self, descriptor: NettyShuffleDescriptor) -> Generator[pa.RecordBatch]:
        partition = descriptor.result_partition_id
        pipelined = self._descriptor.consumed_partition_type.must_be_pipelined
        if descriptor.is_local_to(self._settings.resource_id):
            yield from self._read_local(partition, pipelined)
            return
        if (
            not pipelined
            and self._settings.read_from_shared_store
            and (reader := self._open_shared(descriptor)) is not None
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
                f"blocking partition {partition} is not on the store {descriptor.store_url!r} as"
                " this process sees it, and its producer serves no data port",
                partition,
            )

    def _read_remote(
        self, descriptor: NettyShuffleDescriptor, pipelined: bool
    ) -> Iterator[pa.RecordBatch]:
        partition = descriptor.result_partition_id
        received = False
        try:
            for batch in read_remote(
                descriptor.host,
                descriptor.data_port,
                partition,
                self.subpartitions,
                pipelined=pipelined,
                settings=self._settings.credit,
            ):
                received = True
                yield batch
        except TransportError as error:
            if pipelined or received:
                raise
            # Not on the store and no producer to ask: the engine must rerun the producer.
            raise PartitionNotFoundError(
                f"blocking partition {partition} is not on the store {descriptor.store_url!r} as"
                f" this process sees it, and its producer does not answer ({error}): it was"
                " released, or its producer's process is gone",
                partition,
            ) from error

    @staticmethod
    def _open_shared(descriptor: NettyShuffleDescriptor) -> PartitionFileReader | None:
        """The partition's files where this process sees the producer's store (same host, or a
        shared file system or object store): read straight from it, with no producer in the
        path, so the data outlives the producer's process. ``None`` if they are not there."""
        try:
            return PartitionFileReader(Store(descriptor.store_url), descriptor.result_partition_id)
        except PartitionNotFoundError:
            return None

    def _read_local(
        self, partition: ResultPartitionID, pipelined: bool
    ) -> Iterator[pa.RecordBatch]:
        view = self._manager.create_view(partition, self.subpartitions, pipelined=pipelined)
        try:
            while (item := view.poll(None)) is not None:
                if isinstance(item, EncodedRun):
                    assert view.schema is not None
                    yield from decode_run(item.data, view.schema, partition)
                elif isinstance(item, pa.RecordBatch):
                    yield item
        finally:
            view.release()

    def close(self) -> None:
        with self._condition:
            if self._closed:
                return
            self._closed = True
            self._condition.notify_all()
        reading = self._reading
        if isinstance(reading, Generator):
            # ValueError: the generator runs in another thread; it stops at its next step.
            with contextlib.suppress(ValueError):
                reading.close()
        self._on_close(self)
