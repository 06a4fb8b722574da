"""A result-partition writer that writes the on-store format into a sink."""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa

from shuffle_api.ids import ResultPartitionID
from shuffle_api.io import PartitionStatistics
from shuffle_runtime.batches import OrderedRows
from shuffle_runtime.format.sink import PartitionSink
from shuffle_runtime.format.writer import PartitionFileWriter
from shuffle_runtime.splitting_writer import SplittingPartitionWriter

__all__ = ["SortMergePartitionWriter"]


class SortMergePartitionWriter(SplittingPartitionWriter):
    """Sort-merge files (see :class:`PartitionFileWriter`) into ``sink``; ``on_commit`` hears
    of each committed partition."""

    def __init__(
        self,
        sink: PartitionSink,
        number_of_subpartitions: int,
        *,
        codec: str,
        memory_budget: int,
        target_batch_bytes: int,
        auto_bandwidth: int,
        on_commit: Callable[[ResultPartitionID], None] | None = None,
    ) -> None:
        super().__init__(
            sink.partition, number_of_subpartitions, target_batch_bytes=target_batch_bytes
        )
        self._file = PartitionFileWriter(
            sink,
            number_of_subpartitions,
            codec=codec,
            memory_budget=memory_budget,
            target_batch_bytes=target_batch_bytes,
            auto_bandwidth=auto_bandwidth,
        )
        self._on_commit = on_commit

    def _emit_ordered(self, rows: OrderedRows) -> None:
        self._file.add_ordered(rows)

    def _emit(self, subpartition: int, batch: pa.RecordBatch, size: int) -> None:
        self._file.add(subpartition, batch, size)

    def _commit(self) -> PartitionStatistics:
        statistics = self._file.commit()
        if self._on_commit is not None:
            self._on_commit(self.result_partition_id)
        return statistics

    def _discard(self, error: BaseException | None) -> None:
        self._file.abort()
