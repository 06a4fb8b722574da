"""NumPy arrays of Arrow ones and Arrow arrays of NumPy ones, made from their buffers.

pyarrow's own conversions (``Array.to_numpy``, ``pa.array`` of an ndarray, a Python value
made a scalar) import pandas the first time they run: some 27 MiB of anonymous memory and
0.2 s in every Python worker, which Spark's own ``mapInArrow`` workers never pay. A task's
paths (hash, write, read) convert through these instead, for the fixed-width types they use.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa

__all__ = ["arrow_array", "bytes_array", "longs", "number_scalar", "numpy_values", "validity"]

_KINDS: Final = (
    ("i", pa.types.is_signed_integer),
    ("u", pa.types.is_unsigned_integer),
    ("f", pa.types.is_floating),
)
_BINARY: Final = pa.binary()


def _numpy_dtype(data_type: pa.DataType) -> np.dtype[np.generic]:
    if pa.types.is_temporal(data_type) and data_type.bit_width in (32, 64):
        return np.dtype(f"<i{data_type.bit_width // 8}")  # dates, times, timestamps: their counts
    for kind, is_kind in _KINDS:
        if is_kind(data_type):
            return np.dtype(f"<{kind}{data_type.bit_width // 8}")
    raise TypeError(f"no NumPy view of an Arrow array of {data_type}")


def _bits(buffer: pa.Buffer, offset: int, length: int) -> npt.NDArray[np.bool_]:
    unpacked = np.unpackbits(
        np.frombuffer(buffer, dtype=np.uint8), count=offset + length, bitorder="little"
    )
    return unpacked[offset:].view(np.bool_)


def validity(array: pa.Array) -> npt.NDArray[np.bool_]:
    """Per value, whether it is not null."""
    buffer = array.buffers()[0]
    if not array.null_count or buffer is None:
        return np.full(len(array), not array.null_count, dtype=np.bool_)
    return _bits(buffer, array.offset, len(array))


def numpy_values(array: pa.Array, fill: int | float = 0) -> npt.NDArray[np.generic]:
    """The values of an integer, floating, boolean or temporal (as its integer counts) ``array``
    (nulls as ``fill``); a view of its buffer when it has no nulls."""
    length = len(array)
    if pa.types.is_boolean(array.type):
        values: npt.NDArray[np.generic] = (
            _bits(array.buffers()[1], array.offset, length)
            if length
            else np.zeros(0, dtype=np.bool_)
        )
    else:
        dtype = _numpy_dtype(array.type)
        values = (
            np.frombuffer(
                array.buffers()[1], dtype=dtype, count=length, offset=array.offset * dtype.itemsize
            )
            if length
            else np.zeros(0, dtype=dtype)
        )
    if array.null_count:
        return np.where(validity(array), values, np.asarray(fill, dtype=values.dtype))
    return values


def arrow_array(values: npt.NDArray[np.generic]) -> pa.Array:
    """An Arrow array of the one-dimensional integer, floating or boolean ``values``, no nulls."""
    if values.dtype == np.bool_:
        packed = np.packbits(values.astype(np.bool_, copy=False), bitorder="little")
        return pa.Array.from_buffers(pa.bool_(), len(values), [None, pa.py_buffer(packed)])
    contiguous = np.ascontiguousarray(values)
    data_type = pa.from_numpy_dtype(contiguous.dtype)
    return pa.Array.from_buffers(data_type, len(contiguous), [None, pa.py_buffer(contiguous)])


def longs(values: Sequence[int]) -> pa.Array:
    """An Arrow ``int64`` array of ``values`` (a task's report row, mostly)."""
    return arrow_array(np.array(values, dtype=np.int64))


def bytes_array(values: Sequence[bytes | None], data_type: pa.DataType = _BINARY) -> pa.Array:
    """An Arrow ``binary`` (or ``string``, of UTF-8 ``values``) array of ``values``, a None
    a null."""
    present = [value or b"" for value in values]
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum([len(value) for value in present], out=offsets[1:])
    valid = np.array([value is not None for value in values], dtype=np.bool_)
    nulls = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
    buffers = [nulls, pa.py_buffer(offsets), pa.py_buffer(b"".join(present))]
    return pa.Array.from_buffers(data_type, len(values), buffers)


def number_scalar(value: float, data_type: pa.DataType) -> pa.Scalar:
    """An Arrow scalar of the integer or floating ``data_type``."""
    return arrow_array(np.array([value], dtype=_numpy_dtype(data_type)))[0]
