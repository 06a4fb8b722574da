"""Columns of every key type, nested to three levels, drawn by hypothesis, and Spark's order
of their values, for the tests of ``pyspark_shuffle.kernels``."""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa
from hypothesis import strategies as st

_ATOMIC: dict[str, tuple[pa.DataType, st.SearchStrategy[Any]]] = {
    "bool": (pa.bool_(), st.booleans()),
    "int8": (pa.int8(), st.integers(-(1 << 7), (1 << 7) - 1)),
    "int32": (pa.int32(), st.integers(-(1 << 31), (1 << 31) - 1)),
    "int64": (pa.int64(), st.integers(-(1 << 63), (1 << 63) - 1)),
    "float32": (pa.float32(), st.floats(width=32)),
    "float64": (pa.float64(), st.floats()),
    "decimal": (
        pa.decimal128(38, 4),
        st.decimals(min_value=-(10**34) + 1, max_value=10**34 - 1, places=4, allow_nan=False),
    ),
    "string": (pa.string(), st.text(max_size=6)),
    "binary": (pa.binary(), st.binary(max_size=6)),
    "date": (pa.date32(), st.integers(-719_162, 2_932_896)),
    # Spark's range, as the dates' (0001-01-01 to 9999-12-31): outside it the reference's
    # Python datetimes overflow.
    "timestamp": (
        pa.timestamp("us", tz="UTC"),
        st.integers(-62_135_596_800_000_000, 253_402_300_799_999_999),
    ),
}


def _arrow_types(depth: int) -> st.SearchStrategy[pa.DataType]:
    atomic = st.sampled_from([arrow for arrow, _ in _ATOMIC.values()])
    if depth == 0:
        return atomic
    inner = _arrow_types(depth - 1)
    return st.one_of(
        atomic,
        inner.map(pa.list_),
        st.lists(inner, min_size=1, max_size=3).map(
            lambda types: pa.struct([pa.field(f"f{i}", each) for i, each in enumerate(types)])
        ),
    )


def _values(data_type: pa.DataType) -> st.SearchStrategy[Any]:
    values: st.SearchStrategy[Any]
    if pa.types.is_list(data_type):
        values = st.lists(_values(data_type.value_type), max_size=3)
    elif pa.types.is_struct(data_type):
        values = st.fixed_dictionaries({field.name: _values(field.type) for field in data_type})
    else:
        [values] = [strategy for arrow, strategy in _ATOMIC.values() if arrow == data_type]
        if pa.types.is_float32(data_type):
            values = values.map(lambda x: float(pa.scalar(x, pa.float32()).as_py()))
    return st.none() | values


def _compare(left: Any, right: Any) -> int:
    """Spark's order: null first, NaN above all numbers, -0.0 = 0.0, strings by UTF-8 bytes,
    arrays element by element then by length, structs field by field."""
    if left is None or right is None:
        return (left is not None) - (right is not None)
    if isinstance(left, dict):
        for name in left:
            if order := _compare(left[name], right[name]):
                return order
        return 0
    if isinstance(left, list):
        for one, other in zip(left, right, strict=False):
            if order := _compare(one, other):
                return order
        return (len(left) > len(right)) - (len(left) < len(right))
    if isinstance(left, float):
        left_nan, right_nan = math.isnan(left), math.isnan(right)
        if left_nan or right_nan:
            return left_nan - right_nan
    if isinstance(left, str):
        left, right = left.encode(), right.encode()
    return int(left > right) - int(left < right)


@st.composite
def _columns(draw: st.DrawFn) -> pa.Array:
    data_type = draw(_arrow_types(3))
    values = draw(st.lists(_values(data_type), min_size=1, max_size=12))
    return pa.array(values, data_type)
