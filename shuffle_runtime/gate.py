"""An input gate that reads its partitions one after another (the shared part of the
implementations' gates): unknown descriptors are waited for, errors name their partition.

Partitions fetched from another process are read source by source (a producer's data port, a
worker), and each source is asked once for the partitions read from it one after another (a
batch), as Spark's reducers fetch a host's blocks: a request per partition cost a round trip
and the source's turn each, most of a small block's time."""

from __future__ import annotations

import abc
import collections
import contextlib
import itertools
import logging
import threading
from collections.abc import Callable, Generator, Iterator
from typing import Any, Final, Generic, TypeVar

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
    TransportError,
)
from shuffle_api.ids import IntermediateResultPartitionID, ResultPartitionID
from shuffle_api.io import InputGate
from shuffle_runtime.format import Layouts, PartitionFileReader
from shuffle_runtime.sockets import MAX_BATCH
from shuffle_runtime.store import Store

__all__ = ["END_OF_PARTITION", "Asker", "CutBatchError", "OpenGates", "SequentialInputGate"]

T = TypeVar("T")

_LOG = logging.getLogger(__name__)

END_OF_PARTITION: Final = None
"""What a batch's answers hold after each partition's last item."""
Asker = Callable[[list[ResultPartitionID]], Iterator[Any]]
"""Asks a source for partitions, in one request: their answers, each partition's followed by
:data:`END_OF_PARTITION`."""


class CutBatchError(TransportError):
    """A batch broke after it had delivered something, and again when asked once more."""


class _Batch(Generic[T]):
    """The answers to one batched request, taken partition by partition in its order."""

    def __init__(self, partitions: list[ResultPartitionID], answers: Iterator[T | None]) -> None:
        self._pending = collections.deque(partitions)
        self._request = answers
        self._answers: Iterator[T | None] = answers
        self.delivered = False
        self.failed = False

    def send(self) -> None:
        """Make the request now, taking its first answer: from then on the source answers
        into the connection while the reader is busy elsewhere. A failure is raised when the
        batch is read, as its partition's."""
        try:
            first = next(self._answers)
        except StopIteration:
            return
        except Exception as error:
            self.failed = True
            self._answers = _failing(error)
            return
        self._answers = itertools.chain((first,), self._answers)

    @property
    def pending(self) -> int:
        return len(self._pending)

    def serves_next(self, partition: ResultPartitionID) -> bool:
        return bool(self._pending) and self._pending[0] == partition

    def receive(self, partition: ResultPartitionID) -> Iterator[T]:
        assert self.serves_next(partition)
        self._pending.popleft()
        for answer in self._answers:
            if answer is END_OF_PARTITION:
                if not self._pending:
                    # The request's end: its connection goes back to its pool.
                    next(self._answers, None)
                return
            self.delivered = True
            yield answer
        raise TransportError(f"the answers to a batch ended before the end of {partition}")

    def close(self) -> None:
        if isinstance(self._request, Generator):
            # ValueError: it runs in another thread (a gate closed from outside its reader).
            with contextlib.suppress(ValueError):
                self._request.close()


def _failing(error: Exception) -> Iterator[Any]:
    raise error
    yield  # a generator: raises when read


class SequentialInputGate(InputGate):
    """Reads partition after partition; an unknown descriptor is waited for (up to
    ``unknown_timeout`` seconds) until :meth:`update` replaces it. Subclasses read one known
    partition in :meth:`_read`.

    ``sources_in_flight``: sources with a request open at once. When the reader turns to a
    source, the next ones in its order are asked for their first batches too (subclasses say
    how in :meth:`_asker`), and answer into their connections meanwhile, each within what its
    connection holds (socket buffers, or the credit the reader granted), as Spark's reducers
    keep fetches to several hosts in flight."""

    def __init__(
        self,
        descriptor: InputGateDeploymentDescriptor,
        *,
        unknown_timeout: float,
        on_close: Callable[[SequentialInputGate], None],
        sources_in_flight: int = 1,
    ) -> None:
        self._descriptor = descriptor
        self._unknown_timeout = unknown_timeout
        self._on_close = on_close
        self._sources_in_flight = max(1, sources_in_flight)
        self._shuffle_descriptors: list[ShuffleDescriptor] = list(descriptor.shuffle_descriptors)
        self._condition = threading.Condition()
        self._closed = False
        self._reading: Generator[pa.RecordBatch] | None = None
        self._stores: dict[str, Store | None] = {}  # by URL: each probed once per gate
        self._order: list[int] = []
        self._sources: list[str | None] = []  # by index: each partition's source, when ordered
        # The batch sources in reading order, each with its first position in _order.
        self._source_starts: list[tuple[str, int]] = []
        self._source_ranks: dict[str, int] = {}
        self._sources_entered: set[str] = set()
        self._positions: dict[IntermediateResultPartitionID, int] = {}
        # By source: the batch being read (its answers are what the subclass's ``ask`` gave).
        self._batches: dict[str, _Batch[Any]] = {}

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
            return PartitionFileReader(store, partition, Layouts.MAPPED)
        except (PartitionNotFoundError, StorageError):
            return None

    def _shared_store(self, store_url: str) -> Store:
        """The store at ``store_url``, which every host sees: opened without asking it whether
        it is there (a LIST request on an object store)."""
        store = self._stores.get(store_url)
        if store is None:
            store = self._stores[store_url] = Store(store_url)
        return store

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
        descriptor = self._shuffle_descriptors[index]
        if not descriptor.is_unknown and not self._closed:
            return descriptor  # known from the start, mostly: no lock taken per partition
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

    def _batch_source(self, index: int) -> str | None:
        """Where the partition at ``index`` is fetched in batches from (partitions of one
        source are read one after another), or None: read otherwise, or not known yet."""
        return None

    def _reading_order(self) -> list[int]:
        """Each source's partitions one after another, in the order given; the rest after."""
        by_source: dict[str, list[int]] = {}
        rest: list[int] = []
        # Kept: a partition whose descriptor was unknown here is read alone when it arrives.
        count = len(self._shuffle_descriptors)
        self._sources = [self._batch_source(index) for index in range(count)]
        for index, source in enumerate(self._sources):
            if source is not None:
                by_source.setdefault(source, []).append(index)
            else:
                rest.append(index)
        self._order = [index for indexes in by_source.values() for index in indexes] + rest
        position = 0
        self._source_starts, self._source_ranks = [], {}
        for rank, (source, indexes) in enumerate(by_source.items()):
            self._source_starts.append((source, position))
            self._source_ranks[source] = rank
            position += len(indexes)
        self._positions = {
            self._shuffle_descriptors[index].result_partition_id.partition_id: position
            for position, index in enumerate(self._order)
        }
        return self._order

    def _batched(
        self,
        source: str,
        partition: ResultPartitionID,
        ask: Callable[[list[ResultPartitionID]], Iterator[T | None]],
    ) -> Iterator[T]:
        """What ``source`` answers for ``partition``: from the batch asked of it that has
        the partition next, or from a new one, ``ask(partitions)``, of ``partition`` and
        the partitions read right after it there.

        A batch that breaks after it delivered anything (the source may have ended it
        because its reader paused: an idle timeout) is asked again once, from ``partition``
        on, and what this partition already gave is skipped; breaking again raises
        :class:`CutBatchError`."""
        given = 0
        asked_again = False
        while True:
            batch = self._batches.pop(source, None)
            if batch is None or not batch.serves_next(partition):
                if batch is not None:
                    batch.close()
                batch = self._ask_batch(source, partition, ask)
            if source not in self._sources_entered:
                self._sources_entered.add(source)
                self._ask_ahead(source)
            try:
                for position, answer in enumerate(batch.receive(partition)):
                    if position >= given:
                        given += 1
                        yield answer
            except TransportError as error:
                batch.close()
                if not batch.delivered:
                    raise
                if asked_again:
                    raise CutBatchError(f"a batched request broke twice: {error}") from error
                asked_again = True
                _LOG.info("a batched request to %s broke (%s); asking again", source, error)
                continue
            except BaseException:
                batch.close()  # a failure or an abandoned read: its connection is closed
                raise
            if batch.pending:
                self._batches[source] = batch
            return

    def _ask_batch(
        self,
        source: str,
        partition: ResultPartitionID,
        ask: Callable[[list[ResultPartitionID]], Iterator[T | None]],
    ) -> _Batch[T]:
        partitions = self._batch_from(source, partition)
        batch = _Batch(partitions, ask(partitions))
        batch.send()
        return batch

    def _ask_ahead(self, source: str) -> None:
        """Ask the sources read after ``source`` for their first batches, up to
        ``sources_in_flight`` sources in all."""
        rank = self._source_ranks.get(source)
        if rank is None:
            return
        for ahead, start in self._source_starts[rank + 1 : rank + self._sources_in_flight]:
            index = self._order[start]
            ask = self._asker(index)
            if ahead in self._batches or ask is None:
                continue
            first = self._shuffle_descriptors[index].result_partition_id
            batch = self._ask_batch(ahead, first, ask)
            if batch.failed:
                # Asked again at its turn: a source refusing now (at its cap, restarting)
                # may answer then, and its failure then is the one that counts.
                batch.close()
                continue
            self._batches[ahead] = batch

    def _asker(self, index: int) -> Asker | None:
        """How to ask the source of the partition at ``index`` for a batch of partitions, or
        None: it is not asked ahead (read otherwise, or not reachable that way)."""
        return None

    def _batch_from(self, source: str, partition: ResultPartitionID) -> list[ResultPartitionID]:
        """``partition``, and the partitions read right after it from ``source`` too."""
        batch = [partition]
        position = self._positions.get(partition.partition_id)
        if position is None or self._sources[self._order[position]] != source:
            return batch  # asked of a source other than its own (a replica): alone
        for index in self._order[position + 1 : position + MAX_BATCH]:
            if self._sources[index] != source:
                break
            batch.append(self._shuffle_descriptors[index].result_partition_id)
        return batch

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
        for batch in list(self._batches.values()):
            batch.close()
        self._batches.clear()
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
