"""An Arrow function run on one group's (one cogroup's) tables, in process (no Spark session):
what it is handed and how its result is checked, as under Spark's ``applyInArrow`` on the
installed PySpark (the same through Spark:
tests/integration/test_pyspark_arrow_functions.py)."""

from __future__ import annotations

import datetime
import inspect
import pickle
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
from pyspark.errors import PySparkRuntimeError, PySparkTypeError
from pyspark.sql.types import (
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from pyspark_shuffle.spark.compat import SPARK_VERSION
from pyspark_shuffle.tasks.arrow_functions import ArrowCogroupFunction, ArrowGroupFunction
from pyspark_shuffle.tasks.pandas_functions import PandasSettings

ZONE = "America/Los_Angeles"

# The error classes of the installed release (renamed in Spark 4.2); before 4.0, which has no
# applyInArrow, pyshuffle's own checks say the newest.
NAMES_MISMATCH, TYPES_MISMATCH = (
    ("RESULT_COLUMNS_MISMATCH_FOR_ARROW_UDF", "RESULT_TYPE_MISMATCH_FOR_ARROW_UDF")
    if (4, 0) <= SPARK_VERSION < (4, 2)
    else ("RESULT_COLUMN_NAMES_MISMATCH", "RESULT_COLUMN_TYPES_MISMATCH")
)


def _schema(**types: DataType) -> StructType:
    return StructType([StructField(name, data_type) for name, data_type in types.items()])


KEY_VALUE = _schema(k=LongType(), v=IntegerType())


def _group() -> pa.Table:
    """One group of key 7, as a reducer has it: the declared nullability (k never null)."""
    schema = pa.schema(
        [
            pa.field("k", pa.int64(), nullable=False),
            pa.field("v", pa.int32()),
            pa.field("pairs", pa.list_(pa.field("item", pa.int64(), nullable=False))),
            pa.field("t", pa.timestamp("us", tz=ZONE)),
        ]
    )
    instant = datetime.datetime(2024, 3, 10, 9, 30, tzinfo=datetime.UTC)
    return pa.table([[7, 7, 7], [1, None, 3], [[1], [], [2, 3]], [instant] * 3], schema=schema)


def _run(
    function: Callable[..., Any],
    schema: StructType = KEY_VALUE,
    keys: tuple[str, ...] = ("k",),
    **settings: bool,
) -> pa.Table:
    wrapped = ArrowGroupFunction.of(function, keys, schema, PandasSettings(ZONE, **settings))
    return wrapped(_group())


def test_the_function_gets_every_column_nullable_as_spark_hands_them() -> None:
    seen: list[pa.Table] = []

    def keep(table: pa.Table) -> pa.Table:
        seen.append(table)
        return table.select(["k", "v"])

    _run(keep)
    [table] = seen
    assert table.schema == pa.schema(
        [
            pa.field("k", pa.int64()),
            pa.field("v", pa.int32()),
            pa.field("pairs", pa.list_(pa.field("item", pa.int64(), nullable=False))),
            pa.field("t", pa.timestamp("us", tz=ZONE)),
        ]
    )
    assert table.equals(_group().cast(table.schema))


def test_the_key_is_the_first_rows_key_values_as_arrow_scalars() -> None:
    keys: list[tuple[pa.Scalar, ...]] = []

    def keep_key(key: tuple[pa.Scalar, ...], table: pa.Table) -> pa.Table:
        keys.append(key)
        return table.select(["k", "v"])

    _run(keep_key, keys=("k", "v"))
    assert keys == [(pa.scalar(7, pa.int64()), pa.scalar(1, pa.int32()))]


def test_the_wrapper_takes_the_table_alone_whatever_the_function_takes() -> None:
    def with_key(key: tuple[pa.Scalar, ...], table: pa.Table) -> pa.Table:
        return table

    for function in (with_key, lambda key, table: table, lambda table: table):
        wrapped = ArrowGroupFunction.of(function, ["k"], KEY_VALUE, PandasSettings(ZONE))
        assert list(inspect.signature(wrapped).parameters) == ["table"]
    assert ArrowGroupFunction.of(with_key, ["k"], KEY_VALUE, PandasSettings(ZONE)).pass_key


def test_a_column_that_only_carries_a_key_gives_the_key_and_is_not_handed_over() -> None:
    seen: list[tuple[tuple[pa.Scalar, ...], list[str]]] = []

    def keep(key: tuple[pa.Scalar, ...], table: pa.Table) -> pa.Table:
        seen.append((key, table.column_names))
        return table.select(["k", "v"])

    wrapped = ArrowGroupFunction.of(
        keep, ["k", "odd"], KEY_VALUE, PandasSettings(ZONE), key_only=["odd"]
    )
    group = _group().append_column("odd", pa.array([True] * 3))
    assert wrapped(group).num_rows == 3
    assert seen == [((pa.scalar(7, pa.int64()), pa.scalar(True)), ["k", "v", "pairs", "t"])]


def test_named_columns_are_taken_by_name_in_the_schemas_order() -> None:
    out = _run(lambda table: table.select(["v", "k"]))
    assert out.schema.names == ["k", "v"]
    assert out.to_pydict() == {"k": [7, 7, 7], "v": [1, None, 3]}


def test_by_position_names_are_ignored_and_become_the_schemas() -> None:
    schema = _schema(a=LongType(), b=IntegerType())
    out = _run(lambda table: table.select(["k", "v"]), schema, assign_columns_by_name=False)
    assert out.to_pydict() == {"a": [7, 7, 7], "b": [1, None, 3]}


def test_a_table_of_no_rows_and_no_columns_is_no_rows() -> None:
    out = _run(lambda table: pa.table({}))
    assert out.num_rows == 0
    assert out.schema.names == ["k", "v"]


def test_timestamps_are_expected_in_utc_exactly() -> None:
    schema = _schema(k=LongType(), t=TimestampType())
    out = _run(lambda table: table.select(["k", "t"]).cast(_utc_schema()), schema)
    assert out.column("t").type == pa.timestamp("us", tz="UTC")
    with pytest.raises(PySparkRuntimeError) as raised:
        _run(lambda table: table.select(["k", "t"]), schema)  # in the session's zone
    assert str(raised.value).startswith(f"[{TYPES_MISMATCH}]")
    assert f"column 't' (expected timestamp[us, tz=UTC], actual timestamp[us, tz={ZONE}])" in str(
        raised.value
    )


def _utc_schema() -> pa.Schema:
    return pa.schema([("k", pa.int64()), ("t", pa.timestamp("us", tz="UTC"))])


def test_a_type_not_exactly_the_schemas_fails_and_is_never_cast() -> None:
    with pytest.raises(PySparkRuntimeError) as raised:
        _run(
            lambda table: table.select(["k", "v"]).cast(
                pa.schema([("k", pa.int32()), ("v", pa.int64())])
            )
        )
    assert str(raised.value).startswith(f"[{TYPES_MISMATCH}]")
    assert (
        "column 'k' (expected int64, actual int32), column 'v' (expected int32, actual int64)"
        in str(raised.value)
    )


def test_wrong_names_fail_with_the_missing_and_unexpected_ones_sorted() -> None:
    schema = _schema(k=LongType(), m=IntegerType())
    with pytest.raises(PySparkRuntimeError) as raised:
        _run(lambda table: table.select(["k", "v"]).append_column("v2", table.column("v")), schema)
    assert str(raised.value).startswith(f"[{NAMES_MISMATCH}] Column names of the returned")
    assert str(raised.value).endswith(
        " do not match specified schema. Missing: m. Unexpected: v, v2."
    )


@pytest.mark.skipif(
    (4, 0) <= SPARK_VERSION < (4, 3), reason="Spark checks the count from 4.3 (in Python)"
)
def test_a_wrong_number_of_columns_by_position_fails() -> None:
    with pytest.raises(PySparkRuntimeError) as raised:
        _run(lambda table: table.select(["k", "v", "t"]), assign_columns_by_name=False)
    assert str(raised.value) == (
        "[RESULT_COLUMN_SCHEMA_MISMATCH] Number of columns of the returned data doesn't match"
        " specified schema. Expected: 2 Actual: 3"
    )


@pytest.mark.parametrize(
    ("result", "name"),
    [((1,), "tuple"), (pa.record_batch({"k": [1], "v": [2]}), "RecordBatch")],
    ids=["tuple", "record-batch"],
)
def test_what_is_no_table_fails_as_in_spark(result: object, name: str) -> None:
    with pytest.raises(PySparkTypeError) as raised:
        _run(lambda table: result)
    assert str(raised.value) == (
        "[UDF_RETURN_TYPE] Return type of the user-defined function should be pyarrow.Table,"
        f" but is {name}."
    )


def _cogroup_sizes(key: tuple[pa.Scalar, ...], left: pa.Table, right: pa.Table) -> pa.Table:
    return pa.table(
        {
            "k": pa.array([key[0].as_py()], pa.int64()),
            "s": [f"{left.num_rows}/{right.num_rows}"],
        }
    )


COGROUP_SCHEMA = _schema(k=LongType(), s=StringType())


def test_a_cogroups_key_is_the_lefts_or_else_the_rights() -> None:
    wrapped = ArrowCogroupFunction.of(_cogroup_sizes, ["k"], COGROUP_SCHEMA, PandasSettings(ZONE))
    assert list(inspect.signature(wrapped).parameters) == ["left", "right"]
    right = pa.table({"k": pa.array([9, 9], pa.int64()), "w": [0.5, 1.5]})
    assert wrapped(_group(), right).to_pydict() == {"k": [7], "s": ["3/2"]}
    assert wrapped(_group().slice(0, 0), right).to_pydict() == {"k": [9], "s": ["0/2"]}


def test_a_cogroup_without_the_key_gets_both_tables_nullable() -> None:
    seen: list[tuple[pa.Schema, pa.Schema]] = []

    def sizes(left: pa.Table, right: pa.Table) -> pa.Table:
        seen.append((left.schema, right.schema))
        return pa.table(
            {"s": [f"{left.num_rows}/{right.num_rows}"], "k": pa.array([1], pa.int64())}
        )

    wrapped = ArrowCogroupFunction.of(sizes, ["k"], COGROUP_SCHEMA, PandasSettings(ZONE))
    right = pa.table(
        [pa.array([7], pa.int64())], schema=pa.schema([pa.field("k", pa.int64(), False)])
    )
    assert wrapped(_group(), right).to_pydict() == {"k": [1], "s": ["3/1"]}
    [(left_schema, right_schema)] = seen
    assert all(field.nullable for field in [*left_schema, *right_schema])


def test_a_cogroups_wrong_type_fails_as_a_groups() -> None:
    def int32_count(left: pa.Table, right: pa.Table) -> pa.Table:
        return pa.table({"k": pa.array([1], pa.int32()), "s": ["x"]})

    wrapped = ArrowCogroupFunction.of(int32_count, ["k"], COGROUP_SCHEMA, PandasSettings(ZONE))
    with pytest.raises(PySparkRuntimeError, match=r"column 'k' \(expected int64, actual int32\)"):
        wrapped(_group(), _group())


def _keep_k_v(table: pa.Table) -> pa.Table:
    return table.select(["v", "k"])


def test_the_wrappers_pickle_as_the_driver_ships_them() -> None:
    wrapped = ArrowGroupFunction.of(_keep_k_v, ["k"], KEY_VALUE, PandasSettings(ZONE))
    again = pickle.loads(pickle.dumps(wrapped))
    assert again == wrapped
    assert again(_group()).schema.names == ["k", "v"]
    cogrouped = ArrowCogroupFunction.of(_cogroup_sizes, ["k"], COGROUP_SCHEMA, PandasSettings(ZONE))
    assert pickle.loads(pickle.dumps(cogrouped)) == cogrouped
