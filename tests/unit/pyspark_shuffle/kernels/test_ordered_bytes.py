"""``pyspark_shuffle.kernels.ordered_bytes``: values of every key type, nested to three levels,
as bytes that compare as Spark compares the values (checked pair by pair against a
plain-Python reference of Spark's ordering); maps have no order."""

from __future__ import annotations

import decimal
from collections.abc import Sequence

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_shuffle.kernels.hashing import hash_keys
from pyspark_shuffle.kernels.ordered_bytes import ordered_bytes
from shuffle_api import InvalidOperationError
from tests.unit.pyspark_shuffle.kernels.key_columns import _columns, _compare


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


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(_columns(), st.integers(0, 12))
def test_a_slice_encodes_and_hashes_as_its_rows_do_whole(column: pa.Array, start: int) -> None:
    start = min(start, len(column))
    assert ordered_bytes(column.slice(start)).equals(ordered_bytes(column).slice(start))
    assert list(hash_keys([column.slice(start)])) == list(hash_keys([column]))[start:]


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
