"""``SparkShuffle.group_apply`` of a pandas function returns what Spark's own
``groupBy(keys).applyInPandas`` returns on the same data and function (with and without the
key, timestamps in a session time zone that is not UTC and crosses a DST switch, nulls in
keys and values, empty results), and fails as it does on a wrong result.

On the default service only: what differs is in the reduce tasks, the same for every
service."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
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

ROWS = 3000
ZONE = "America/Los_Angeles"


@pytest.fixture(scope="module")
def in_zone(spark: SparkSession) -> Iterator[None]:
    """The session in Los Angeles time while the module runs (put back after: the session is
    shared)."""
    key = "spark.sql.session.timeZone"
    before = spark.conf.get(key)
    spark.conf.set(key, ZONE)
    yield
    spark.conf.set(key, str(before))


@pytest.fixture(scope="module")
def events(spark: SparkSession, in_zone: None) -> DataFrame:
    """k: 37 keys and a null one; n: an int with nulls; s: strings with nulls; t: every ten
    minutes across the switch to DST in Los Angeles (2024-03-10); d: decimals; day: dates."""
    frame: DataFrame = spark.range(0, ROWS, 1, 3).selectExpr(
        "case when id % 50 = 0 then null else id % 37 end as k",
        "case when id % 7 = 0 then null else cast(id % 11 as int) end as n",
        "case when id % 5 = 0 then null else concat('s', id % 13) end as s",
        "timestamp_seconds(1710000000 + id * 600) as t",
        "cast((id % 29) * 0.25 as decimal(10, 2)) as d",
        "date_add(date'2024-01-01', cast(id % 40 as int)) as day",
    )
    return frame.cache()


SUMMARY = (
    "k long, rows long, n_sum double, s_max string, t_min timestamp, t_max timestamp,"
    " d_sum decimal(12, 2), first_day date"
)


def _summary(pdf: pd.DataFrame) -> pd.DataFrame:
    """One row per group, its columns in another order than the schema's (taken by name)."""
    strings = pdf["s"].dropna()
    return pd.DataFrame(
        {
            "t_max": [pdf["t"].max()],
            "t_min": [pdf["t"].min()],
            "rows": [len(pdf)],
            "k": [pdf["k"].iloc[0]],
            "n_sum": [pdf["n"].sum()],
            "s_max": [strings.max() if len(strings) else None],
            "d_sum": [sum(pdf["d"])],
            "first_day": [min(pdf["day"])],
        }
    )


ROWS_SCHEMA = "k long, key_text string, n int, t timestamp"


def _rows_with_key(key: tuple[Any, ...], pdf: pd.DataFrame) -> pd.DataFrame:
    """Every row with the key as the function got it, and its timestamp as it came."""
    return pd.DataFrame(
        {
            "k": pdf["k"],
            "key_text": f"{type(key[0]).__name__}:{key[0]}",
            "n": pdf["n"],
            "t": pdf["t"],
        }
    )


def _only_even_keys(pdf: pd.DataFrame) -> pd.DataFrame:
    key = pdf["k"].iloc[0]
    if pd.isna(key) or key % 2:
        return pd.DataFrame()  # no rows and no columns: no rows, whatever the schema
    return pdf[["k", "t"]]


@pytest.mark.parametrize(
    ("function", "schema"),
    [(_summary, SUMMARY), (_rows_with_key, ROWS_SCHEMA), (_only_even_keys, "k long, t timestamp")],
    ids=["summary", "key-and-rows", "empty-results"],
)
def test_a_pandas_function_gives_what_apply_in_pandas_gives(
    shuffle: SparkShuffle,
    events: DataFrame,
    function: Callable[..., pd.DataFrame],
    schema: str,
) -> None:
    result = shuffle.group_apply(events, "k", pandas_function(function), schema)
    expected = events.groupBy("k").applyInPandas(function, schema)
    got = multiset(result)
    assert got == multiset(expected)
    assert sum(got.values()) > 0


def test_the_key_and_timestamps_are_as_spark_hands_them(
    shuffle: SparkShuffle, events: DataFrame
) -> None:
    rows = shuffle.group_apply(events, "k", pandas_function(_rows_with_key), ROWS_SCHEMA)
    texts = {row["key_text"] for row in rows.select("key_text").collect()}
    assert "int64:5" in texts
    assert "float64:nan" in texts  # the null key's column held floats
    summary = shuffle.group_apply(events, "k", pandas_function(_summary), SUMMARY)
    # Read back as Spark shows them: wall times in the session's zone.
    earliest = summary.selectExpr("cast(min(t_min) as string) as t").first()
    assert earliest is not None
    assert earliest["t"] == "2024-03-09 08:00:00"  # 1710000000 is 16:00 UTC, PST then


def _wrong_names(pdf: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"k": pdf["k"], "w": 1.0})


def _error_line(error: PythonException) -> str:
    """The line of the worker's traceback that says what went wrong: ``[CLASS] message``."""
    found = re.search(r"\[RESULT_COLUMN[A-Z_]*\][^\n]*", str(error))
    assert found, str(error)
    return found[0].strip()


def test_wrong_column_names_fail_with_sparks_error(
    shuffle: SparkShuffle, events: DataFrame
) -> None:
    schema = "k long, v double"
    with pytest.raises(PythonException) as spark_error:
        events.groupBy("k").applyInPandas(_wrong_names, schema).collect()
    with pytest.raises(PythonException) as our_error:
        shuffle.group_apply(events, "k", pandas_function(_wrong_names), schema).collect()
    line = _error_line(spark_error.value)
    assert line.endswith("do not match specified schema. Missing: v. Unexpected: w.")
    assert _error_line(our_error.value) == line
