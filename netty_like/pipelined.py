"""Pipelined partitions: bounded in-memory queues per subpartition, each consumed once."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

import pyarrow as pa

from shuffle_api import (
    PartitionAlreadyConsumedError,
    PartitionStatistics,
    ProducerFailedError,
    ResultPartitionID,
    SubpartitionRange,
)

__all__ = ["PipelinedPartition", "PipelinedSubpartition"]

_END = object()


class PipelinedSubpartition:
    """A queue bounded by bytes. ``add`` blocks while it is full (backpressure); after
    ``release`` (the consumer went away) everything queued is dropped and adds are ignored."""

    def __init__(self, partition: ResultPartitionID, index: int, capacity_bytes: int) -> None:
        self._partition = partition
        self._index = index
        self._capacity = capacity_bytes
        self._items: deque[object] = deque()
        self._bytes = 0
        self._condition = threading.Condition()
        self._error: BaseException | None = None
        self._released = False
        self.consumed = False

    @property
    def queued_bytes(self) -> int:
        return self._bytes

    @property
    def backlog(self) -> int:
        return len(self._items)

    def add(self, batch: pa.RecordBatch) -> None:
        size = batch.nbytes
        with self._condition:
            # At least one batch always fits, so a batch larger than the budget still moves.
            self._condition.wait_for(
                lambda: self._released or not self._items or self._bytes + size <= self._capacity
            )
            if self._released:
                return
            self._items.append(batch)
            self._bytes += size
            self._condition.notify_all()

    def finish(self) -> None:
        with self._condition:
            self._items.append(_END)
            self._condition.notify_all()

    def fail(self, error: BaseException | None) -> None:
        with self._condition:
            self._error = error or ProducerFailedError("producer failed", self._partition)
            self._condition.notify_all()

    def poll(self, timeout: float | None) -> pa.RecordBatch | bool | None:
        """The next batch; ``None`` at the end; ``False`` if nothing came within ``timeout``."""
        with self._condition:
            if not self._condition.wait_for(
                lambda: self._items or self._error is not None or self._released, timeout
            ):
                return False
            if self._error is not None:
                raise ProducerFailedError(
                    f"producer of pipelined partition {self._partition} failed: {self._error}",
                    self._partition,
                ) from self._error
            if self._released:
                return None
            item = self._items.popleft()
            if item is _END:
                return None
            assert isinstance(item, pa.RecordBatch)
            self._bytes -= item.nbytes
            self._condition.notify_all()
            return item

    def release(self) -> None:
        with self._condition:
            self._released = True
            self._items.clear()
            self._bytes = 0
            self._condition.notify_all()


class PipelinedPartition:
    """The subpartitions of one pipelined partition; calls ``on_consumed`` once every
    subpartition was read to its end or released."""

    def __init__(
        self,
        partition: ResultPartitionID,
        number_of_subpartitions: int,
        capacity_bytes: int,
        on_consumed: Callable[[ResultPartitionID], None],
    ) -> None:
        self.partition = partition
        self.subpartitions = [
            PipelinedSubpartition(partition, index, capacity_bytes)
            for index in range(number_of_subpartitions)
        ]
        self._remaining = number_of_subpartitions
        self._lock = threading.Lock()
        self._on_consumed = on_consumed
        self.schema: pa.Schema | None = None
        self.statistics: PartitionStatistics | None = None

    @property
    def queued_bytes(self) -> int:
        return sum(subpartition.queued_bytes for subpartition in self.subpartitions)

    def claim(self, subpartitions: SubpartitionRange) -> list[PipelinedSubpartition]:
        """Hand these subpartitions to one consumer; each can be claimed once."""
        with self._lock:
            if subpartitions.end >= len(self.subpartitions):
                raise PartitionAlreadyConsumedError(
                    f"partition {self.partition} has {len(self.subpartitions)} subpartitions, not"
                    f" {subpartitions.end + 1}",
                    self.partition,
                )
            claimed = [self.subpartitions[index] for index in subpartitions]
            taken = [s for s in subpartitions if self.subpartitions[s].consumed]
            if taken:
                raise PartitionAlreadyConsumedError(
                    f"subpartitions {taken} of pipelined partition {self.partition} were already"
                    " consumed; a pipelined partition is read once",
                    self.partition,
                )
            for subpartition in claimed:
                subpartition.consumed = True
            return claimed

    def done_with(self, subpartition: PipelinedSubpartition) -> None:
        """A consumer finished (or abandoned) one subpartition."""
        subpartition.release()
        with self._lock:
            self._remaining -= 1
            last = self._remaining == 0
        if last:
            self._on_consumed(self.partition)

    def release(self) -> None:
        for subpartition in self.subpartitions:
            subpartition.release()
