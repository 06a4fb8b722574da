"""The partitions one environment produced, and views that read a subpartition range of one.

A view yields either record batches (pipelined partitions, straight from memory) or encoded runs
(blocking partitions, the verified bytes as stored), so a local consumer decodes without a copy
and the data server sends stored bytes as they are.
"""

from __future__ import annotations

import abc
import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass

import pyarrow as pa

from netty_like.pipelined import PipelinedPartition, PipelinedSubpartition
from shuffle_api import (
    PartitionAlreadyConsumedError,
    PartitionCorruptedError,
    PartitionNotFoundError,
    PartitionStatistics,
    ProducerFailedError,
    ResultPartitionID,
    SubpartitionRange,
)
from shuffle_runtime.format import Layouts, PartitionFileReader, is_readable, partition_directory
from shuffle_runtime.store import Store

__all__ = ["EncodedRun", "ResultPartitionManager", "SubpartitionView"]

# How many ended pipelined partitions are remembered, to answer a late request at once.
_ENDED_MEMORY = 10_000
# How often a wait for a pipelined partition looks whether its consumer is still there.
_WAIT_SLICE = 0.2


@dataclass(frozen=True, slots=True)
class EncodedRun:
    """Stored IPC batch messages and their checksum."""

    data: pa.Buffer
    checksum: int


class SubpartitionView(abc.ABC):
    """One consumer's read of a subpartition range of one partition."""

    schema: pa.Schema | None = None

    @abc.abstractmethod
    def poll(self, timeout: float | None) -> pa.RecordBatch | EncodedRun | bool | None:
        """Next item; ``None`` at the end; ``False`` when nothing came within ``timeout``."""

    @property
    @abc.abstractmethod
    def backlog(self) -> int:
        """Items ready to send now."""

    @abc.abstractmethod
    def release(self) -> None:
        """The consumer is done (or gone): free what the view holds."""


class _BlockingView(SubpartitionView):
    def __init__(
        self, reader: PartitionFileReader, subpartitions: SubpartitionRange, verify: bool
    ) -> None:
        self._reader = reader
        self._verify = verify
        self._runs = list(reader.runs(subpartitions))
        self._next = 0
        self.schema = reader.schema

    def poll(self, timeout: float | None) -> EncodedRun | None:
        if self._next >= len(self._runs):
            return None
        run = self._runs[self._next]
        self._next += 1
        return EncodedRun(self._reader.read_run(run, verify=self._verify), run.checksum)

    @property
    def backlog(self) -> int:
        return len(self._runs) - self._next

    def release(self) -> None:
        self._next = len(self._runs)


class _PipelinedView(SubpartitionView):
    def __init__(self, partition: PipelinedPartition, subpartitions: SubpartitionRange) -> None:
        self._partition = partition
        self._pending: list[PipelinedSubpartition] = partition.claim(subpartitions)

    def poll(self, timeout: float | None) -> pa.RecordBatch | bool | None:
        while self._pending:
            item = self._pending[0].poll(timeout)
            if item is None:
                self._partition.done_with(self._pending.pop(0))
                continue
            return item
        return None

    @property
    def backlog(self) -> int:
        return sum(subpartition.backlog for subpartition in self._pending)

    def release(self) -> None:
        while self._pending:
            self._partition.done_with(self._pending.pop())


class ResultPartitionManager:
    """Thread-safe registry of this process's partitions (Flink's ResultPartitionManager)."""

    def __init__(self, store: Store, request_timeout: float) -> None:
        self._store = store
        self._request_timeout = request_timeout
        self._blocking: set[ResultPartitionID] = set()
        # Being written by another process of this executor: deleted with the rest.
        self._writing: set[ResultPartitionID] = set()
        self._pipelined: dict[ResultPartitionID, PipelinedPartition] = {}
        self._ended: OrderedDict[ResultPartitionID, str] = OrderedDict()
        self._condition = threading.Condition()

    @property
    def store(self) -> Store:
        return self._store

    def register_blocking(self, partition: ResultPartitionID) -> None:
        # Views take layouts from a cache that does not look at the files again.
        PartitionFileReader.forget(self._store, partition)
        with self._condition:
            self._writing.discard(partition)
            self._blocking.add(partition)

    def register_writing(self, partition: ResultPartitionID) -> None:
        """Another process of this executor is writing ``partition`` to the store: delete it
        with the rest unless it is committed."""
        with self._condition:
            self._writing.add(partition)

    def adopt_committed(self, partition: ResultPartitionID) -> None:
        """Serve a partition another process of this executor committed to the store (its
        files are checked first)."""
        PartitionFileReader(self._store, partition)
        self.register_blocking(partition)

    def statuses(
        self, partitions: Collection[ResultPartitionID]
    ) -> list[PartitionStatistics | None]:
        """Each blocking partition's statistics while it is held and its files read, else
        ``None``."""
        with self._condition:
            held = [partition in self._blocking for partition in partitions]
        statuses: list[PartitionStatistics | None] = []
        for partition, is_held in zip(partitions, held, strict=True):
            statistics = None
            if is_held:
                with contextlib.suppress(PartitionNotFoundError, PartitionCorruptedError):
                    statistics = PartitionFileReader(self._store, partition).manifest.statistics
            statuses.append(statistics)
        return statuses

    def held(self, partitions: Collection[ResultPartitionID]) -> list[bool]:
        """Whether each blocking partition is held and its files read (its layout as readers
        of its data cache it: nothing per subpartition is decoded)."""
        with self._condition:
            held = [partition in self._blocking for partition in partitions]
        return [
            is_held and is_readable(self._store, partition)
            for partition, is_held in zip(partitions, held, strict=True)
        ]

    def register_pipelined(self, partition: PipelinedPartition) -> None:
        with self._condition:
            self._pipelined[partition.partition] = partition
            self._condition.notify_all()

    def mark_failed(self, partition: ResultPartitionID) -> None:
        with self._condition:
            self._pipelined.pop(partition, None)
            self._remember(partition, "failed")

    def _remember(self, partition: ResultPartitionID, how: str) -> None:
        self._ended[partition] = how
        while len(self._ended) > _ENDED_MEMORY:
            self._ended.popitem(last=False)

    def _on_consumed(self, partition: ResultPartitionID) -> None:
        with self._condition:
            if self._pipelined.pop(partition, None) is not None:
                self._remember(partition, "consumed")

    def new_pipelined(
        self, partition: ResultPartitionID, number_of_subpartitions: int, capacity_bytes: int
    ) -> PipelinedPartition:
        created = PipelinedPartition(
            partition, number_of_subpartitions, capacity_bytes, self._on_consumed
        )
        self.register_pipelined(created)
        return created

    def blocking_reader(self, partition: ResultPartitionID) -> PartitionFileReader:
        """A reader of a blocking partition this process produced and still holds."""
        with self._condition:
            known = partition in self._blocking
        if not known:
            raise PartitionNotFoundError(
                f"blocking partition {partition} is not held by this process (never"
                " committed here, or released)",
                partition,
            )
        return PartitionFileReader(self._store, partition, Layouts.READ)

    def create_view(
        self,
        partition: ResultPartitionID,
        subpartitions: SubpartitionRange,
        *,
        pipelined: bool,
        verify: bool = True,
        cancelled: Callable[[], bool] = lambda: False,
    ) -> SubpartitionView:
        """A view of a partition this process produced (pipelined ones may still be starting).

        ``verify=False`` leaves checksums of stored runs to the receiver (the data port sends
        each run's checksum, and the consumer checks it end to end)."""
        if not pipelined:
            return _BlockingView(self.blocking_reader(partition), subpartitions, verify)
        deadline = time.monotonic() + self._request_timeout
        with self._condition:
            # In slices: a consumer that goes away stops waiting within one.
            while not self._condition.wait_for(
                lambda: partition in self._pipelined or partition in self._ended,
                min(_WAIT_SLICE, max(0.0, deadline - time.monotonic())),
            ):
                if cancelled() or time.monotonic() >= deadline:
                    break
            found = self._pipelined.get(partition)
            ended = self._ended.get(partition)
        if found is not None:
            return _PipelinedView(found, subpartitions)
        if ended == "consumed":
            raise PartitionAlreadyConsumedError(
                f"pipelined partition {partition} was already consumed", partition
            )
        if ended == "failed":
            raise ProducerFailedError(
                f"producer of pipelined partition {partition} failed", partition
            )
        raise PartitionNotFoundError(
            f"pipelined partition {partition} was not created within"
            f" {self._request_timeout} s, or was released",
            partition,
        )

    def release(self, partitions: Collection[ResultPartitionID]) -> None:
        """Drop pipelined queues and delete blocking partitions' files (idempotent)."""
        for partition in partitions:
            with self._condition:
                pipelined = self._pipelined.pop(partition, None)
                stored = partition in self._blocking or partition in self._writing
                self._blocking.discard(partition)
                self._writing.discard(partition)
                if pipelined is not None:
                    self._remember(partition, "released")
            if pipelined is not None:
                pipelined.release()
            if stored:
                PartitionFileReader.forget(self._store, partition)
                # <result>/<index>/ too when this was their last attempt: nothing stays behind.
                self._store.delete_tree(
                    partition_directory(self._store, partition), empty_parents=2
                )

    def queued_bytes(self) -> int:
        """Bytes waiting in pipelined queues for their consumers."""
        with self._condition:
            partitions = list(self._pipelined.values())
        return sum(partition.queued_bytes for partition in partitions)

    def occupying(self) -> frozenset[ResultPartitionID]:
        """What this process holds: on a shared store, committed partitions are not its own
        (they outlive it, and the master releases them), only those it is writing."""
        with self._condition:
            committed = set() if self._store.is_shared else self._blocking
            return frozenset(committed | self._writing | self._pipelined.keys())
