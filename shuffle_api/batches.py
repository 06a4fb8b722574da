"""Vectorized helpers on record batches shared by every writer."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from shuffle_api.errors import ShuffleError

__all__ = ["SubpartitionIndexes", "chop", "split_by_subpartition"]

SubpartitionIndexes: TypeAlias = "pa.Array | pa.ChunkedArray | npt.ArrayLike"


def _as_indexes(
    indexes: SubpartitionIndexes, rows: int, subpartitions: int
) -> npt.NDArray[np.int64]:
    if isinstance(indexes, pa.ChunkedArray):
        indexes = indexes.combine_chunks()
    if isinstance(indexes, pa.Array):
        if indexes.null_count:
            raise ShuffleError("subpartition indexes contain nulls")
        array = indexes.to_numpy(zero_copy_only=False)
    else:
        array = np.asarray(indexes)
    if array.ndim != 1 or len(array) != rows:
        raise ShuffleError(
            f"need one subpartition index per row: {rows} rows, got shape {array.shape}"
        )
    if rows and not np.issubdtype(array.dtype, np.integer):
        raise ShuffleError(f"subpartition indexes must be integers, got {array.dtype}")
    array = np.asarray(array, dtype=np.int64)
    if rows and (int(array.min()) < 0 or int(array.max()) >= subpartitions):
        raise ShuffleError(
            f"subpartition index out of range [0, {subpartitions}):"
            f" min {int(array.min())}, max {int(array.max())}"
        )
    indexes_array: npt.NDArray[np.int64] = array
    return indexes_array


def split_by_subpartition(
    batch: pa.RecordBatch, indexes: SubpartitionIndexes, subpartitions: int
) -> Iterator[tuple[int, pa.RecordBatch]]:
    """Yield ``(subpartition, rows of batch for it)`` for each non-empty subpartition.

    One stable reorder of the batch, then zero-copy slices: rows keep their order within each
    subpartition.
    """
    array = _as_indexes(indexes, batch.num_rows, subpartitions)
    if batch.num_rows == 0:
        return
    first = int(array[0])
    if (array == first).all():
        yield first, batch
        return
    # A 16-bit key lets numpy use its O(n) radix sort for the stable order.
    key = array.astype(np.uint16) if subpartitions <= 1 << 16 else array
    order = np.argsort(key, kind="stable")
    counts = np.bincount(array, minlength=subpartitions)
    ordered = batch.take(pa.array(order))
    offset = 0
    for subpartition in np.flatnonzero(counts):
        count = int(counts[subpartition])
        yield int(subpartition), ordered.slice(offset, count)
        offset += count


def chop(batch: pa.RecordBatch, target_bytes: int) -> Iterator[pa.RecordBatch]:
    """Zero-copy slices of ``batch`` of about ``target_bytes`` each (at least one row each)."""
    size = batch.nbytes
    if size <= target_bytes or batch.num_rows <= 1:
        yield batch
        return
    rows_per_slice = max(1, batch.num_rows * target_bytes // size)
    for offset in range(0, batch.num_rows, rows_per_slice):
        yield batch.slice(offset, rows_per_slice)
