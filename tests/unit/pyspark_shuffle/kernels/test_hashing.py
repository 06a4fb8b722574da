"""``pyspark_shuffle.kernels.hashing``: keys hash alike where Spark holds them equal: every
width, encoding and precision of a value, null, NaN and -0.0 as Spark has them, a slice as
its rows, nested values too; types that cannot be keys are refused."""

from __future__ import annotations

import decimal
import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings

from pyspark_shuffle.kernels.hashing import hash_keys
from shuffle_api import InvalidOperationError
from tests.unit.pyspark_shuffle.kernels.key_columns import _columns, _compare
from tests.unit.pyspark_shuffle.kernels.spark_reference import NAN


def _hashes(*columns: pa.Array | pa.ChunkedArray) -> list[int]:
    return [int(value) for value in hash_keys(list(columns))]


def test_integers_of_every_width_hash_alike() -> None:
    values = [0, 1, -1, 127, -128, None, 42]
    expected = _hashes(pa.array(values, pa.int64()))
    for data_type in (pa.int8(), pa.int16(), pa.int32()):
        assert _hashes(pa.array(values, data_type)) == expected, data_type
    unsigned = [0, 1, 200, None]
    assert _hashes(pa.array(unsigned, pa.uint8())) == _hashes(pa.array(unsigned, pa.int64()))


def test_null_differs_from_zero_and_all_nulls_hash_alike() -> None:
    hashes = _hashes(pa.array([None, 0, None], pa.int64()))
    assert hashes[0] == hashes[2] != hashes[1]
    assert _hashes(pa.array([None], pa.int32())) == _hashes(pa.array([None], pa.string()))


@pytest.mark.parametrize(
    "array",
    [
        pa.array(list(range(-20, 20)), pa.int64()),
        pa.array([f"value {i}" if i % 7 else ("" if i % 2 else None) for i in range(40)]),
        pa.array(
            [decimal.Decimal(i) / 4 if i % 5 else None for i in range(40)], pa.decimal128(9, 2)
        ),
        pa.array([i / 3 if i % 6 else None for i in range(40)], pa.float64()),
        pa.array([f"large {i}" for i in range(40)], pa.large_string()),
        pa.array([bytes([i, i + 1]) for i in range(40)], pa.binary()),
    ],
    ids=["int64", "string", "decimal", "float", "large_string", "binary"],
)
def test_a_slice_hashes_as_the_same_rows_of_the_whole_array(array: pa.Array) -> None:
    whole = _hashes(array)
    for offset, length in [(0, 40), (3, 17), (13, 1), (39, 1), (5, 0)]:
        assert _hashes(array.slice(offset, length)) == whole[offset : offset + length]
    chunked = pa.chunked_array([array.slice(0, 11), array.slice(11)])
    assert _hashes(chunked) == whole


def test_strings_hash_by_value_whatever_their_encoding() -> None:
    values = ["", "a", "ab", "ba", "a\x00", None, "ü", "a" * 100, ""]
    hashes = _hashes(pa.array(values, pa.string()))
    assert hashes == _hashes(pa.array(values, pa.large_string()))
    assert hashes == _hashes(pa.array(values, pa.string()).dictionary_encode())
    assert hashes[0] == hashes[-1]  # equal empty strings
    distinct = {hashes[index] for index, value in enumerate(values[:-1])}
    assert len(distinct) == len(values) - 1  # "", null, "a", "a\0", "ab", "ba" ... all differ


def test_all_empty_strings_and_all_null_strings() -> None:
    empties = _hashes(pa.array(["", "", ""]))
    assert len(set(empties)) == 1
    nulls = _hashes(pa.array([None, None], pa.string()))
    assert len(set(nulls)) == 1
    assert nulls[0] != empties[0]


def test_decimals_hash_by_value_across_precisions() -> None:
    values = [decimal.Decimal("1.50"), decimal.Decimal("-3.25"), None, decimal.Decimal("0.00")]
    narrow = _hashes(pa.array(values, pa.decimal128(5, 2)))
    wide = _hashes(pa.array(values, pa.decimal128(30, 2)))
    assert narrow == wide
    assert len(set(narrow)) == 4


def test_floats_treat_negative_zero_and_every_nan_as_one_value() -> None:
    other_nan = np.frombuffer(np.uint64(0x7FF8000000000001).tobytes(), dtype=np.float64)[0]
    assert math.isnan(other_nan)
    values = pa.array([0.0, -0.0, NAN, other_nan, -NAN, 1.5, None], pa.float64())
    hashes = _hashes(values)
    assert hashes[0] == hashes[1]
    assert hashes[2] == hashes[3] == hashes[4]
    assert len({hashes[0], hashes[2], hashes[5], hashes[6]}) == 4
    floats32 = pa.array([0.0, -0.0, NAN, 1.5, None], pa.float32())
    assert _hashes(floats32) == [hashes[0], hashes[1], hashes[2], hashes[5], hashes[6]]


def test_temporal_keys_hash_and_unsupported_types_are_refused() -> None:
    timestamps = pa.array([0, 1_000_000, None], pa.timestamp("us", tz="UTC"))
    assert _hashes(timestamps) == _hashes(pa.array([0, 1_000_000, None], pa.int64()))
    dates = pa.array([0, 19_000, None], pa.date32())
    assert _hashes(dates) == _hashes(pa.array([0, 19_000, None], pa.int64()))
    with pytest.raises(InvalidOperationError, match="cannot be a shuffle key"):
        hash_keys([pa.array([[("a", 1)]], pa.map_(pa.string(), pa.int64()))])
    with pytest.raises(InvalidOperationError):
        hash_keys([])


def test_multi_column_keys_hash_equal_rows_alike() -> None:
    first = pa.array([1, 1, 2, 1, None, None], pa.int32())
    second = pa.array(["x", "x", "x", "y", "x", "x"])
    hashes = _hashes(first, second)
    assert hashes[0] == hashes[1]
    assert hashes[4] == hashes[5]
    assert len({hashes[0], hashes[2], hashes[3], hashes[4]}) == 4
    assert _hashes(pa.array([1, 1], pa.int64()), second.slice(0, 2)) == hashes[:2]


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


def test_empty_children_hash_whatever_their_buffers() -> None:
    struct = pa.struct([("d", pa.decimal128(38, 10)), ("s", pa.string())])
    column = pa.array([[], None, [[]]], pa.list_(pa.list_(struct)))
    hashes = [int(value) for value in hash_keys([column])]
    assert len(set(hashes)) == 3
