"""A vectorized 64-bit hash of key columns, equal for equal keys on both sides of a join.

Integers of every width (and dates, times, timestamps, durations) hash by their int64 value, so
an int32 key meets an int64 key; floats by their float64 bits with -0.0 and NaN made canonical;
decimals by their 128-bit value; strings and binaries by their bytes; a struct by its
fields' hashes, an array by its elements' and their positions. A null (key, field or element)
hashes to one fixed value, so nulls group together.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from pyspark_shuffle.kernels.ordered_bytes import is_nested
from shuffle_api import InvalidOperationError
from shuffle_runtime.ndarrays import numpy_values, validity

__all__ = ["hash_keys", "hashable_key_type"]

Hashes = npt.NDArray[np.uint64]

_NULL_HASH = np.uint64(0x9E3779B97F4A7C15)
_COMBINE = np.uint64(0x100000001B3)
_BYTE_BASE = np.uint64(0x100000001B3)
_SHIFT = np.uint64(33)
_STRUCT_SEED = np.uint64(0x2545F4914F6CDD1D)
_POSITION = np.uint64(0x9FB21C651E98DF25)
_MULTIPLIERS = (np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53))


def _finalize(values: Hashes) -> Hashes:
    """MurmurHash3's 64-bit finalizer: every input bit affects every output bit. Computed in
    place in two arrays: a batch's temporaries are large enough that allocating each anew (and
    faulting its pages in) would cost more than the arithmetic."""
    mixed = values >> _SHIFT
    np.bitwise_xor(mixed, values, out=mixed)
    shifted = np.empty_like(mixed)
    for multiplier in _MULTIPLIERS:
        np.multiply(mixed, multiplier, out=mixed)
        np.right_shift(mixed, _SHIFT, out=shifted)
        np.bitwise_xor(mixed, shifted, out=mixed)
    return mixed


def hashable_key_type(data_type: pa.DataType) -> pa.DataType:
    """The type a key column is hashed as (two keys of the same one can meet); raises
    :class:`InvalidOperationError` for types that cannot be keys."""
    if pa.types.is_dictionary(data_type):
        return hashable_key_type(data_type.value_type)
    if is_nested(data_type):
        return data_type
    if (
        pa.types.is_integer(data_type)
        or pa.types.is_boolean(data_type)
        or pa.types.is_temporal(data_type)
    ):
        return pa.int64()
    if pa.types.is_floating(data_type):
        return pa.float64()
    if pa.types.is_decimal(data_type):
        return pa.decimal128(38, data_type.scale)
    if pa.types.is_string(data_type) or pa.types.is_large_string(data_type):
        return pa.large_string()
    if pa.types.is_binary(data_type) or pa.types.is_large_binary(data_type):
        return pa.large_binary()
    if pa.types.is_null(data_type):
        return pa.null()
    raise InvalidOperationError(f"a column of type {data_type} cannot be a shuffle key")


def _as_int64(column: pa.Array) -> npt.NDArray[np.int64]:
    # Dates, times and timestamps as their counts; nulls as 0 (their hash is set apart later).
    if pa.types.is_temporal(column.type):
        counts: npt.NDArray[Any] = numpy_values(column).astype(np.int64, copy=False)
        return counts
    values: npt.NDArray[Any] = numpy_values(pc.cast(column, pa.int64()))
    return values


def _hash_values(column: pa.Array) -> Hashes:
    kind = hashable_key_type(column.type)
    if not len(column):  # an empty array's buffers may be absent, or of any size
        return np.zeros(0, dtype=np.uint64)
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if kind == pa.int64():
        return _as_int64(column).view(np.uint64)
    if kind == pa.float64():
        floats = numpy_values(pc.cast(column, pa.float64()))
        floats = np.where(floats == 0.0, 0.0, floats)  # -0.0 == 0.0
        floats = np.where(np.isnan(floats), np.nan, floats)  # one NaN bit pattern
        return np.ascontiguousarray(floats).view(np.uint64)
    if pa.types.is_decimal(kind):
        return _hash_decimal(pc.cast(column, kind))
    if pa.types.is_null(kind):
        return np.zeros(len(column), dtype=np.uint64)
    if pa.types.is_struct(kind):
        return _hash_struct(column)
    if is_nested(kind):
        return _hash_list(column)
    return _hash_bytes(pc.cast(column, kind))


def _hash_or_null(column: pa.Array) -> Hashes:
    values = _hash_values(column)
    if column.null_count:
        return np.where(validity(column), values, _NULL_HASH)
    return values


def _hash_struct(column: pa.Array) -> Hashes:
    combined = np.full(len(column), _STRUCT_SEED, dtype=np.uint64)
    for index in range(column.type.num_fields):
        combined = (combined * _COMBINE) ^ _finalize(_hash_or_null(column.field(index)))
    return combined


def _hash_list(column: pa.Array) -> Hashes:
    """Each list: the sum of its elements' hashes, each mixed with its position (so order
    counts), and its length."""
    offsets = numpy_values(column.offsets).astype(np.int64)
    first, last = int(offsets[0]), int(offsets[-1])
    elements = column.values.slice(first, last - first)
    owner = np.repeat(np.arange(len(column)), np.diff(offsets))
    position = (np.arange(last - first, dtype=np.int64) - (offsets[:-1] - first)[owner]).astype(
        np.uint64
    )
    mixed = _finalize(_finalize(_hash_or_null(elements)) ^ (position * _POSITION))
    sums = np.zeros(len(elements) + 1, dtype=np.uint64)
    np.cumsum(mixed, out=sums[1:])
    lengths = np.diff(offsets).astype(np.uint64)
    hashes: Hashes = (sums[offsets[1:] - first] - sums[offsets[:-1] - first]) * _COMBINE ^ lengths
    return hashes


def _hash_decimal(column: pa.Array) -> Hashes:
    words = np.frombuffer(column.buffers()[1], dtype=np.uint64)
    pairs = words[2 * column.offset : 2 * (column.offset + len(column))].reshape(-1, 2)
    return pairs[:, 0] * _COMBINE ^ pairs[:, 1]


def _hash_bytes(column: pa.Array) -> Hashes:
    """A polynomial hash of each value's bytes, computed for all values at once."""
    offsets = np.frombuffer(column.buffers()[1], dtype=np.int64)[
        column.offset : column.offset + len(column) + 1
    ]
    data_buffer = column.buffers()[2]
    starts, ends = offsets[:-1], offsets[1:]
    lengths = ends - starts
    hashes = lengths.astype(np.uint64)
    total = int(lengths.sum())
    if total == 0:
        return hashes
    data = np.frombuffer(data_buffer, dtype=np.uint8)
    nonempty = lengths > 0
    value_lengths = lengths[nonempty]
    # Lay the bytes of the non-empty values back to back; note each byte's value and position.
    value_starts = np.cumsum(value_lengths) - value_lengths
    owner = np.repeat(np.arange(len(value_lengths)), value_lengths)
    position_in_value = np.arange(total, dtype=np.int64) - value_starts[owner]
    values = data[starts[nonempty][owner] + position_in_value].astype(np.uint64) + np.uint64(1)
    powers = np.cumprod(np.full(int(value_lengths.max()), _BYTE_BASE, dtype=np.uint64))
    hashes[nonempty] ^= np.add.reduceat(values * powers[position_in_value], value_starts)
    return hashes


def hash_keys(columns: Sequence[pa.Array | pa.ChunkedArray]) -> Hashes:
    """One well-mixed 64-bit hash per row of the key ``columns``."""
    combined: Hashes | None = None
    for column in columns:
        array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        values = _hash_values(array)
        if array.null_count:
            values = np.where(validity(array), values, _NULL_HASH)
        combined = values if combined is None else (combined * _COMBINE) ^ _finalize(values)
    if combined is None:
        raise InvalidOperationError("a shuffle needs at least one key column")
    return _finalize(combined)
