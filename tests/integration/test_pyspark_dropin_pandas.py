"""The drop-in switch on ``groupBy(...).applyInPandas``: the same user code run on plain
Spark and with ``pyspark_shuffle.enable`` gives the same rows of the same types (every type
PySpark's own tests round-trip, nulls in keys and values, timestamps in a session time zone
across a DST switch), through pyshuffle, and fails as Spark fails, with Spark's error class
and message, at the same point (the facts from PySpark's test_pandas_grouped_map.py)."""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd
import pytest
from pyspark.sql import functions as F  # noqa: N812 (Spark's own spelling)

from tests.integration.dropin_runs import Runs, conf_set, run_both

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from tests.integration.services import ShuffleService

ZONE = "America/Los_Angeles"
BY_NAME = "spark.sql.legacy.execution.pandas.groupedMap.assignColumnsByName"

pytestmark = pytest.mark.usefixtures("switch_per_service")


@pytest.fixture(scope="module")
def events(spark: SparkSession) -> Iterator[DataFrame]:
    """240 rows, the session in Los Angeles time while the module runs (put back after: the
    session is shared). k: six keys and a null one; k2: an int key; v, x, s: an int, a double
    and a string with nulls; t: every 150 s from 01:00 PST on the day DST starts, one row at
    the switch itself (02:00 PST, 10:00 UTC); day: dates about a leap day; dec, arr, st: a
    decimal, an array and a struct."""
    key = "spark.sql.session.timeZone"
    before = spark.conf.get(key)
    spark.conf.set(key, ZONE)
    frame = spark.range(0, 240, 1, 2).selectExpr(
        "case when id % 23 = 0 then null else id % 6 end as k",
        "cast(id % 3 as int) as k2",
        "case when id % 7 = 0 then null else cast(id % 11 as int) end as v",
        "case when id % 13 = 0 then null else id / 2 end as x",
        "case when id % 5 = 0 then null else concat('s', id % 9) end as s",
        "timestamp_seconds(1710061200 + id * 150) as t",
        "date_add(date'2024-02-27', cast(id % 5 as int)) as day",
        "cast(id * 0.25 as decimal(10, 2)) as dec",
        "array(cast(id % 3 as int), cast(id % 4 as int)) as arr",
        "named_struct('a', nullif(id, -1), 'b', concat('b', id % 4)) as st",
    )
    yield frame
    spark.conf.set(key, str(before))


EVERY_TYPE = (
    "k long, k2 int, v int, x double, s string, t timestamp, day date, dec decimal(10, 2),"
    " arr array<int>, st struct<a: long, b: string>"
)


def _every_type(pdf: pd.DataFrame) -> pd.DataFrame:
    """Each column back, the timestamps a day on (naive local times: not into the hour DST
    skips, which Spark refuses) and the structs remade from the dicts they come as."""
    out = pdf.copy()
    out["t"] = pdf["t"] + pd.Timedelta(days=1)
    out["st"] = [{"a": each["a"] * 2, "b": type(each).__name__} for each in pdf["st"]]
    return out


KEY_SCHEMA = "key string, rows long, v_sum double"


def _key_text(key: tuple[Any, ...], pdf: pd.DataFrame) -> pd.DataFrame:
    """The key as the function got it: each part's type and value."""
    text = ",".join(f"{type(part).__name__}:{part}" for part in key)
    return pd.DataFrame({"key": [text], "rows": [len(pdf)], "v_sum": [pdf["v"].sum()]})


SEEN_SCHEMA = "key string, columns string, rows long"


def _key_and_columns(key: tuple[Any, ...], pdf: pd.DataFrame) -> pd.DataFrame:
    """The key as the function got it, and the columns it was handed."""
    text = ",".join(f"{type(part).__name__}:{part}" for part in key)
    return pd.DataFrame({"key": [text], "columns": [",".join(pdf.columns)], "rows": [len(pdf)]})


def _some_empty(pdf: pd.DataFrame) -> pd.DataFrame:
    """No rows and no columns for odd and null keys, a group filtered to nothing (its
    columns kept) for key 2, the rows of the others."""
    key = pdf["k"].iloc[0]
    if pd.isna(key) or key % 2:
        return pd.DataFrame()
    if key == 2:
        return pdf[pdf["v"] > 1000][["k", "v"]]
    return pdf[["k", "v"]]


def _reordered(pdf: pd.DataFrame) -> pd.DataFrame:
    strings = pdf["s"].dropna()
    return pd.DataFrame(
        {
            "x_sum": [pdf["x"].sum()],
            "s_max": [strings.max() if len(strings) else None],
            "k": pdf["k"][:1],
        }
    )


def _unlabelled(pdf: pd.DataFrame) -> pd.DataFrame:
    """Columns 0 and 1 (no string labels): taken by position."""
    return pd.DataFrame([[pdf["k"].iloc[0], len(pdf)]])


def _misnamed(pdf: pd.DataFrame) -> pd.DataFrame:
    """Names not in the schema, in the schema's order of types: by position when the
    legacy setting says so."""
    return pd.DataFrame({"rows": [len(pdf)], "key": pdf["k"][:1]})


def _counts(pdf: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"k": pdf["k"][:1], "rows": [len(pdf)]})


def _wrong_names(pdf: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"k": pdf["k"][:1], "mean": [1.0], "std": [0.5]})


def _three_unlabelled(pdf: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame([[1, 2, 3]])


def _text_for_double(pdf: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"k": pdf["k"][:1], "x": ["not a number"]})


def _fails_on_three(pdf: pd.DataFrame) -> pd.DataFrame:
    if pdf["k"].iloc[0] == 3:
        raise ValueError("the user's own error on key 3")
    return _counts(pdf)


def _not_a_frame(pdf: pd.DataFrame) -> Any:
    return (len(pdf),)


Keys = Callable[["DataFrame"], list[Any]]
Rows = list[tuple[Any, ...]]


def _numpy_keys(rows: Rows) -> bool:
    """Numpy scalars of the key columns' types; NaN for a null long key."""
    return {"int64:4,int32:1", "float64:nan,int32:2"} <= {row[0][1] for row in rows}


def _dict_structs(rows: Rows) -> bool:
    return len(rows) == 240 and {row[9][2] for row in rows} == {("str", "dict")}


def _frame_columns_only(rows: Rows) -> bool:
    """Every group handed the frame's own columns: none that carries a key expression."""
    return {row[1][1] for row in rows} == {"k,k2,v,x,s,t,day,dec,arr,st"}


def _names(*names: str) -> Keys:
    return lambda frame: list(names)


@dataclass(frozen=True)
class Case:
    keys: Keys
    function: Callable[..., Any]
    schema: str
    settings: dict[str, str] = field(default_factory=dict)
    error: str = ""
    """What Spark's error line says (its class, or the user's error): the case's intent."""
    check: Callable[[Rows], bool] | None = None
    """What the function saw, as Spark's tests check it (on the rows through pyshuffle)."""


CASES = {
    "every-type": Case(_names("k"), _every_type, EVERY_TYPE, check=_dict_structs),
    "key": Case(_names("k"), _key_text, KEY_SCHEMA),
    "two-keys": Case(_names("k", "k2"), _key_text, KEY_SCHEMA, check=_numpy_keys),
    "key-in-another-case": Case(_names("K"), _key_text, KEY_SCHEMA),
    "key-as-frame-column": Case(lambda frame: [frame.k], _key_text, KEY_SCHEMA),
    "key-as-col": Case(lambda frame: [F.col("k")], _key_text, KEY_SCHEMA),
    "key-expression": Case(
        lambda frame: [(frame.k % 4).cast("int")],
        _key_and_columns,
        SEEN_SCHEMA,
        check=_frame_columns_only,
    ),
    "name-and-expression": Case(
        lambda frame: ["k2", F.expr("upper(s)")], _key_and_columns, SEEN_SCHEMA
    ),
    "nested-field-key": Case(_names("st.b"), _key_and_columns, SEEN_SCHEMA),
    "empty-results": Case(_names("k"), _some_empty, "k long, v int"),
    "reordered-by-name": Case(_names("k"), _reordered, "k long, s_max string, x_sum double"),
    "unlabelled-by-position": Case(_names("k"), _unlabelled, "k long, rows long"),
    "names-ignored-by-setting": Case(
        _names("k"), _misnamed, "n long, k long", settings={BY_NAME: "false"}
    ),
    "int-into-double": Case(_names("k"), _counts, "k long, rows double"),
    "wrong-names": Case(
        _names("k"), _wrong_names, "k long, v double", error="RESULT_COLUMN_NAMES_MISMATCH"
    ),
    "wrong-count-by-position": Case(
        _names("k"), _three_unlabelled, "k long, v double", error="RESULT_COLUMN_SCHEMA_MISMATCH"
    ),
    "text-into-double": Case(
        _names("k"), _text_for_double, "k long, x double", error="Failed to convert"
    ),
    "users-error": Case(
        _names("k"), _fails_on_three, "k long, rows long", error="the user's own error"
    ),
    "not-a-frame": Case(_names("k"), _not_a_frame, "k long", error="UDF_RETURN_TYPE"),
}


def _apply(events: DataFrame, case: Case) -> Callable[[], DataFrame]:
    return lambda: events.groupBy(*case.keys(events)).applyInPandas(case.function, case.schema)


def _both(spark: SparkSession, service: ShuffleService, events: DataFrame, case: Case) -> Runs:
    with conf_set(spark, case.settings):
        return run_both(spark, service, _apply(events, case))


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_apply_in_pandas_through_pyshuffle_gives_sparks_result(
    spark: SparkSession, service: ShuffleService, events: DataFrame, case: Case
) -> None:
    runs = _both(spark, service, events, case)
    runs.assert_same()
    assert runs.paths() == ["pyshuffle"]
    if case.error:
        summary = runs.spark.error_summary
        assert summary is not None, runs.spark.rows
        assert case.error in summary[2]
        assert summary[3] == "action"
    else:
        assert runs.spark.rows
    if case.check is not None:
        assert case.check(runs.switched.rows or []), runs.switched.rows


def test_a_chain_of_apply_in_pandas_gives_sparks_result(
    spark: SparkSession, service: ShuffleService, events: DataFrame
) -> None:
    def chain() -> DataFrame:
        first = events.groupBy("k").applyInPandas(_every_type, EVERY_TYPE)
        return first.groupBy("k2").applyInPandas(_reordered_by_k2, "k2 int, rows long")

    runs = run_both(spark, service, chain)
    runs.assert_same()
    assert runs.paths() == ["pyshuffle", "pyshuffle"]
    assert runs.spark.rows


def _date_for_decimal(pdf: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame([(1, datetime.date(2020, 10, 5))])


def test_a_failed_conversion_tells_its_cause_as_sparks_does(
    spark: SparkSession, service: ShuffleService, events: DataFrame
) -> None:
    """Spark's error for a result it cannot convert carries Arrow's own complaint (its
    test_column_order matches "[Dd]ecimal.*got.*date"), not only PySpark's message."""
    case = Case(
        _names("k"),
        _date_for_decimal,
        "id long, v decimal",
        settings={"spark.sql.execution.pandas.convertToArrowArraySafely": "false"},
    )
    runs = _both(spark, service, events, case)
    runs.assert_same()
    assert runs.paths() == ["pyshuffle"]
    for outcome in (runs.spark, runs.switched):
        assert re.search("[Dd]ecimal.*got.*date", str(outcome.error)), outcome.error


def _reordered_by_k2(pdf: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"rows": [len(pdf)], "k2": pdf["k2"][:1]})
