"""The shared front half of every writer: its state, schema checks, the split and batch sizing."""

from __future__ import annotations

import abc
import threading

import pyarrow as pa

from shuffle_api.errors import SchemaMismatchError, ShuffleError, ShuffleServiceClosedError
from shuffle_api.ids import ResultPartitionID
from shuffle_api.io import (
    BROADCAST,
    PartitionStatistics,
    ResultPartitionWriter,
    SubpartitionIndexes,
)
from shuffle_runtime.batches import OrderedRows, chop, ordered_parts

__all__ = ["SplittingPartitionWriter"]


class SplittingPartitionWriter(ResultPartitionWriter):
    """The shared front half of a writer: state, schema checks, the split and batch sizing.

    Subclasses receive batches already routed to one subpartition (or :data:`BROADCAST`) and of
    about the target size, and implement the commit and discard.
    """

    def __init__(
        self,
        result_partition_id: ResultPartitionID,
        number_of_subpartitions: int,
        *,
        target_batch_bytes: int,
    ) -> None:
        self._result_partition_id = result_partition_id
        self._number_of_subpartitions = number_of_subpartitions
        self._target_batch_bytes = target_batch_bytes
        self._schema: pa.Schema | None = None
        self._state = "open"
        self._lock = threading.Lock()

    @property
    def result_partition_id(self) -> ResultPartitionID:
        return self._result_partition_id

    @property
    def number_of_subpartitions(self) -> int:
        return self._number_of_subpartitions

    @property
    def schema(self) -> pa.Schema | None:
        """The partition's schema, fixed by the first batch written."""
        return self._schema

    @property
    def is_finished(self) -> bool:
        return self._state == "finished"

    def _check_open(self, batch: pa.RecordBatch) -> None:
        if self._state != "open":
            raise ShuffleServiceClosedError(
                f"writer of partition {self._result_partition_id} is {self._state}"
            )
        if not isinstance(batch, pa.RecordBatch):
            raise ShuffleError(f"writers take pyarrow.RecordBatch, got {type(batch).__name__}")
        if self._schema is None:
            self._schema = batch.schema
        elif not batch.schema.equals(self._schema):
            raise SchemaMismatchError(
                f"batch schema differs from partition {self._result_partition_id}'s schema:\n"
                f"partition: {self._schema}\nbatch: {batch.schema}"
            )

    def write(self, batch: pa.RecordBatch, subpartitions: SubpartitionIndexes) -> None:
        self._check_open(batch)
        for part in ordered_parts(batch, subpartitions, self._number_of_subpartitions):
            self._emit_ordered(part)

    def write_to_subpartition(self, batch: pa.RecordBatch, subpartition: int) -> None:
        self._check_open(batch)
        if not 0 <= subpartition < self._number_of_subpartitions:
            raise ShuffleError(
                f"subpartition {subpartition} out of range [0, {self._number_of_subpartitions})"
            )
        if batch.num_rows:
            self._emit_sized(subpartition, batch)

    def broadcast(self, batch: pa.RecordBatch) -> None:
        self._check_open(batch)
        if batch.num_rows:
            self._emit_sized(BROADCAST, batch)

    def _emit_sized(self, subpartition: int, batch: pa.RecordBatch) -> None:
        size = batch.nbytes  # microseconds: counted once per piece
        if size <= self._target_batch_bytes:
            self._emit(subpartition, batch, size)
            return
        for piece in chop(batch, self._target_batch_bytes):
            self._emit(subpartition, piece, piece.nbytes)

    def finish(self) -> PartitionStatistics:
        with self._lock:
            if self._state != "open":
                raise ShuffleServiceClosedError(
                    f"writer of partition {self._result_partition_id} is {self._state}"
                )
            self._state = "finishing"
        try:
            statistics = self._commit()
        except BaseException as error:
            self.fail(error)
            raise
        self._state = "finished"
        return statistics

    def fail(self, error: BaseException | None = None) -> None:
        with self._lock:
            if self._state in ("failed", "finished"):
                return
            self._state = "failed"
        self._discard(error)

    def _emit_ordered(self, rows: OrderedRows) -> None:
        """Take the rows of consecutive subpartitions; by default, subpartition by
        subpartition (a writer that keeps them together saves a call and a size per
        subpartition: thousands, for a small batch into many)."""
        for subpartition, piece in rows.slices():
            self._emit_sized(subpartition, piece)

    @abc.abstractmethod
    def _emit(self, subpartition: int, batch: pa.RecordBatch, size: int) -> None:
        """Take one batch (of ``size`` Arrow bytes) for one subpartition, or for
        :data:`BROADCAST`."""

    @abc.abstractmethod
    def _commit(self) -> PartitionStatistics: ...

    @abc.abstractmethod
    def _discard(self, error: BaseException | None) -> None: ...
