"""ordered_bytes: values of every key type, nested to three levels, as bytes that compare as
Spark compares the values (checked pair by pair against a plain-Python reference of Spark's
ordering); hashes equal for values Spark holds equal; keys of nested types hashed, grouped,
joined and sorted as Spark does."""

from __future__ import annotations

import decimal
import math
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_shuffle.kernels.hashing import hash_keys
from pyspark_shuffle.kernels.operations import Join, group_ids
from pyspark_shuffle.kernels.ordered_bytes import ordered_bytes
from pyspark_shuffle.kernels.sorting import SortKey, sort_indices
from shuffle_api import InvalidOperationError

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
    "timestamp": (pa.timestamp("us", tz="UTC"), st.integers(-(1 << 62), 1 << 62)),
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


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(_columns())
def test_bytes_compare_as_spark_compares_the_values(column: pa.Array) -> None:
    encoded = ordered_bytes(column).to_pylist()
    values = column.to_pylist()
    for i, value in enumerate(values):
        for j, other in enumerate(values):
            if value is None or other is None:
                assert (encoded[i] is None) == (value is None)
                continue
            expected = _compare(value, other)
            got = (encoded[i] > encoded[j]) - (encoded[i] < encoded[j])
            assert got == expected, (value, other)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(_columns())
def test_values_spark_holds_equal_hash_alike(column: pa.Array) -> None:
    hashes = [int(value) for value in hash_keys([column])]
    values = column.to_pylist()
    for i, value in enumerate(values):
        for j, other in enumerate(values):
            equal = (value is None and other is None) or (
                value is not None and other is not None and _compare(value, other) == 0
            )
            if equal:
                assert hashes[i] == hashes[j], (value, other)


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(_columns(), st.integers(0, 12))
def test_a_slice_encodes_and_hashes_as_its_rows_do_whole(column: pa.Array, start: int) -> None:
    start = min(start, len(column))
    assert ordered_bytes(column.slice(start)).equals(ordered_bytes(column).slice(start))
    assert list(hash_keys([column.slice(start)])) == list(hash_keys([column]))[start:]


def _nested_keys() -> pa.Table:
    return pa.table(
        {
            "s": pa.array(
                [
                    {"x": 0.0, "tags": ["a"]},
                    {"x": -0.0, "tags": ["a"]},
                    {"x": math.nan, "tags": []},
                    {"x": -math.nan, "tags": []},
                    {"x": 1.0, "tags": None},
                    None,
                    {"x": 1.0, "tags": None},
                ]
            ),
            "row": list(range(7)),
        }
    )


def test_nested_keys_equal_as_in_spark_hash_group_and_join_alike() -> None:
    table = _nested_keys()
    hashes = [int(value) for value in hash_keys([table.column("s")])]
    assert hashes[0] == hashes[1] and hashes[2] == hashes[3] and hashes[4] == hashes[6]
    assert len({hashes[0], hashes[2], hashes[4], hashes[5]}) == 4
    ids, groups = group_ids(table, ["s"])
    assert groups == 4 and ids[0] == ids[1] and ids[2] == ids[3] and ids[4] == ids[6]
    other = table.rename_columns(["s", "other_row"])
    batches = list(
        Join(("s",), "inner").apply(
            [iter(table.to_batches()), iter(other.to_batches())], [table.schema, other.schema]
        )
    )
    pairs = {(row["row"], row["other_row"]) for row in pa.Table.from_batches(batches).to_pylist()}
    # Each row meets the rows equal to it; the null key meets none.
    assert pairs == {(a, b) for a in (0, 1) for b in (0, 1)} | {
        (a, b) for a in (2, 3) for b in (2, 3)
    } | {(a, b) for a in (4, 6) for b in (4, 6)}


def test_nested_sort_keys_order_as_spark_in_both_directions() -> None:
    table = pa.table(
        {"k": pa.array([[2], [1, None], None, [1], [], [1, 5], [None]]), "row": list(range(7))}
    )
    ascending = table.take(sort_indices(table, [SortKey("k")])).column("k").to_pylist()
    assert ascending == [None, [], [None], [1], [1, None], [1, 5], [2]]
    descending = table.take(sort_indices(table, [SortKey("k", False)])).column("k").to_pylist()
    assert descending == [[2], [1, 5], [1, None], [1], [None], [], None]


@pytest.mark.parametrize(
    "column",
    [
        pa.array([[("a", 1)]], pa.map_(pa.string(), pa.int64())),
        pa.array([{"m": [("a", 1)]}], pa.struct([("m", pa.map_(pa.string(), pa.int64()))])),
    ],
)
def test_maps_have_no_order_as_in_spark(column: pa.Array) -> None:
    with pytest.raises(InvalidOperationError, match="map"):
        ordered_bytes(column)
    with pytest.raises(InvalidOperationError):
        hash_keys([column])


def test_decimals_of_one_scale_order_by_value_whatever_their_precision() -> None:
    values: Sequence[decimal.Decimal] = [decimal.Decimal(text) for text in ("-1.5", "0.0", "2.5")]
    narrow = ordered_bytes(pa.array(values, pa.decimal128(5, 1))).to_pylist()
    wide = ordered_bytes(pa.array(values, pa.decimal128(30, 1))).to_pylist()
    assert narrow == wide == sorted(narrow)


def test_empty_arrays_inside_values_encode_whatever_their_buffers() -> None:
    # Arrow may leave an empty child's buffers absent or of any size.
    column = pa.array([[], [], None], pa.list_(pa.struct([("t", pa.timestamp("us"))])))
    assert ordered_bytes(column).to_pylist() == [b"\x00", b"\x00", None]
    assert ordered_bytes(pa.array([], pa.decimal128(10, 2))).to_pylist() == []


def test_empty_children_hash_whatever_their_buffers() -> None:
    struct = pa.struct([("d", pa.decimal128(38, 10)), ("s", pa.string())])
    column = pa.array([[], None, [[]]], pa.list_(pa.list_(struct)))
    hashes = [int(value) for value in hash_keys([column])]
    assert len(set(hashes)) == 3
