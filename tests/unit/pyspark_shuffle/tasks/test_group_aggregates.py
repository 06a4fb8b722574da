"""Grouped-aggregate pandas and Arrow UDFs run on a reducer's sorted rows, in process (no
Spark session): what each UDF is handed per group and what becomes of its values (through
Spark: tests/integration/test_pyspark_dropin*.py)."""

from __future__ import annotations

import math
import pickle
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.errors import PySparkRuntimeError, PySparkTypeError, PySparkValueError
from pyspark.sql.types import (
    ArrayType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from pyspark_shuffle.spark.internals import arrow_aggregates_supported
from pyspark_shuffle.tasks.group_aggregates import GroupAggregate, GroupAggregation
from pyspark_shuffle.tasks.pandas_functions import PandasSettings

SETTINGS = PandasSettings(timezone="UTC")

# Sorted by k, as a reducer of group_apply_sorted hands them over; a null key is a group.
TABLE = pa.table(
    {
        "k": pa.array([None, 1, 1, 1, 2, 2], pa.int64()),
        "v": pa.array([7, 1, None, 3, 4, 5], pa.int64()),
        "w": [0.5, 1.0, 2.0, 3.0, 4.0, 5.0],
    }
)


def _aggregation(*aggregates: GroupAggregate, keep_keys: bool = True) -> GroupAggregation:
    fields = [StructField(f"a{index}", DoubleType()) for index in range(len(aggregates))]
    if keep_keys:
        fields.insert(0, StructField("k", LongType()))
    return GroupAggregation(("k",), aggregates, StructType(fields), SETTINGS)


def test_each_group_gets_its_rows_as_series_indexed_from_zero() -> None:
    seen: list[tuple[list[Any], list[int]]] = []

    def first_plus_mean(v: pd.Series, w: pd.Series) -> float:
        seen.append((v.tolist(), list(w.index)))
        return float(w[0] + v.mean())  # label 0: the group's first row, as in Spark

    result = _aggregation(GroupAggregate(first_plus_mean, ("v", "w")))(TABLE)
    assert result.column_names == ["k", "a0"]
    assert result.column("k").to_pylist() == [None, 1, 2]
    assert result.column("a0").to_pylist() == [7.5, 3.0, 8.5]
    # Nulls in an integer column arrive as NaN in a float Series, as Spark hands them over.
    one = seen[1][0]
    assert one[0] == 1.0 and math.isnan(one[1]) and one[2] == 3.0
    assert [index for _, index in seen] == [[0], [0, 1, 2], [0, 1]]


def test_several_udfs_each_read_their_own_columns_and_keys_may_be_left_out() -> None:
    aggregation = _aggregation(
        GroupAggregate(lambda v: v.sum(), ("v",)),
        GroupAggregate(lambda w: w.max(), ("w",)),
        keep_keys=False,
    )
    result = aggregation(TABLE)
    assert result.column_names == ["a0", "a1"]
    assert result.to_pydict() == {"a0": [7.0, 4.0, 9.0], "a1": [0.5, 3.0, 5.0]}


def test_a_list_value_stays_one_value_of_an_array_column() -> None:
    schema = StructType(
        [StructField("k", LongType()), StructField("both", ArrayType(DoubleType()))]
    )
    aggregation = GroupAggregation(
        ("k",),
        (GroupAggregate(lambda w: [w.min(), w.max()], ("w",)),),
        schema,
        SETTINGS,
    )
    assert aggregation(TABLE).column("both").to_pylist() == [[0.5, 0.5], [1.0, 3.0], [4.0, 5.0]]


def test_a_value_that_is_not_of_the_declared_type_fails_as_in_spark() -> None:
    aggregation = _aggregation(GroupAggregate(lambda v: "many", ("v",)))
    with pytest.raises((PySparkValueError, PySparkTypeError, ValueError, TypeError)) as raised:
        aggregation(TABLE)
    assert "double" in str(raised.value)


def test_a_declared_string_takes_the_values_as_spark_converts_them() -> None:
    schema = StructType([StructField("k", LongType()), StructField("name", StringType())])
    aggregation = GroupAggregation(
        ("k",), (GroupAggregate(lambda v: f"n={len(v)}", ("v",)),), schema, SETTINGS
    )
    assert aggregation(TABLE).column("name").to_pylist() == ["n=1", "n=3", "n=2"]


def test_the_aggregation_pickles_for_the_reduce_tasks() -> None:
    aggregation = _aggregation(GroupAggregate(sum, ("v",)))
    again = pickle.loads(pickle.dumps(aggregation))
    assert again(TABLE).equals(aggregation(TABLE))


# -- Arrow aggregate UDFs (Spark 4.3's worker) ----------------------------------------------

_ARROW_AGGREGATES = pytest.mark.skipif(
    not arrow_aggregates_supported(), reason="Arrow aggregate UDFs run as 4.3's: PySpark 4.3+"
)


def _arrow(*aggregates: GroupAggregate) -> GroupAggregation:
    fields = [StructField(f"a{index}", DoubleType()) for index in range(len(aggregates))]
    declared = StructType([StructField("k", LongType()), *fields])
    return GroupAggregation(("k",), aggregates, declared, SETTINGS, arrow=True)


@_ARROW_AGGREGATES
def test_an_arrow_udf_gets_each_groups_slice_and_its_value_is_cast() -> None:
    seen: list[list[Any]] = []

    def mean(v: pa.Array) -> pa.Scalar:
        seen.append(v.to_pylist())
        return pc.mean(v)

    result = _arrow(GroupAggregate(mean, ("v",)), GroupAggregate(len, ("w",)))(TABLE)
    assert seen == [[7], [1, None, 3], [4, 5]]
    assert all(isinstance(each, list) for each in seen)
    # An int (len) declared double: cast, as Spark's worker casts it.
    assert result.to_pydict() == {"k": [None, 1, 2], "a0": [7.0, 2.0, 4.5], "a1": [1.0, 3.0, 2.0]}


@_ARROW_AGGREGATES
def test_an_arrow_value_that_does_not_cast_fails_with_sparks_error_class() -> None:
    with pytest.raises(PySparkRuntimeError) as raised:
        _arrow(GroupAggregate(lambda v: "many", ("v",)))(TABLE)
    assert raised.value.getCondition() == "RESULT_COLUMN_TYPES_MISMATCH"


@_ARROW_AGGREGATES
def test_arrow_values_of_different_types_by_group_are_cast_one_by_one() -> None:
    def int_or_float(v: pa.Array) -> float | int:
        return len(v) if len(v) % 2 else 0.5

    result = _arrow(GroupAggregate(int_or_float, ("v",)))(TABLE)
    assert result.column("a0").to_pylist() == [1.0, 3.0, 0.5]
    assert _arrow(GroupAggregate(int_or_float, ("v",)))(TABLE.slice(0, 0)).num_rows == 0
