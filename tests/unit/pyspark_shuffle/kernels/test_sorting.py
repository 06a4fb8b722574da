"""``pyspark_shuffle.kernels.sorting``: sort indices in Spark's order (nulls first, NaN
largest, nested keys too), stable in mixed directions."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest

from pyspark_shuffle.kernels.sorting import SortKey, sort_indices, sort_keys_of
from shuffle_api import InvalidOperationError
from tests.unit.pyspark_shuffle.kernels.spark_reference import NAN, _canonical, _spark_key


def test_sort_indices_places_nulls_as_spark_does() -> None:
    table = pa.table({"a": [3, None, 1, None, 2]})
    ascending = table.take(sort_indices(table, [SortKey("a")])).column("a").to_pylist()
    assert ascending == [None, None, 1, 2, 3]
    descending = table.take(sort_indices(table, [SortKey("a", False)])).column("a").to_pylist()
    assert descending == [3, 2, 1, None, None]


def test_sort_indices_places_nan_as_spark_does() -> None:
    # Spark: NaN is larger than every other value, null smaller.
    table = pa.table({"x": pa.array([1.0, NAN, None, -1.0, 2.0], pa.float64())})

    def sorted_by(ascending: bool) -> list[Any]:
        order = sort_indices(table, [SortKey("x", ascending)])
        return [_canonical(v) for v in table.take(order).column("x").to_pylist()]

    assert sorted_by(True) == [None, -1.0, 1.0, 2.0, ("NaN",)]
    assert sorted_by(False) == [("NaN",), 2.0, 1.0, -1.0, None]


def test_sort_indices_mixed_directions_is_stable() -> None:
    rng = random.Random(3)
    rows = [
        {
            "a": rng.choice([1, 2, None]),
            "b": rng.choice(["p", "q", None]),
            "c": rng.choice([0.5, NAN, None]),
            "i": i,
        }
        for i in range(300)
    ]
    table = pa.Table.from_pylist(rows)
    keys = sort_keys_of(["a", "b", "c"], [True, False, False])
    got = table.take(sort_indices(table, keys)).column("i").to_pylist()
    expected = [row["i"] for row in sorted(rows, key=lambda row: _spark_key(row, keys))]
    assert got == expected


def test_sort_keys_of_checks_its_arguments() -> None:
    assert sort_keys_of(["a", "b"], False) == (SortKey("a", False), SortKey("b", False))
    with pytest.raises(InvalidOperationError, match="ascending"):
        sort_keys_of(["a", "b"], [True])
    with pytest.raises(InvalidOperationError):
        sort_keys_of([], True)
    with pytest.raises(InvalidOperationError, match="'z'"):
        sort_indices(pa.table({"a": [1]}), [SortKey("z")])


def test_nested_sort_keys_order_as_spark_in_both_directions() -> None:
    table = pa.table(
        {"k": pa.array([[2], [1, None], None, [1], [], [1, 5], [None]]), "row": list(range(7))}
    )
    ascending = table.take(sort_indices(table, [SortKey("k")])).column("k").to_pylist()
    assert ascending == [None, [], [None], [1], [1, None], [1, 5], [2]]
    descending = table.take(sort_indices(table, [SortKey("k", False)])).column("k").to_pylist()
    assert descending == [[2], [1, 5], [1, None], [1], [None], [], None]
