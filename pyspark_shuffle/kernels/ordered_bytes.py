"""Values of any key type as bytes that compare as Spark compares the values: equal bytes for
values Spark holds equal (NaN with NaN, -0.0 with 0.0), and bytes in Spark's order. Keys of
nested types (structs, arrays) are hashed, grouped, joined and sorted through them, on the
paths that binary keys take.

Each value's bytes delimit themselves, so a struct's or an array's bytes are its children's
laid end to end:

- a fixed-width value: big-endian, its sign bit flipped (floats: every bit of a negative);
- a string or binary: its bytes with 0x00 escaped as 0x00 0xFF, then 0x00 0x00;
- a struct: per field, 0x00 for null, or 0x01 and the field's bytes (nulls first);
- an array: per element, 0x01 for null, or 0x02 and the element's bytes; then 0x00 (so a
  prefix comes first, as Spark orders arrays).

All of it vectorized (numpy for numbers, Arrow's string kernels to lay bytes end to end):
no Python loop over rows.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from shuffle_api import InvalidOperationError

__all__ = ["is_nested", "ordered_bytes"]


def _constant(value: bytes | None) -> pa.Scalar:
    # Made when a nested key is encoded, not at import: pyarrow imports pandas to make one.
    return pa.scalar(value, pa.large_binary())


def is_nested(data_type: pa.DataType) -> bool:
    """Whether ``data_type`` is a struct or a list: keys of it go through :func:`ordered_bytes`."""
    return bool(
        pa.types.is_struct(data_type)
        or pa.types.is_list(data_type)
        or pa.types.is_large_list(data_type)
    )


def _joined(*parts: pa.Array | pa.Scalar) -> pa.Array:
    """Per value, the bytes of ``parts`` one after the other (null if any is null)."""
    joined: pa.Array = pc.binary_join_element_wise(*parts, _constant(b""))
    return joined


def _with_nulls_of(column: pa.Array, encoded: pa.Array) -> pa.Array:
    if not column.null_count:
        return encoded
    masked: pa.Array = pc.if_else(column.is_valid(), encoded, _constant(None))
    return masked


def _fixed(column: pa.Array, rows: npt.NDArray[np.uint8]) -> pa.Array:
    """One value per row of a 2-d byte matrix, null where ``column`` is."""
    count, width = rows.shape
    fixed = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(width), count, [None, pa.py_buffer(np.ascontiguousarray(rows))]
    )
    return _with_nulls_of(column, fixed.cast(pa.large_binary()))


def _big_endian(values: npt.NDArray[np.generic]) -> npt.NDArray[np.uint8]:
    width = values.dtype.itemsize
    unsigned = values.view(f"<u{width}")
    rows: npt.NDArray[np.uint8] = unsigned.astype(f">u{width}").view(np.uint8).reshape(-1, width)
    return rows


def _sign_flipped(values: npt.NDArray[np.generic]) -> npt.NDArray[np.uint8]:
    """Signed integers in order as unsigned big-endian bytes."""
    width = values.dtype.itemsize
    flipped = values.view(f"<u{width}") ^ np.array(1 << (8 * width - 1), dtype=f"<u{width}")
    return _big_endian(flipped)


def _numbers(column: pa.Array, dtype: str, per_value: int = 1) -> npt.NDArray[np.generic]:
    """The values of a fixed-width column as numpy, ``per_value`` numbers each (nulls as
    whatever the buffer holds: their bytes are never taken)."""
    width = np.dtype(dtype).itemsize * per_value
    start = column.offset * width
    raw = np.frombuffer(column.buffers()[1], dtype=np.uint8)[start : start + len(column) * width]
    values: npt.NDArray[np.generic] = raw.view(dtype)
    return values


def _encode_floats(column: pa.Array) -> pa.Array:
    as_double = pc.cast(column, pa.float64()).fill_null(0.0).to_numpy(zero_copy_only=False)
    # Spark: -0.0 equals 0.0; every NaN is one value, above +inf.
    normalized = np.where(as_double == 0.0, 0.0, as_double)
    normalized = np.where(np.isnan(normalized), np.nan, normalized)
    bits = np.ascontiguousarray(normalized).view(np.uint64)
    negative = (bits >> np.uint64(63)).astype(bool)
    ordered = np.where(negative, ~bits, bits | np.uint64(1 << 63))
    return _fixed(column, _big_endian(ordered))


def _encode_decimals(column: pa.Array) -> pa.Array:
    pairs = _numbers(column, "<u8", per_value=2).reshape(-1, 2)
    high = _sign_flipped(pairs[:, 1].view("<i8"))
    low = _big_endian(np.ascontiguousarray(pairs[:, 0]))
    return _fixed(column, np.hstack([high, low]))


def _encode_bytes(column: pa.Array) -> pa.Array:
    escaped = pc.replace_substring(
        pc.cast(column, pa.large_binary()), pattern=b"\x00", replacement=b"\x00\xff"
    )
    return _joined(escaped, _constant(b"\x00\x00"))


def _encode_struct(column: pa.Array) -> pa.Array:
    # Per field: 0x00 for null, else 0x01 and its bytes.
    parts = [
        pc.coalesce(_joined(_constant(b"\x01"), _encode(column.field(index))), _constant(b"\x00"))
        for index in range(column.type.num_fields)
    ]
    encoded = _joined(*parts) if parts else pa.repeat(_constant(b""), len(column))
    return _with_nulls_of(column, encoded)


def _encode_list(column: pa.Array) -> pa.Array:
    # Per element: 0x01 for null, else 0x02 and its bytes; then 0x00.
    elements = pc.coalesce(_joined(_constant(b"\x02"), _encode(column.values)), _constant(b"\x01"))
    lists = type(column).from_arrays(column.offsets, elements)
    joined = _joined(pc.binary_join(lists, _constant(b"")), _constant(b"\x00"))
    return _with_nulls_of(column, joined)


def _encode(column: pa.Array) -> pa.Array:
    """The bytes of each value of ``column``, null where it is null."""
    data_type = column.type
    if not len(column):  # an empty array's buffers may be absent, or of any size
        return pa.array([], pa.large_binary())
    if pa.types.is_dictionary(data_type):
        return _encode(column.dictionary_decode())
    if pa.types.is_struct(data_type):
        return _encode_struct(column)
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        return _encode_list(column)
    if pa.types.is_map(data_type):
        raise InvalidOperationError(f"a value of type {data_type} has no order (as in Spark)")
    if pa.types.is_floating(data_type):
        return _encode_floats(column)
    if pa.types.is_decimal(data_type):
        return _encode_decimals(pc.cast(column, pa.decimal128(38, data_type.scale)))
    if pa.types.is_boolean(data_type):
        bits = column.fill_null(False).to_numpy(zero_copy_only=False).astype(np.uint8)
        return _fixed(column, bits.reshape(-1, 1))
    if pa.types.is_integer(data_type) or pa.types.is_temporal(data_type):
        width = data_type.bit_width // 8
        signed = pa.types.is_temporal(data_type) or pa.types.is_signed_integer(data_type)
        numbers = _numbers(column, f"<{'i' if signed else 'u'}{width}")
        return _fixed(column, _sign_flipped(numbers) if signed else _big_endian(numbers))
    if (
        pa.types.is_string(data_type)
        or pa.types.is_large_string(data_type)
        or pa.types.is_binary(data_type)
        or pa.types.is_large_binary(data_type)
    ):
        return _encode_bytes(column)
    if pa.types.is_null(data_type):
        return pa.nulls(len(column), pa.large_binary())
    raise InvalidOperationError(f"a value of type {data_type} cannot be a key")


def ordered_bytes(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """``column`` as ``large_binary`` values that compare (bytewise) and equal as Spark
    compares and equates the values; null where ``column`` is null."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return _encode(array)
