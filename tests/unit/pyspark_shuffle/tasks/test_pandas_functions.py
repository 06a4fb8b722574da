"""A pandas function run on one group's Arrow table (one cogroup's two), in process (no Spark
session): what it is handed and what becomes of its result, as under Spark's ``applyInPandas``
on the installed PySpark (the same through Spark: tests/integration/
test_pyspark_pandas_group_apply.py and test_pyspark_pandas_cogroup.py)."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import inspect
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.errors import PySparkRuntimeError, PySparkTypeError, PySparkValueError
from pyspark.sql import SparkSession
from pyspark.sql.types import (
    DataType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from pyspark_shuffle import pandas_function
from pyspark_shuffle.spark.compat import SPARK_VERSION
from pyspark_shuffle.tasks.pandas_functions import (
    PandasCogroupFunction,
    PandasCogroupsFunction,
    PandasGroupFunction,
    PandasGroupsFunction,
    PandasSettings,
)

ZONE = "America/Los_Angeles"

# The error classes of the installed release (renamed in Spark 4.2). Each error's text is
# "[CLASS] message" from 3.5 on (``getCondition`` is Spark 4's).
NAMES_MISMATCH, COUNT_MISMATCH = (
    ("RESULT_COLUMN_NAMES_MISMATCH", "RESULT_COLUMN_SCHEMA_MISMATCH")
    if SPARK_VERSION >= (4, 2)
    else ("RESULT_COLUMNS_MISMATCH_FOR_PANDAS_UDF", "RESULT_LENGTH_MISMATCH_FOR_PANDAS_UDF")
)


def _schema(**types: DataType) -> StructType:
    return StructType([StructField(name, data_type) for name, data_type in types.items()])


KEY_VALUE = _schema(k=LongType(), v=DoubleType())


def _group() -> pa.Table:
    """One group of key 7, as a reducer has it: timestamps in the session's zone (as Spark
    hands them to Python)."""
    return pa.table(
        {
            "k": pa.array([7, 7, 7], pa.int64()),
            "small": pa.array([1, None, 3], pa.int32()),
            "v": pa.array([1.5, 2.5, None]),
            "s": pa.array(["a", None, "c"]),
            "ts": pa.array(
                [datetime.datetime(2024, 3, 10, 9, 30, tzinfo=datetime.UTC)] * 3,
                pa.timestamp("us", tz=ZONE),
            ),
            "d": pa.array([datetime.date(2024, 1, 2)] * 3),
            "dec": pa.array([decimal.Decimal("1.25")] * 3, pa.decimal128(10, 2)),
        }
    )


def _run(
    function: Callable[..., Any],
    schema: StructType = KEY_VALUE,
    keys: tuple[str, ...] = ("k",),
    table: pa.Table | None = None,
    **settings: bool,
) -> pa.Table:
    adapter = PandasGroupFunction.of(
        pandas_function(function), keys, schema, PandasSettings(ZONE, **settings)
    )
    return adapter(_group() if table is None else table)


def test_the_function_gets_the_frame_spark_would_hand_it() -> None:
    seen: list[pd.DataFrame] = []

    def keep(pdf: pd.DataFrame) -> pd.DataFrame:
        seen.append(pdf)
        return pdf[["k", "v"]]

    _run(keep)
    [frame] = seen
    assert list(frame.columns) == ["k", "small", "v", "s", "ts", "d", "dec"]
    assert frame.dtypes.to_dict() == {
        "k": np.dtype("int64"),
        "small": np.dtype("float64"),  # an integer column with nulls: floats and NaN
        "v": np.dtype("float64"),
        "s": np.dtype("object"),
        "ts": np.dtype("datetime64[ns]"),
        "d": np.dtype("object"),
        "dec": np.dtype("object"),
    }
    assert np.isnan(frame["small"][1])
    assert frame["s"].tolist() == ["a", None, "c"]
    # 09:30 UTC is 01:30 in Los Angeles (PST, hours before the switch to DST that day).
    assert frame["ts"][0] == pd.Timestamp("2024-03-10 01:30:00")
    assert frame["d"][0] == datetime.date(2024, 1, 2)
    assert frame["dec"][0] == decimal.Decimal("1.25")


def test_the_key_is_the_first_rows_key_values_as_numpy_scalars() -> None:
    keys: list[tuple[Any, ...]] = []

    def keep_key(key: tuple[Any, ...], pdf: pd.DataFrame) -> pd.DataFrame:
        keys.append(key)
        return pdf[["k", "v"]]

    _run(keep_key, keys=("k", "small", "s"))
    [key] = keys
    assert key == (7, 1.0, "a")
    assert [type(value) for value in key] == [np.int64, np.float64, str]


def test_a_lambda_takes_the_key_by_its_parameters_as_spark_counts_them() -> None:
    out = _run(lambda key, pdf: pd.DataFrame({"k": [key[0]], "v": [len(pdf)]}))
    assert out.to_pydict() == {"k": [7], "v": [3.0]}


def test_named_columns_are_taken_by_name_in_the_schemas_order() -> None:
    out = _run(lambda pdf: pdf[["v", "k"]])
    assert out.schema.names == ["k", "v"]
    assert out.to_pydict() == {"k": [7, 7, 7], "v": [1.5, 2.5, None]}


def test_unnamed_columns_are_taken_by_position() -> None:
    out = _run(lambda pdf: pd.DataFrame({0: [1], 1: [2.5]}))
    assert out.to_pydict() == {"k": [1], "v": [2.5]}


def test_names_are_ignored_when_spark_is_told_to_assign_by_position() -> None:
    schema = _schema(a=StringType(), b=FloatType())
    out = _run(
        lambda pdf: pd.DataFrame({"x": ["hi"], "y": [1]}), schema, assign_columns_by_name=False
    )
    assert out.to_pydict() == {"a": ["hi"], "b": [1.0]}


def test_naive_timestamps_come_back_as_wall_times_in_the_session_zone() -> None:
    schema = _schema(k=LongType(), ts=TimestampType())
    out = _run(lambda pdf: pdf[["k", "ts"]], schema)
    instants = out.column("ts").cast(pa.timestamp("us", tz="UTC")).to_pylist()
    assert instants == [datetime.datetime(2024, 3, 10, 9, 30, tzinfo=datetime.UTC)] * 3


def test_integers_into_a_double_column_are_cast() -> None:
    out = _run(lambda pdf: pd.DataFrame({"k": [1], "v": [2]}))
    assert out.schema.field("v").type == pa.float64()
    assert out.to_pydict() == {"k": [1], "v": [2.0]}


def test_a_frame_of_no_rows_and_no_columns_is_no_rows() -> None:
    out = _run(lambda pdf: pd.DataFrame())
    assert out.num_rows == 0
    assert out.schema.names == ["k", "v"]


def test_what_is_no_frame_fails_as_in_spark() -> None:
    with pytest.raises(PySparkTypeError) as raised:
        _run(lambda pdf: pdf.shape[0])
    assert str(raised.value) == (
        "[UDF_RETURN_TYPE] Return type of the user-defined function should be"
        " pandas.DataFrame, but is int."
    )


def test_wrong_names_fail_with_the_missing_and_unexpected_ones_sorted() -> None:
    with pytest.raises(PySparkRuntimeError) as raised:
        _run(lambda pdf: pd.DataFrame({"std": [1.0], "median": [2.0], "k": [1]}))
    assert str(raised.value).startswith(f"[{NAMES_MISMATCH}] Column names of the returned")
    assert str(raised.value).endswith(
        " do not match specified schema. Missing: v. Unexpected: median, std."
    )


def test_an_extra_named_column_is_unexpected_not_dropped() -> None:
    with pytest.raises(PySparkRuntimeError, match=r"\bUnexpected: extra\.$"):
        _run(lambda pdf: pd.DataFrame({"v": [1.0], "k": [3], "extra": [1]}))


def test_a_wrong_number_of_columns_by_position_fails() -> None:
    with pytest.raises(PySparkRuntimeError) as raised:
        _run(lambda pdf: pd.DataFrame({0: [1], 1: [2.0], 2: [3]}))
    assert str(raised.value).startswith(f"[{COUNT_MISMATCH}] Number of columns")
    assert str(raised.value).endswith(" match specified schema. Expected: 2 Actual: 3")


def test_an_empty_frame_with_columns_is_checked() -> None:
    with pytest.raises(PySparkRuntimeError) as raised:
        _run(lambda pdf: pd.DataFrame({"k": []}))
    assert str(raised.value).startswith(f"[{NAMES_MISMATCH}]")


def _conversion_message(dtype: str, arrow_type: str, value_error: bool) -> str:
    """What Spark says of a column ``v`` Arrow would not take (reworded in Spark 4.2)."""
    if SPARK_VERSION < (4, 2):
        return (
            f"Exception thrown when converting pandas.Series ({dtype}) with name 'v' to Arrow"
            f" Array ({arrow_type})."
        )
    if value_error:
        return (
            f"Failed to convert the value of the column 'v' with type '{dtype}' to Arrow type"
            f" '{arrow_type}'."
        )
    return (
        f"Cannot convert the output value of the column 'v' with type '{dtype}' to the"
        f" specified return type of the column: '{arrow_type}'. Please check if the data types"
        " match and try again."
    )


@pytest.mark.parametrize("safe", [False, True])
def test_a_value_arrow_cannot_convert_fails_with_sparks_message(safe: bool) -> None:
    with pytest.raises(PySparkValueError) as raised:
        _run(lambda pdf: pd.DataFrame({"k": [1], "v": ["not a number"]}), safe_conversion=safe)
    hint = (
        " It can be caused by overflows or other unsafe conversions warned by Arrow. Arrow safe"
        " type check can be disabled by using SQL config"
        " `spark.sql.execution.pandas.convertToArrowArraySafely`."
    )
    message = _conversion_message("object", "double", value_error=True)
    assert str(raised.value) == message + (hint if safe else "")


def test_a_type_arrow_cannot_convert_fails_with_sparks_message() -> None:
    with pytest.raises(PySparkTypeError) as raised:
        _run(
            lambda pdf: pd.DataFrame({"k": [1], "v": [1.5]}), _schema(k=LongType(), v=StringType())
        )
    assert str(raised.value) == _conversion_message("float64", "string", value_error=False)


@pytest.mark.skipif(SPARK_VERSION < (4, 1), reason="intToDecimalCoercionEnabled: Spark 4.1")
def test_integers_become_decimals_only_where_spark_is_told_to() -> None:
    schema = _schema(k=LongType(), v=DecimalType(10, 2))
    out = _run(lambda pdf: pd.DataFrame({"k": [1], "v": [12345]}), schema, int_to_decimal=True)
    assert out.column("v").to_pylist() == [decimal.Decimal("12345.00")]
    with pytest.raises(PySparkValueError):
        _run(lambda pdf: pd.DataFrame({"k": [1], "v": [12345]}), schema)


def test_an_unsafe_conversion_fails_only_where_spark_checks() -> None:
    schema = _schema(k=LongType(), v=IntegerType())
    with pytest.raises(PySparkValueError):
        _run(lambda pdf: pd.DataFrame({"k": [1], "v": [2**40]}), schema, safe_conversion=True)
    assert _run(lambda pdf: pd.DataFrame({"k": [1], "v": [2**40]}), schema).num_rows == 1


def _halves(pdf: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"k": pdf["k"], "v": pdf["v"] / 2})


def test_the_adapter_pickles_as_the_driver_ships_it() -> None:
    adapter = PandasGroupFunction.of(
        pandas_function(_halves), ["k"], KEY_VALUE, PandasSettings(ZONE)
    )
    again = pickle.loads(pickle.dumps(adapter))
    assert again == adapter
    assert again(_group()).column("v").to_pylist() == [0.75, 1.25, None]


SETTING_KEYS = {
    "assign_columns_by_name": "spark.sql.legacy.execution.pandas.groupedMap.assignColumnsByName",
    "safe_conversion": "spark.sql.execution.pandas.convertToArrowArraySafely",
    "large_var_types": "spark.sql.execution.arrow.useLargeVarTypes",
}


def test_settings_are_read_from_the_session_with_sparks_own_defaults(spark: SparkSession) -> None:
    for key in SETTING_KEYS.values():
        spark.conf.unset(key)
    defaults = PandasSettings.of(spark)
    # Spark's default, not one pyshuffle assumes (convertToArrowArraySafely: true on 4.3)
    for field, key in SETTING_KEYS.items():
        assert getattr(defaults, field) == (str(spark.conf.get(key)).lower() == "true")
    try:
        for key in SETTING_KEYS.values():
            spark.conf.set(key, "false")
        spark.conf.set(SETTING_KEYS["large_var_types"], "TRUE")
        assert PandasSettings.of(spark) == dataclasses.replace(
            defaults, assign_columns_by_name=False, safe_conversion=False, large_var_types=True
        )
    finally:
        for key in SETTING_KEYS.values():
            spark.conf.unset(key)


def _refunds(rows: int) -> pa.Table:
    """The other side of a cogroup: key 7 (with a null after it), ``rows`` rows of it."""
    return pa.table(
        {
            "k": pa.array([7, None][:rows], pa.int64()),
            "amount": pa.array([0.5, 1.5][:rows], pa.float64()),
        }
    )


def _cogroup(
    function: Callable[..., Any], schema: StructType = KEY_VALUE, **settings: bool
) -> PandasCogroupFunction:
    return PandasCogroupFunction.of(
        pandas_function(function), ["k"], schema, PandasSettings(ZONE, **settings)
    )


def test_a_cogroup_function_gets_both_sides_frames_as_spark_hands_them() -> None:
    seen: list[tuple[pd.DataFrame, pd.DataFrame]] = []

    def keep(left: pd.DataFrame, right: pd.DataFrame) -> pd.DataFrame:
        seen.append((left, right))
        return pd.DataFrame({"k": [len(left)], "v": [float(len(right))]})

    out = _cogroup(keep)(_group(), _refunds(2))
    assert out.to_pydict() == {"k": [3], "v": [2.0]}
    [(left, right)] = seen
    assert left.dtypes.to_dict()["small"] == np.dtype("float64")
    assert left["ts"][0] == pd.Timestamp("2024-03-10 01:30:00")  # naive, in the session's zone
    assert right.dtypes.to_dict() == {"k": np.dtype("float64"), "amount": np.dtype("float64")}


def test_a_side_without_rows_is_an_empty_frame_of_its_columns() -> None:
    seen: list[pd.DataFrame] = []

    def keep(left: pd.DataFrame, right: pd.DataFrame) -> pd.DataFrame:
        seen.append(right)
        return pd.DataFrame()

    assert _cogroup(keep)(_group(), _refunds(0)).num_rows == 0
    [right] = seen
    assert len(right) == 0
    assert right.dtypes.to_dict() == {"k": np.dtype("int64"), "amount": np.dtype("float64")}


def test_a_cogroups_key_is_the_lefts_or_else_the_rights_as_numpy_scalars() -> None:
    keys: list[tuple[Any, ...]] = []

    def keep_key(key: tuple[Any, ...], left: pd.DataFrame, right: pd.DataFrame) -> pd.DataFrame:
        keys.append(key)
        return pd.DataFrame({"k": [key[0]], "v": [1.0]})

    wrapped = _cogroup(keep_key)
    assert wrapped.pass_key
    wrapped(_group().slice(0, 0), _refunds(2))
    wrapped(_group(), _refunds(0))
    assert keys == [(7.0,), (7,)]
    assert [type(key[0]) for key in keys] == [np.float64, np.int64]  # the right's k has a null


def test_a_cogroup_lambda_takes_the_key_by_its_parameters_as_spark_counts_them() -> None:
    with_key = _cogroup(lambda key, left, right: pd.DataFrame({"k": [key[0]], "v": [0.5]}))
    assert with_key(_group(), _refunds(1)).to_pydict() == {"k": [7], "v": [0.5]}
    assert not _cogroup(lambda left, right: left[["k", "v"]]).pass_key


def test_a_cogroups_result_is_checked_and_converted_as_a_groups() -> None:
    named = _cogroup(lambda left, right: pd.DataFrame({"v": [1], "k": [2]}))
    assert named(_group(), _refunds(1)).to_pydict() == {"k": [2], "v": [1.0]}
    with pytest.raises(PySparkRuntimeError) as raised:
        _cogroup(lambda left, right: pd.DataFrame({"k": [1], "more": [2], "add": [3]}))(
            _group(), _refunds(1)
        )
    assert str(raised.value).startswith(f"[{NAMES_MISMATCH}]")
    assert str(raised.value).endswith("Missing: v. Unexpected: add, more.")
    with pytest.raises(PySparkTypeError, match=r"pandas\.DataFrame, but is int\.$"):
        _cogroup(lambda left, right: len(left) + len(right))(_group(), _refunds(1))


def test_the_cogroup_adapter_pickles_and_takes_two_tables() -> None:
    adapter = _cogroup(_sizes_of_both)
    assert list(inspect.signature(adapter).parameters) == ["left", "right"]
    again = pickle.loads(pickle.dumps(adapter))
    assert again == adapter
    assert again(_group(), _refunds(2)).to_pydict() == {"k": [3], "v": [2.0]}


def _sizes_of_both(left: pd.DataFrame, right: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"k": [len(left)], "v": [len(right)]})


def _partition(groups: int, with_nulls: bool) -> pa.Table:
    """A reducer's rows sorted by key: ``groups`` keys of 1 to 4 rows each."""
    keys = [key for key in range(groups) for _ in range(key % 4 + 1)]
    counts = [None if with_nulls and index % 5 == 0 else index for index in range(len(keys))]
    return pa.table(
        {
            "k": pa.array(keys, pa.int64()),
            "n": pa.array(counts, pa.int64()),
            "v": pa.array([index / 2 for index in range(len(keys))]),
            "s": pa.array([f"s{index}" for index in range(len(keys))]),
        }
    )


def _each_group_alone(function: Callable[..., Any], table: pa.Table) -> list[Any]:
    per_group = PandasGroupFunction.of(pandas_function(function), ["k"], KEY_VALUE, SETTINGS)
    rows = []
    for key in table.column("k").unique().to_pylist():
        group = table.filter(pc.equal(table.column("k"), key))
        rows += per_group(group).to_pylist()
    return sorted(rows, key=lambda row: (row["k"], row["v"]))


def _all_groups(function: Callable[..., Any], table: pa.Table) -> list[Any]:
    per_group = PandasGroupFunction.of(pandas_function(function), ["k"], KEY_VALUE, SETTINGS)
    batches = list(PandasGroupsFunction(per_group)(table))
    rows = pa.Table.from_batches(batches, schema=batches[0].schema).to_pylist() if batches else []
    return sorted(rows, key=lambda row: (row["k"], row["v"]))


SETTINGS = PandasSettings(ZONE)


def _summary(pdf: pd.DataFrame) -> pd.DataFrame:
    # The frame as Spark hands it: indexed from 0; n's dtype says whether it had nulls.
    assert list(pdf.index) == list(range(len(pdf)))
    total = pdf["v"].sum() + (0.5 if pdf["n"].dtype == np.dtype("int64") else 0.0)
    return pd.DataFrame({"v": [total], "k": [pdf["k"][0]]})


@pytest.mark.parametrize("with_nulls", [False, True])
def test_every_group_of_a_partition_gets_what_it_alone_would_get(with_nulls: bool) -> None:
    table = _partition(groups=3_000, with_nulls=with_nulls)  # more rows than one run
    expected = _each_group_alone(_summary, table)
    assert len(expected) == 3_000
    assert _all_groups(_summary, table) == expected


def _of_mixed_shapes(pdf: pd.DataFrame) -> pd.DataFrame:
    key = int(pdf["k"][0])
    if key % 3 == 0:
        return pd.DataFrame()  # no rows
    if key % 3 == 1:  # by position, integers cast to the schema's double
        return pd.DataFrame([[key, len(pdf)]])
    return pd.DataFrame({"v": [float(len(pdf))] * 2, "k": [key] * 2})


def test_results_of_different_shapes_and_dtypes_convert_as_each_alone() -> None:
    table = _partition(groups=50, with_nulls=False)
    assert _all_groups(_of_mixed_shapes, table) == _each_group_alone(_of_mixed_shapes, table)


def test_a_result_that_fails_to_convert_raises_its_own_error() -> None:
    def text_for_one(pdf: pd.DataFrame) -> pd.DataFrame:
        key = int(pdf["k"][0])
        return pd.DataFrame({"k": [key], "v": ["many" if key == 7 else 1.0]})

    table = _partition(groups=20, with_nulls=False)
    with pytest.raises(Exception) as alone:
        _each_group_alone(text_for_one, table)
    with pytest.raises(type(alone.value)) as together:
        _all_groups(text_for_one, table)
    assert str(together.value) == str(alone.value)


def _total(pdf: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"k": pdf["k"][:1], "v": [pdf["v"].sum()]})


def test_groups_out_of_order_are_gathered_first() -> None:
    table = _partition(groups=30, with_nulls=False)
    shuffled = table.take(np.random.default_rng(3).permutation(table.num_rows))
    assert _all_groups(_total, shuffled) == _each_group_alone(_total, table)


def _both_sides(left: pd.DataFrame, right: pd.DataFrame) -> pd.DataFrame:
    # Each side as Spark hands it: indexed from 0, its own columns even where empty.
    assert list(left.index) == list(range(len(left)))
    assert list(right.columns) == ["k", "n", "v", "s"]
    key = left["k"][0] if len(left) else right["k"][0]
    nulls = 0.5 if left["n"].dtype == np.dtype("float64") else 0.0
    return pd.DataFrame({"k": [key], "v": [len(left) * 1000 + len(right) + nulls]})


@pytest.mark.parametrize("with_nulls", [False, True])
def test_every_key_of_two_sides_gets_what_it_alone_would_get(with_nulls: bool) -> None:
    left = _partition(groups=3_000, with_nulls=with_nulls)
    right = _partition(groups=4_000, with_nulls=False).filter(  # keys 3,000 and up: right only
        pc.not_equal(pc.bit_wise_and(pc.field("k"), 1), 1)  # every odd key: left only
    )
    cogroup = PandasCogroupFunction.of(pandas_function(_both_sides), ["k"], KEY_VALUE, SETTINGS)
    expected = []
    for key in pc.unique(pa.chunked_array([left["k"], right["k"]])).to_pylist():
        sides = [table.filter(pc.equal(table["k"], key)) for table in (left, right)]
        expected += cogroup(*sides).to_pylist()
    shuffled = right.take(np.random.default_rng(5).permutation(right.num_rows))
    batches = list(PandasCogroupsFunction(cogroup)(left, shuffled))
    together = pa.Table.from_batches(batches).to_pylist()
    assert len(expected) == 3_000 + 500
    assert sorted(together, key=lambda row: row["k"]) == sorted(expected, key=lambda row: row["k"])
