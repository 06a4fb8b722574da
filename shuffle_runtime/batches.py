"""Vectorized helpers on record batches shared by every writer."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from shuffle_api.errors import SchemaMismatchError, ShuffleError
from shuffle_api.io import SubpartitionIndexes
from shuffle_runtime.ndarrays import arrow_array, numpy_values

__all__ = [
    "OrderedRows",
    "chop",
    "coalesce",
    "coalesce_sized",
    "conform",
    "conform_all",
    "group_nbytes",
    "nullable_inside",
    "ordered_parts",
    "reorder_by_subpartition",
    "split_by_subpartition",
]


def _as_indexes(
    indexes: SubpartitionIndexes, rows: int, subpartitions: int
) -> npt.NDArray[np.int64]:
    if isinstance(indexes, pa.ChunkedArray):
        indexes = indexes.combine_chunks()
    if isinstance(indexes, pa.Array):
        if indexes.null_count:
            raise ShuffleError("subpartition indexes contain nulls")
        if not pa.types.is_integer(indexes.type):
            raise ShuffleError(f"subpartition indexes must be integers, got {indexes.type}")
        array: npt.NDArray[Any] = numpy_values(indexes)
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


# A gather into n subpartitions reads its source as n streams, each in order. The CPU
# prefetches a few dozen streams; more than that, and a source larger than the CPU caches is
# read at random, at the speed of memory. A batch of more than _CACHED_BYTES into more than
# _PREFETCHED_STREAMS subpartitions is therefore reordered in two passes: first into at most
# _MAX_RUNS runs of consecutive subpartitions, then each run, from a source within the caches
# (in passes again, should a run still be too large). Into fewer subpartitions, one pass is
# faster (a 47 MiB batch into 16: 103 ms, against 161 ms in two passes).
_CACHED_BYTES = 4 << 20
_PREFETCHED_STREAMS = 64
_MAX_RUNS = 16


def _stable_order(indexes: npt.NDArray[np.int64], subpartitions: int) -> pa.Array:
    """Row numbers in stable order of subpartition, as the narrowest index type ``take`` gets."""
    # The narrowest key makes numpy's stable sort a radix sort with the fewest passes.
    key_type = np.uint8 if subpartitions <= 1 << 8 else np.uint16
    key = indexes.astype(key_type) if subpartitions <= 1 << 16 else indexes
    order = np.argsort(key, kind="stable")
    # Gathering strings with 32-bit row numbers is about twice as fast as with 64-bit ones.
    return arrow_array(order.astype(np.int32) if len(order) < 1 << 31 else order)


def split_by_subpartition(
    batch: pa.RecordBatch, indexes: SubpartitionIndexes, subpartitions: int
) -> Iterator[tuple[int, pa.RecordBatch]]:
    """Yield ``(subpartition, rows of batch for it)`` for each non-empty subpartition: zero-copy
    slices of :func:`reorder_by_subpartition`'s batches, so rows keep their order within each
    subpartition."""
    for part in ordered_parts(batch, indexes, subpartitions):
        yield from part.slices()


@dataclass(frozen=True, slots=True)
class OrderedRows:
    """Rows of consecutive subpartitions in order: ``counts[i]`` rows of subpartition
    ``first + i``, one after the other."""

    batch: pa.RecordBatch
    first: int
    counts: npt.NDArray[np.int64]

    def starts(self) -> npt.NDArray[np.int64]:
        """Where each subpartition's rows start."""
        starts = np.zeros(len(self.counts), dtype=np.int64)
        np.cumsum(self.counts[:-1], out=starts[1:])
        return starts

    def cut(
        self, sizes: npt.NDArray[np.int64], target: int
    ) -> Iterator[tuple[OrderedRows, npt.NDArray[np.int64]]]:
        """These rows in parts of at most about ``target`` bytes (``sizes``: each
        subpartition's), each with its subpartitions' sizes: neighbouring subpartitions
        together, one larger than ``target`` alone in slices (zero-copy)."""
        ends = np.cumsum(sizes)
        starts = self.starts()
        position = 0
        while position < len(sizes):
            before = int(ends[position - 1]) if position else 0
            end = int(np.searchsorted(ends, before + target, side="right"))
            if end > position:
                rows = int(starts[end - 1] + self.counts[end - 1] - starts[position])
                part = self.batch.slice(int(starts[position]), rows)
                yield (
                    OrderedRows(part, self.first + position, self.counts[position:end]),
                    sizes[position:end],
                )
                position = end
                continue
            whole = self.batch.slice(int(starts[position]), int(self.counts[position]))
            for piece in chop(whole, target):
                share = int(sizes[position]) * piece.num_rows // max(1, whole.num_rows)
                counts = np.array([piece.num_rows], dtype=np.int64)
                yield OrderedRows(piece, self.first + position, counts), np.array([share])
            position += 1

    def slices(self) -> Iterator[tuple[int, pa.RecordBatch]]:
        """``(subpartition, its rows)`` for each subpartition with rows: zero-copy slices."""
        nonempty = np.flatnonzero(self.counts)
        starts = self.starts()[nonempty].tolist()
        counts = self.counts[nonempty].tolist()
        for subpartition, start, count in zip(
            (nonempty + self.first).tolist(), starts, counts, strict=True
        ):
            yield subpartition, self.batch.slice(start, count)


def ordered_parts(
    batch: pa.RecordBatch, indexes: SubpartitionIndexes, subpartitions: int
) -> Iterator[OrderedRows]:
    """The rows of ``batch`` in stable order of subpartition (see
    :func:`reorder_by_subpartition`), as :class:`OrderedRows` that together cover every
    subpartition."""
    ordered, counts = reorder_by_subpartition(batch, indexes, subpartitions)
    # A subpartition never spans two of the reordered batches (runs hold whole subpartitions).
    ends = np.cumsum(counts)
    first = rows = 0
    for position, part in enumerate(ordered):
        rows += part.num_rows
        last = (
            subpartitions
            if position == len(ordered) - 1
            else int(np.searchsorted(ends, rows, side="left")) + 1
        )
        yield OrderedRows(part, first, counts[first:last])
        first = last


def reorder_by_subpartition(
    batch: pa.RecordBatch, indexes: SubpartitionIndexes, subpartitions: int
) -> tuple[list[pa.RecordBatch], npt.NDArray[np.int64]]:
    """The rows of ``batch`` in stable order of subpartition, as consecutive batches (one, or
    a few when a large batch goes to many subpartitions, see ``_CACHED_BYTES``), and the rows
    of each subpartition.

    Reordering batch by batch beats one reorder of many batches: a batch-sized gather stays in
    the CPU caches.
    """
    array = _as_indexes(indexes, batch.num_rows, subpartitions)
    counts: npt.NDArray[np.int64] = np.bincount(array, minlength=subpartitions)
    return (_reorder(batch, array, subpartitions) if batch.num_rows else []), counts


def _reorder(
    batch: pa.RecordBatch, array: npt.NDArray[np.int64], subpartitions: int
) -> list[pa.RecordBatch]:
    """``reorder_by_subpartition`` of a non-empty batch by indexes already checked."""
    if (array == array[0]).all():
        return [batch]
    # Two passes only into more than _PREFETCHED_STREAMS > _MAX_RUNS subpartitions: every run
    # of them gets some.
    runs = min(batch.nbytes // _CACHED_BYTES, _MAX_RUNS)
    if runs < 2 or subpartitions <= _PREFETCHED_STREAMS:
        return [batch.take(_stable_order(array, subpartitions))]
    # Run r: subpartitions [ceil(r * subpartitions / runs), ceil((r + 1) * subpartitions / runs)).
    run_of = array * runs // subpartitions
    order = _stable_order(run_of, runs)
    ordered, array = batch.take(order), array[numpy_values(order)]
    reordered: list[pa.RecordBatch] = []
    offset = 0
    for run, count in enumerate(np.bincount(run_of, minlength=runs).tolist()):
        if count:
            start, end = -(-run * subpartitions // runs), -(-(run + 1) * subpartitions // runs)
            run_rows, run_indexes = ordered.slice(offset, count), array[offset : offset + count]
            reordered += _reorder(run_rows, run_indexes - start, end - start)
            offset += count
    return reordered


def group_nbytes(batch: pa.RecordBatch, counts: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """``nbytes`` of each group of consecutive rows of ``batch`` (``counts[i]`` rows each, in
    order), as pyarrow counts a slice's, without a slice per group: flat columns by their
    widths and offsets, others slice by slice (a writer of thousands of subpartitions gets a
    group for each, and ``nbytes`` of a slice costs microseconds)."""
    bounds = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=bounds[1:])
    total = np.zeros(len(counts), dtype=np.int64)
    for column in batch.columns:
        total += _column_group_nbytes(column, bounds)
    return total


def _column_group_nbytes(column: pa.Array, bounds: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    kind = column.type
    counts = np.diff(bounds)
    # The bytes a group's bits span (its first and last may share a byte with neighbours).
    first_bit = column.offset + bounds
    bitmap_bytes = (first_bit[1:] + 7) // 8 - first_bit[:-1] // 8
    buffers = column.buffers()
    sizes: npt.NDArray[np.int64] = (
        bitmap_bytes.copy() if buffers[0] is not None else np.zeros_like(counts)
    )
    if pa.types.is_boolean(kind):
        sizes += bitmap_bytes
    elif _is_fixed_width(kind):
        sizes += counts * (kind.bit_width // 8)
    elif (offset_type := _OFFSET_TYPES.get(kind.id)) is not None:
        end = column.offset + len(column) + 1
        offsets = np.frombuffer(buffers[1], dtype=offset_type, count=end)[column.offset :]
        sizes += counts * offsets.itemsize + offsets[bounds[1:]] - offsets[bounds[:-1]]
    else:
        pieces = zip(bounds[:-1].tolist(), counts.tolist(), strict=True)
        sizes = np.array([column.slice(start, count).nbytes for start, count in pieces], np.int64)
    return sizes


def _is_fixed_width(kind: pa.DataType) -> bool:
    try:
        return bool(kind.bit_width) and kind.bit_width % 8 == 0 and kind.num_fields == 0
    except ValueError:  # no fixed width
        return False


_OFFSET_TYPES: dict[int, type[np.integer]] = {
    pa.string().id: np.int32,
    pa.binary().id: np.int32,
    pa.large_string().id: np.int64,
    pa.large_binary().id: np.int64,
}


def chop(batch: pa.RecordBatch, target_bytes: int) -> Iterator[pa.RecordBatch]:
    """Zero-copy slices of ``batch`` of about ``target_bytes`` each (at least one row each)."""
    size = batch.nbytes
    if size <= target_bytes or batch.num_rows <= 1:
        yield batch
        return
    rows_per_slice = max(1, batch.num_rows * target_bytes // size)
    for offset in range(0, batch.num_rows, rows_per_slice):
        yield batch.slice(offset, rows_per_slice)


def coalesce(
    pieces: Iterable[pa.RecordBatch],
    target: int,
    size: Callable[[pa.RecordBatch], int] = lambda piece: piece.nbytes,
) -> Iterator[pa.RecordBatch]:
    """The rows of ``pieces``, in order, in as few batches of at most ``target`` (by ``size``:
    bytes unless told otherwise) as consecutive pieces of one schema fill (one copy each); a
    piece larger than that passes as it is."""
    return coalesce_sized(((piece, size(piece)) for piece in pieces), target)


def coalesce_sized(
    pieces: Iterable[tuple[pa.RecordBatch, int]], target: int
) -> Iterator[pa.RecordBatch]:
    """:func:`coalesce` of pieces whose sizes the caller knows, each with its size."""
    group: list[pa.RecordBatch] = []
    group_size = 0
    for piece, piece_size in pieces:
        if group and (group_size + piece_size > target or not piece.schema.equals(group[0].schema)):
            yield _concatenate(group)
            group, group_size = [], 0
        group.append(piece)
        group_size += piece_size
    if group:
        yield _concatenate(group)


def _concatenate(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    if len(batches) == 1:
        return batches[0]
    combined: pa.RecordBatch = pa.Table.from_batches(batches).combine_chunks().to_batches()[0]
    return combined


def conform(batch: pa.RecordBatch, schema: pa.Schema, *, safe: bool = True) -> pa.RecordBatch:
    """``batch`` with ``schema``'s columns, taken by name and cast to its types (``safe``:
    refusing casts that lose data); :class:`SchemaMismatchError` when that cannot be done.

    Nullability is a promise about the data, not part of the type, as in Spark: a column
    whose type differs from the declared one only in nested nullability flags (or the time
    zone its instants are shown in) is relabelled, with no copy; a declared non-null field,
    at any depth, that holds a null is refused."""
    if batch.schema.equals(schema):
        columns = batch.columns
    else:
        columns = [_conformed_column(batch, field, safe) for field in schema]
    for field, column in zip(schema, columns, strict=True):
        _check_nulls(field, column, field.name)
    if columns is batch.columns:
        return batch
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def conform_all(batches: Iterable[pa.RecordBatch], schema: pa.Schema) -> pa.Table:
    """``batches`` as one table of ``schema`` (each batch :func:`conform`-ed)."""
    return pa.Table.from_batches([conform(batch, schema) for batch in batches], schema=schema)


def _conformed_column(batch: pa.RecordBatch, field: pa.Field, safe: bool) -> pa.Array:
    index = batch.schema.get_field_index(field.name)
    if index < 0:
        raise SchemaMismatchError(
            f"no column {field.name!r} in a batch with columns {batch.schema.names}"
        )
    column = batch.column(index)
    if column.type == field.type:
        return column
    if _layout(column.type) == _layout(field.type):
        return _relabelled(column, field.type)
    try:
        return column.cast(field.type, safe=safe)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as error:
        raise SchemaMismatchError(
            f"column {field.name!r} of type {column.type} cannot be {field.type}: {error}"
        ) from error


def _relabelled(column: pa.Array, data_type: pa.DataType) -> pa.Array:
    """``column`` as ``data_type``, of the same :func:`_layout`: the same buffers. Not
    Arrow's ``view`` or ``cast``: they count a non-null field's nulls under a null parent
    (which Arrow allows) as nulls; :func:`_check_nulls` checks instead."""
    _, array = column.__arrow_c_array__()
    relabelled: pa.Array = pa.Array._import_from_c_capsule(data_type.__arrow_c_schema__(), array)
    return relabelled


def _is_list(data_type: pa.DataType) -> bool:
    return bool(
        pa.types.is_list(data_type)
        or pa.types.is_large_list(data_type)
        or pa.types.is_fixed_size_list(data_type)
    )


def _nested_fields(data_type: pa.DataType) -> list[pa.Field]:
    """The fields inside ``data_type`` whose nullability is declared: a struct's, a list's
    element, a map's value (Arrow keeps map keys non-null itself)."""
    if pa.types.is_struct(data_type):
        return list(data_type)
    if pa.types.is_map(data_type):
        return [data_type.item_field]
    if _is_list(data_type):
        return [data_type.value_field]
    return []


def nullable_inside(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every nested field nullable (its columns as they are): for writers
    that refuse the nulls a null parent hides in a non-null child, which Arrow allows."""
    return pa.schema(
        [field.with_type(_nested_nullable(field.type, _same)) for field in schema],
        metadata=schema.metadata,
    )


def _same(data_type: pa.DataType) -> pa.DataType:
    return data_type


def _in_utc(data_type: pa.DataType) -> pa.DataType:
    if pa.types.is_timestamp(data_type) and data_type.tz is not None:
        return pa.timestamp(data_type.unit, tz="UTC")
    return data_type


def _nested_nullable(
    data_type: pa.DataType, leaf: Callable[[pa.DataType], pa.DataType]
) -> pa.DataType:
    """``data_type`` with every nested field nullable and every other type made ``leaf`` of
    it."""

    def again(inner: pa.DataType) -> pa.DataType:
        return _nested_nullable(inner, leaf)

    if pa.types.is_struct(data_type):
        return pa.struct([pa.field(child.name, again(child.type)) for child in data_type])
    if pa.types.is_map(data_type):
        return pa.map_(again(data_type.key_type), again(data_type.item_type))
    if pa.types.is_list(data_type):
        return pa.list_(again(data_type.value_type))
    if pa.types.is_large_list(data_type):
        return pa.large_list(again(data_type.value_type))
    if pa.types.is_fixed_size_list(data_type):
        return pa.list_(again(data_type.value_type), data_type.list_size)
    return leaf(data_type)


def _layout(data_type: pa.DataType) -> pa.DataType:
    """``data_type`` without what does not change its data: nullability flags, the time
    zone an instant is shown in."""
    return _nested_nullable(data_type, _in_utc)


@functools.lru_cache(maxsize=256)
def _promises_non_null_inside(data_type: pa.DataType) -> bool:
    return any(
        not child.nullable or _promises_non_null_inside(child.type)
        for child in _nested_fields(data_type)
    )


def _check_nulls(field: pa.Field, column: pa.Array, path: str, inherited: int = 0) -> None:
    """Refuse a null where ``field`` (at ``path``) promises none. A struct's children are
    flattened with its validity, so ``inherited`` of a child's nulls are its parents'."""
    added = column.null_count - inherited
    if not field.nullable and added:
        raise SchemaMismatchError(
            f"field {path!r} is declared non-null ({field.type}) but holds {added} null(s)"
        )
    data_type = field.type
    if not _promises_non_null_inside(data_type):
        return
    if pa.types.is_struct(data_type):
        for child_field, child in zip(data_type, column.flatten(), strict=True):
            _check_nulls(child_field, child, f"{path}.{child_field.name}", column.null_count)
    elif pa.types.is_map(data_type):
        # The values of the valid maps' entries (Arrow flattens lists, not maps).
        mask = column.is_null() if column.null_count else None
        values = pa.ListArray.from_arrays(column.offsets, column.items, mask=mask).flatten()
        _check_nulls(data_type.item_field, values, f"{path}.value")
    elif _is_list(data_type):
        # Flattened: the elements of valid lists only.
        _check_nulls(data_type.value_field, column.flatten(), f"{path}.element")
