"""An input gate that reads its partitions one after another (the shared part of the
implementations' gates): unknown descriptors are waited for, errors name their partition."""

from __future__ import annotations

import abc
import contextlib
import threading
from collections.abc import Callable, Generator, Iterator

import pyarrow as pa

from shuffle_api.descriptors import (
    InputGateDeploymentDescriptor,
    PartitionInfo,
    ShuffleDescriptor,
    SubpartitionRange,
)
from shuffle_api.errors import (
    AuthenticationError,
    PartitionError,
    PartitionNotFoundError,
    ShuffleError,
    ShuffleServiceClosedError,
    StorageError,
)
from shuffle_api.format import PartitionFileReader
from shuffle_api.ids import ResultPartitionID
from shuffle_api.io import InputGate
from shuffle_api.store import Store

__all__ = ["OpenGates", "SequentialInputGate"]


class SequentialInputGate(InputGate):
    """Reads partition after partition; an unknown descriptor is waited for (up to
    ``unknown_timeout`` seconds) until :meth:`update` replaces it. Subclasses read one known
    partition in :meth:`_read`."""

    def __init__(
        self,
        descriptor: InputGateDeploymentDescriptor,
        *,
        unknown_timeout: float,
        on_close: Callable[[SequentialInputGate], None],
    ) -> None:
        self._descriptor = descriptor
        self._unknown_timeout = unknown_timeout
        self._on_close = on_close
        self._shuffle_descriptors: list[ShuffleDescriptor] = list(descriptor.shuffle_descriptors)
        self._condition = threading.Condition()
        self._closed = False
        self._reading: Generator[pa.RecordBatch] | None = None
        self._stores: dict[str, Store | None] = {}  # by URL: each probed once per gate

    @property
    def result_id(self) -> str:
        return self._descriptor.result_id

    @property
    def subpartitions(self) -> SubpartitionRange:
        return self._descriptor.consumed_subpartitions

    def _open_on_store(
        self, store_url: str, partition: ResultPartitionID
    ) -> PartitionFileReader | None:
        """The partition's files on the store at ``store_url`` (a producer's or a worker's),
        if this process sees that store and the partition is committed there; else ``None``,
        and the caller reads over the network."""
        if store_url not in self._stores:
            self._stores[store_url] = Store.open_existing(store_url)
        store = self._stores[store_url]
        if store is None:
            return None
        try:
            return PartitionFileReader(store, partition, cached=True)
        except (PartitionNotFoundError, StorageError):
            return None

    def update(self, info: PartitionInfo) -> bool:
        """Replace the unknown descriptor of the same partition; False if there is none."""
        wanted = info.shuffle_descriptor.result_partition_id.partition_id
        with self._condition:
            for index, current in enumerate(self._shuffle_descriptors):
                if current.is_unknown and current.result_partition_id.partition_id == wanted:
                    self._shuffle_descriptors[index] = info.shuffle_descriptor
                    self._condition.notify_all()
                    return True
        return False

    def _known(self, index: int) -> ShuffleDescriptor:
        with self._condition:
            self._condition.wait_for(
                lambda: self._closed or not self._shuffle_descriptors[index].is_unknown,
                self._unknown_timeout,
            )
            if self._closed:
                raise ShuffleServiceClosedError(f"input gate of {self.result_id} is closed")
            descriptor = self._shuffle_descriptors[index]
        if descriptor.is_unknown:
            raise PartitionNotFoundError(
                f"the descriptor of {descriptor.result_partition_id} was still unknown after"
                f" {self._unknown_timeout} s (no update_partition_info)",
                descriptor.result_partition_id,
            )
        return descriptor

    def _reading_order(self) -> list[int]:
        """The indexes of the partitions in the order they are read: as given, unless a
        subclass has an order of its own."""
        return list(range(len(self._shuffle_descriptors)))

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        for index in self._reading_order():
            descriptor = self._known(index)
            self._reading = self._read(descriptor)
            try:
                yield from self._reading
            except (PartitionError, AuthenticationError):
                raise  # a refused peer is no fault of the partition: its type is kept
            except ShuffleError as error:
                partition = descriptor.result_partition_id
                message = str(error)
                if str(partition) not in message:
                    message = f"reading {partition} failed: {message}"
                raise PartitionError(message, partition) from error
            finally:
                self._reading = None

    @abc.abstractmethod
    def _read(self, descriptor: ShuffleDescriptor) -> Generator[pa.RecordBatch]:
        """Every batch of the gate's subpartitions in this partition."""

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


class OpenGates:
    """The open gates of an environment by consumer attempt: where
    ``update_partition_info`` finds its gate, and what ``close`` closes."""

    def __init__(self) -> None:
        self._gates: dict[str, list[SequentialInputGate]] = {}
        self._lock = threading.Lock()

    def add(self, consumer_attempt_id: str, gates: list[SequentialInputGate]) -> None:
        with self._lock:
            self._gates.setdefault(consumer_attempt_id, []).extend(gates)

    def forget(self, gate: SequentialInputGate) -> None:
        """A gate closed (its ``on_close``)."""
        with self._lock:
            for attempt, gates in list(self._gates.items()):
                if gate in gates:
                    gates.remove(gate)
                    if not gates:
                        del self._gates[attempt]

    def update(self, consumer_attempt_id: str, info: PartitionInfo) -> bool:
        with self._lock:
            gates = list(self._gates.get(consumer_attempt_id, ()))
        return any(gate.update(info) for gate in gates if gate.result_id == info.result_id)

    def close_all(self) -> None:
        with self._lock:
            gates = [gate for owned in self._gates.values() for gate in owned]
        for gate in gates:
            gate.close()
