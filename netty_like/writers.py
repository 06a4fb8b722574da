"""netty_like's writer of pipelined partitions: bounded queues (blocking partitions are written
by :class:`shuffle_runtime.format.SortMergePartitionWriter`)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa

from netty_like.pipelined import PipelinedPartition
from shuffle_api import BROADCAST, PartitionStatistics, ResultPartitionID
from shuffle_runtime.splitting_writer import SplittingPartitionWriter

__all__ = ["PipelinedPartitionWriter"]


class PipelinedPartitionWriter(SplittingPartitionWriter):
    """Feeds bounded queues; blocks while a consumer falls behind."""

    def __init__(
        self,
        partition: PipelinedPartition,
        *,
        target_batch_bytes: int,
        on_fail: Callable[[ResultPartitionID], None],
    ) -> None:
        count = len(partition.subpartitions)
        super().__init__(partition.partition, count, target_batch_bytes=target_batch_bytes)
        self._partition = partition
        self._on_fail = on_fail
        self._rows = np.zeros(count, dtype=np.int64)
        self._bytes = np.zeros(count, dtype=np.int64)

    def _emit(self, subpartition: int, batch: pa.RecordBatch, size: int) -> None:
        if subpartition == BROADCAST:
            targets = range(len(self._partition.subpartitions))
        else:
            targets = range(subpartition, subpartition + 1)
        for index in targets:
            self._partition.subpartitions[index].add(batch)
            self._rows[index] += batch.num_rows
            self._bytes[index] += size

    def _commit(self) -> PartitionStatistics:
        for subpartition in self._partition.subpartitions:
            subpartition.finish()
        return PartitionStatistics(
            tuple(int(v) for v in self._rows), tuple(int(v) for v in self._bytes)
        )

    def _discard(self, error: BaseException | None) -> None:
        for subpartition in self._partition.subpartitions:
            subpartition.fail(error)
        self._on_fail(self.result_partition_id)
