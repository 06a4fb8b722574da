"""Which subpartition each row goes to: by key hash, or by key range from a sample."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from pyspark_shuffle.kernels.hashing import hash_keys
from pyspark_shuffle.kernels.sorting import SortKey, sort_indices
from shuffle_api import InvalidOperationError
from shuffle_runtime.batches import conform_all
from shuffle_runtime.ndarrays import arrow_array, numpy_values

__all__ = ["HashPartitioner", "Partitioner", "RangePartitioner", "choose_boundaries"]

_HALF = np.uint64(32)
# The high half of a hash times the count must fit in 64 bits.
_MAX_HASH_SUBPARTITIONS = 1 << 32


def _key_columns(batch: pa.RecordBatch, columns: Sequence[str]) -> list[pa.Array]:
    missing = [column for column in columns if column not in batch.schema.names]
    if missing:
        raise InvalidOperationError(
            f"no key column {missing[0]!r} in the data; columns: {batch.schema.names}"
        )
    return [batch.column(column) for column in columns]


class Partitioner(abc.ABC):
    """Picklable (it travels to the map tasks) and deterministic."""

    number_of_subpartitions: int

    @abc.abstractmethod
    def subpartitions(self, batch: pa.RecordBatch) -> npt.NDArray[np.int64]:
        """The subpartition of each row of ``batch``."""


@dataclass(frozen=True, slots=True)
class WholePartitioner(Partitioner):
    """Every row to the one subpartition: each map task's rows kept whole, in order (a kept
    result's, read back task by task)."""

    number_of_subpartitions: int = 1

    def subpartitions(self, batch: pa.RecordBatch) -> npt.NDArray[np.int64]:
        return np.zeros(batch.num_rows, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class HashPartitioner(Partitioner):
    keys: tuple[str, ...]
    number_of_subpartitions: int

    def __post_init__(self) -> None:
        if not 1 <= self.number_of_subpartitions <= _MAX_HASH_SUBPARTITIONS:
            raise InvalidOperationError(
                f"a hash shuffle needs 1 to {_MAX_HASH_SUBPARTITIONS} partitions,"
                f" got {self.number_of_subpartitions}"
            )

    def subpartitions(self, batch: pa.RecordBatch) -> npt.NDArray[np.int64]:
        hashes = hash_keys(_key_columns(batch, self.keys))
        # floor(high 32 bits * n / 2**32): as even as a modulo of a well-mixed hash, and a
        # multiply and shift in place where a 64-bit modulo divides (several times slower).
        hashes >>= _HALF
        hashes *= np.uint64(self.number_of_subpartitions)
        hashes >>= _HALF
        indexes: npt.NDArray[np.int64] = hashes.view(np.int64)
        return indexes


@dataclass(frozen=True, slots=True)
class RangePartitioner(Partitioner):
    """Row ``r`` goes to subpartition ``i`` when ``boundary[i-1] <= r < boundary[i]`` in sort
    order, so equal keys share a subpartition and subpartitions are in order."""

    keys: tuple[SortKey, ...]
    boundaries: pa.Table
    number_of_subpartitions: int

    def subpartitions(self, batch: pa.RecordBatch) -> npt.NDArray[np.int64]:
        names = [key.column for key in self.keys]
        rows = pa.Table.from_arrays(_key_columns(batch, names), names=names)
        boundaries = conform_all(self.boundaries.to_batches(), rows.schema)
        # Sort boundaries and rows together; stable, so a row equal to a boundary follows it.
        order = numpy_values(sort_indices(pa.concat_tables([boundaries, rows]), self.keys))
        is_boundary = order < boundaries.num_rows
        boundaries_before = np.cumsum(is_boundary)
        indexes = np.empty(rows.num_rows, dtype=np.int64)
        indexes[order[~is_boundary] - boundaries.num_rows] = boundaries_before[~is_boundary]
        return indexes


def choose_boundaries(sample: pa.Table, keys: Sequence[SortKey], subpartitions: int) -> pa.Table:
    """Up to ``subpartitions - 1`` distinct rows that cut the sorted sample into equal parts."""
    if sample.num_rows == 0 or subpartitions == 1:
        return sample.slice(0, 0)
    ordered = sample.take(sort_indices(sample, keys))
    picks = np.unique(
        (np.arange(1, subpartitions) * ordered.num_rows // subpartitions).clip(
            0, ordered.num_rows - 1
        )
    )
    chosen = ordered.take(arrow_array(picks))
    # Equal boundaries would leave empty subpartitions between them: keep the first of each.
    distinct = [0] + [
        row
        for row in range(1, chosen.num_rows)
        if chosen.slice(row, 1).to_pylist() != chosen.slice(row - 1, 1).to_pylist()
    ]
    return chosen.take(arrow_array(np.array(distinct, dtype=np.int64)))
