"""``SparkShuffle.cogroup_apply`` of a pandas function returns what Spark's own
``groupBy(keys).cogroup(other.groupBy(keys)).applyInPandas`` returns on the same data and
function: the frames (dtypes, nulls, an empty side's columns) and key it is handed, with and
without the key, keys on one side only and a null key; and it fails as Spark does on a wrong
result.

On the default service only: what differs is in the reduce tasks, the same for every
service."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import pandas as pd
import pytest
from pyspark.errors import PythonException

from pyspark_shuffle import SparkShuffle, pandas_function
from tests.integration.services import DEFAULT_SERVICE_ONLY
from tests.integration.spark_rows import multiset

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = DEFAULT_SERVICE_ONLY


@pytest.fixture(scope="module")
def orders(spark: SparkSession) -> DataFrame:
    """k: keys 0-6 and a null one; n: an int with nulls; s: strings with nulls."""
    frame: DataFrame = spark.range(0, 300, 1, 3).selectExpr(
        "case when id % 40 = 0 then null else id % 7 end as k",
        "case when id % 4 = 0 then null else cast(id as int) end as n",
        "case when id % 5 = 0 then null else concat('s', id % 9) end as s",
    )
    return frame.cache()


@pytest.fixture(scope="module")
def refunds(spark: SparkSession) -> DataFrame:
    """k: keys 4-9 and a null one (0-3 only in ``orders``, 7-9 only here); amount: doubles."""
    frame: DataFrame = spark.range(0, 90, 1, 2).selectExpr(
        "case when id % 30 = 0 then null else id % 6 + 4 end as k", "id * 0.25d as amount"
    )
    return frame.cache()


def _frame_text(pdf: pd.DataFrame) -> str:
    return f"{len(pdf)} rows; " + ", ".join(f"{name}:{pdf[name].dtype}" for name in pdf.columns)


HANDED = "key string, left string, right string"


def _handed(key: tuple[Any, ...], left: pd.DataFrame, right: pd.DataFrame) -> pd.DataFrame:
    """The key (its values' types) and each side's rows and dtypes, as the function got them."""
    return pd.DataFrame(
        {
            "key": [repr([(type(value).__name__, str(value)) for value in key])],
            "left": [_frame_text(left)],
            "right": [_frame_text(right)],
        }
    )


SUMS = "k long, orders long, n_sum double, s_max string, amount double"


def _sums(left: pd.DataFrame, right: pd.DataFrame) -> pd.DataFrame:
    """One row per key, columns in another order than the schema's (taken by name)."""
    keys = left["k"] if len(left) else right["k"]
    strings = left["s"].dropna()
    return pd.DataFrame(
        {
            "amount": [right["amount"].sum() if len(right) else None],
            "s_max": [strings.max() if len(strings) else None],
            "n_sum": [left["n"].sum()],
            "orders": [len(left)],
            "k": [keys.iloc[0]],
        }
    )


def _spark(orders: DataFrame, refunds: DataFrame, function: Any, schema: str) -> DataFrame:
    return orders.groupBy("k").cogroup(refunds.groupBy("k")).applyInPandas(function, schema)


@pytest.mark.parametrize(
    ("function", "schema"), [(_handed, HANDED), (_sums, SUMS)], ids=["key-and-frames", "sums"]
)
def test_a_pandas_function_gives_what_cogroup_apply_in_pandas_gives(
    shuffle: SparkShuffle,
    orders: DataFrame,
    refunds: DataFrame,
    function: Any,
    schema: str,
) -> None:
    result = shuffle.cogroup_apply(orders, refunds, "k", pandas_function(function), schema)
    got = multiset(result)
    assert got == multiset(_spark(orders, refunds, function, schema))
    assert sum(got.values()) == 11  # keys 0-9 and the null one


def test_the_key_comes_from_the_left_or_else_the_right(
    shuffle: SparkShuffle, orders: DataFrame, refunds: DataFrame
) -> None:
    result = shuffle.cogroup_apply(orders, refunds, "k", pandas_function(_handed), HANDED)
    rows = {row["key"]: row for row in result.collect()}
    assert rows["[('int64', '1')]"]["right"] == "0 rows; k:int64, amount:float64"
    assert rows["[('int64', '9')]"]["left"] == "0 rows; k:int64, n:int32, s:object"
    # The null key's column holds only nulls: floats, NaN.
    assert rows["[('float64', 'nan')]"]["left"] == "8 rows; k:float64, n:float64, s:object"


def _error_line(error: PythonException) -> str:
    """The line of the worker's traceback that says what went wrong: ``[CLASS] message``."""
    found = re.search(r"\[(?:UDF_RETURN_TYPE|RESULT_[A-Z_]+)\][^\n]*", str(error))
    assert found, str(error)
    return found[0].strip()


def _wrong_names(left: pd.DataFrame, right: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"k": [1], "more": [len(left)]})


def _not_a_frame(left: pd.DataFrame, right: pd.DataFrame) -> int:
    return len(left) + len(right)


@pytest.mark.parametrize("function", [_wrong_names, _not_a_frame], ids=["names", "no-frame"])
def test_a_wrong_result_fails_with_sparks_error(
    shuffle: SparkShuffle, orders: DataFrame, refunds: DataFrame, function: Any
) -> None:
    schema = "k long, orders long"
    with pytest.raises(PythonException) as spark_error:
        _spark(orders, refunds, function, schema).collect()
    with pytest.raises(PythonException) as our_error:
        shuffle.cogroup_apply(orders, refunds, "k", pandas_function(function), schema).collect()
    assert _error_line(our_error.value) == _error_line(spark_error.value)
