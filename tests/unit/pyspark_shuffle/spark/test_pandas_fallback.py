"""``pyspark_shuffle.spark.pandas_fallback``, pyshuffle's own grouped-map conversions for the
releases without PySpark's: measured against PySpark's own on the installed release."""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Callable
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
from pyspark.errors import PySparkException, PySparkTypeError, PySparkValueError
from pyspark.sql.types import (
    DecimalType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from pyspark_shuffle.spark import pandas_fallback
from pyspark_shuffle.spark.compat import SPARK_VERSION
from pyspark_shuffle.spark.internals import check_pandas_result, pandas_group, pandas_result_batch

pytestmark = pytest.mark.skipif(
    SPARK_VERSION < (4, 2), reason="PySpark's own conversions to measure against: 4.2+"
)

ZONE = "Europe/Berlin"
SCHEMA = StructType(
    [
        StructField("k", LongType()),
        StructField("v", DoubleType()),
        StructField("ts", TimestampType()),
        StructField("dec", DecimalType(10, 2)),
        StructField("s", StringType()),
    ]
)


def _table() -> pa.Table:
    return pa.table(
        {
            "k": pa.array([1, 2, None], pa.int64()),
            "v": pa.array([1.5, None, 3.0]),
            "ts": pa.array(
                [datetime.datetime(2024, 10, 27, 0, 30, tzinfo=datetime.UTC), None, None],
                pa.timestamp("us", tz=ZONE),
            ),
            "dec": pa.array([decimal.Decimal("1.25"), None, None], pa.decimal128(10, 2)),
            "s": pa.array(["a", None, "c"]),
            "ntz": pa.array([datetime.datetime(2024, 1, 1), None, None], pa.timestamp("us")),
            "m": pa.array([[("x", 1)], None, []], pa.map_(pa.string(), pa.int32())),
            "d": pa.array([datetime.date(2024, 1, 1), None, None]),
        }
    )


def test_the_frame_is_pysparks() -> None:
    ours = pandas_fallback.to_pandas_frame(_table(), ZONE, nanoseconds=True)
    pysparks = pandas_group(_table(), timezone=ZONE, prefer_int_extension=False)
    pd.testing.assert_frame_equal(ours, pysparks)


def test_a_result_becomes_pysparks_batch() -> None:
    frame = pandas_group(_table(), timezone=ZONE, prefer_int_extension=False)
    result = frame[["s", "dec", "ts", "v", "k"]].assign(k=[1, 2, 3])
    settings: dict[str, Any] = {
        "timezone": ZONE,
        "safecheck": False,
        "by_name": True,
        "int_to_decimal": False,
        "large_var_types": False,
    }
    ours = pandas_fallback.to_arrow_batch(result, SCHEMA, arrow_cast=True, **settings)
    assert ours.equals(pandas_result_batch(result, SCHEMA, **settings))
    assert ours.num_rows == 3


@pytest.mark.parametrize(
    "result",
    [
        lambda: 3,
        lambda: pd.DataFrame({"k": [1], "median": [1.0]}),
        lambda: pd.DataFrame({0: [1], 1: [1.0]}),
        pd.DataFrame,
        lambda: pd.DataFrame({"k": [], "v": [], "ts": [], "dec": [], "s": []}),
    ],
)
@pytest.mark.parametrize("by_name", [True, False])
def test_the_checks_are_pysparks(result: Callable[[], Any], by_name: bool) -> None:
    def outcome(check: Callable[[], None]) -> str | None:
        try:
            check()
        except PySparkException as error:
            return f"{type(error).__name__}: {error}"
        return None

    ours = outcome(lambda: pandas_fallback.check_result(result(), SCHEMA, by_name))
    pysparks = outcome(lambda: check_pandas_result(result(), SCHEMA, by_name=by_name))
    assert ours == pysparks


def test_a_value_is_cast_only_as_spark_4_1_casts() -> None:
    schema = StructType([StructField("v", DoubleType())])
    settings: dict[str, Any] = {
        "timezone": ZONE,
        "safecheck": False,
        "by_name": True,
        "int_to_decimal": False,
        "large_var_types": False,
    }
    text = pd.DataFrame({"v": ["1.5"]})
    cast = pandas_fallback.to_arrow_batch(text, schema, arrow_cast=True, **settings)
    assert cast.column(0).to_pylist() == [1.5]
    with pytest.raises(PySparkValueError, match="Exception thrown when converting"):
        pandas_fallback.to_arrow_batch(text, schema, arrow_cast=False, **settings)


def test_conversion_errors_read_as_before_spark_4_2() -> None:
    settings: dict[str, Any] = {
        "timezone": ZONE,
        "arrow_cast": True,
        "by_name": True,
        "int_to_decimal": False,
        "large_var_types": False,
    }
    schema = StructType([StructField("v", DoubleType())])
    with pytest.raises(PySparkValueError) as raised:
        pandas_fallback.to_arrow_batch(
            pd.DataFrame({"v": ["x"]}), schema, safecheck=True, **settings
        )
    assert str(raised.value).startswith(
        "Exception thrown when converting pandas.Series (object) with name 'v' to Arrow Array"
        " (double). It can be caused by overflows"
    )
    schema = StructType([StructField("v", StringType())])
    with pytest.raises(PySparkTypeError, match=r"\(float64\) with name 'v' to Arrow Array"):
        pandas_fallback.to_arrow_batch(
            pd.DataFrame({"v": [1.5]}), schema, safecheck=False, **settings
        )
