"""The drop-in switch on ``groupBy(...).cogroup(other.groupBy(...))``'s ``applyInPandas``
and ``applyInArrow`` (Spark 4.0+): the same user code on plain Spark and with
``pyspark_shuffle.enable`` gives the same rows, through pyshuffle: with and without the key,
keys on one side only (the other side an empty frame of its own columns), null keys; and
Spark's error on wrong names (the facts from PySpark's test_pandas_cogrouped_map.py and
test_arrow_cogrouped_map.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql import functions as F  # noqa: N812 (Spark's own spelling)

from pyspark_shuffle.spark.compat import SPARK_VERSION
from tests.integration.dropin_runs import run_both

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from tests.integration.services import ShuffleService

Sides = tuple["DataFrame", "DataFrame"]
Rows = list[tuple[Any, ...]]

pytestmark = pytest.mark.usefixtures("switch_per_service")


@pytest.fixture(scope="module")
def sides(spark: SparkSession) -> Sides:
    """Left: keys 0 to 5 and null; right: keys 3 to 8 and null, other columns."""
    left = spark.range(0, 120, 1, 2).selectExpr(
        "case when id % 19 = 0 then null else id % 6 end as k", "cast(id as int) as v"
    )
    right = spark.range(0, 90, 1, 2).selectExpr(
        "case when id % 23 = 0 then null else id % 6 + 3 end as k",
        "id / 2 as w",
        "concat('r', id) as name",
    )
    return left, right


SIDES_SCHEMA = "k long, nl long, nr long, lcols string, rcols string, w_sum double"
KEY_SCHEMA = "key string, nl long, nr long"


def _pandas_sides(left: pd.DataFrame, right: pd.DataFrame) -> pd.DataFrame:
    first = left if len(left) else right
    return pd.DataFrame(
        {
            "k": first["k"][:1],
            "nl": [len(left)],
            "nr": [len(right)],
            "lcols": [",".join(left.columns)],
            "rcols": [",".join(right.columns)],
            "w_sum": [right["w"].sum()],
        }
    )


def _pandas_key(key: tuple[Any, ...], left: pd.DataFrame, right: pd.DataFrame) -> pd.DataFrame:
    text = ",".join(f"{type(part).__name__}:{part}" for part in key)
    return pd.DataFrame({"key": [text], "nl": [len(left)], "nr": [len(right)]})


def _pandas_wrong_names(left: pd.DataFrame, right: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"k": [1], "nl": [len(left)], "more": [len(right)]})


def _arrow_sides(left: pa.Table, right: pa.Table) -> pa.Table:
    first = left if left.num_rows else right
    return pa.table(
        {
            "k": first["k"][:1],
            "nl": pa.array([left.num_rows], pa.int64()),
            "nr": pa.array([right.num_rows], pa.int64()),
            "lcols": [",".join(left.column_names)],
            "rcols": [",".join(right.column_names)],
            "w_sum": pa.array([pc.sum(right["w"]).as_py() or 0.0], pa.float64()),
        }
    )


def _arrow_key(key: tuple[Any, ...], left: pa.Table, right: pa.Table) -> pa.Table:
    text = ",".join(f"{type(part).__name__}:{part.as_py()}" for part in key)
    return pa.table(
        {
            "key": [text],
            "nl": pa.array([left.num_rows], pa.int64()),
            "nr": pa.array([right.num_rows], pa.int64()),
        }
    )


def _arrow_wrong_names(left: pa.Table, right: pa.Table) -> pa.Table:
    return pa.table({"k": pa.array([1], pa.int64()), "nl": pa.array([0], pa.int64())})


def _one_side_empty(rows: Rows) -> bool:
    """A key on one side only: the other side an empty frame of its own columns."""
    seen = [(row[1][1], row[2][1], row[3][1], row[4][1]) for row in rows]
    left_only = [each for each in seen if each[1] == 0]
    right_only = [each for each in seen if each[0] == 0]
    return (
        len(left_only) == 3
        and len(right_only) == 3
        and {each[3] for each in left_only} == {"k,w,name"}
        and {each[2] for each in right_only} == {"k,v"}
    )


def _keys_of(*expected: str) -> Callable[[Rows], bool]:
    return lambda rows: set(expected) <= {row[0][1] for row in rows}


@dataclass(frozen=True)
class Case:
    api: str
    function: Callable[..., Any]
    schema: str
    error: str = ""
    """What Spark's error line says: the case's intent."""
    check: Callable[[Rows], bool] | None = None
    """What the function saw, as Spark's tests check it (on the rows through pyshuffle)."""


_ARROW = pytest.mark.skipif(SPARK_VERSION < (4, 0), reason="cogroup applyInArrow: Spark 4.0")
_WRONG = "RESULT_COLUMN_NAMES_MISMATCH"

CASES = [
    pytest.param(
        Case("applyInPandas", _pandas_sides, SIDES_SCHEMA, check=_one_side_empty),
        id="pandas-sides",
    ),
    pytest.param(
        Case(
            "applyInPandas",
            _pandas_key,
            KEY_SCHEMA,
            check=_keys_of("int64:1", "int64:7", "float64:nan"),  # left, right only; null
        ),
        id="pandas-key",
    ),
    pytest.param(
        Case("applyInPandas", _pandas_wrong_names, "k long, nl long, nr long", _WRONG),
        id="pandas-wrong-names",
    ),
    pytest.param(
        Case("applyInArrow", _arrow_sides, SIDES_SCHEMA, check=_one_side_empty),
        id="arrow-sides",
        marks=_ARROW,
    ),
    pytest.param(
        Case(
            "applyInArrow",
            _arrow_key,
            KEY_SCHEMA,
            check=_keys_of("Int64Scalar:1", "Int64Scalar:7", "Int64Scalar:None"),
        ),
        id="arrow-key",
        marks=_ARROW,
    ),
    pytest.param(
        Case("applyInArrow", _arrow_wrong_names, "k long, nl long, nr long", _WRONG),
        id="arrow-wrong-names",
        marks=_ARROW,
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_cogroup_through_pyshuffle_gives_sparks_result(
    spark: SparkSession, service: ShuffleService, sides: Sides, case: Case
) -> None:
    left, right = sides

    def cogroup() -> DataFrame:
        operations = left.groupBy("k").cogroup(right.groupBy("k"))
        made: DataFrame = getattr(operations, case.api)(case.function, case.schema)
        return made

    runs = run_both(spark, service, cogroup)
    runs.assert_same()
    assert [(call.api, call.path) for call in runs.calls] == [(f"cogroup.{case.api}", "pyshuffle")]
    if case.error:
        summary = runs.spark.error_summary
        assert summary is not None, runs.spark.rows
        assert case.error in summary[2]
        assert summary[3] == "action"
    else:
        assert runs.spark.rows
    if case.check is not None:  # what the function saw, as Spark's tests check it
        assert case.check(runs.switched.rows or []), runs.switched.rows


SEEN_SCHEMA = "key string, lcols string, rcols string, nl long, nr long"


def _pandas_seen(key: tuple[Any, ...], left: pd.DataFrame, right: pd.DataFrame) -> pd.DataFrame:
    """The key as the function got it and the columns each side was handed."""
    return pd.DataFrame(
        {
            "key": [",".join(f"{type(part).__name__}:{part}" for part in key)],
            "lcols": [",".join(left.columns)],
            "rcols": [",".join(right.columns)],
            "nl": [len(left)],
            "nr": [len(right)],
        }
    )


def _arrow_seen(key: tuple[Any, ...], left: pa.Table, right: pa.Table) -> pa.Table:
    return pa.table(
        {
            "key": [",".join(f"{type(part).__name__}:{part.as_py()}" for part in key)],
            "lcols": [",".join(left.column_names)],
            "rcols": [",".join(right.column_names)],
            "nl": pa.array([left.num_rows], pa.int64()),
            "nr": pa.array([right.num_rows], pa.int64()),
        }
    )


Groupings = Callable[["DataFrame", "DataFrame"], tuple[Any, Any]]

# Spark cogroups by position, whatever each side's keys are named or computed from.
SIDE_KEYS: dict[str, Groupings] = {
    "expressions": lambda left, right: (
        left.groupBy((left.k / 4).cast("int")),
        right.groupBy((F.col("k") / 4).cast("int")),
    ),
    "other-names": lambda left, right: (
        left.groupBy("k"),
        right.withColumnRenamed("k", "j").groupBy("j"),
    ),
    "name-and-expression": lambda left, right: (
        left.groupBy("k", (left.v % 2).alias("odd")),
        right.groupBy("k", (right.k % 2).cast("int")),
    ),
}


@pytest.mark.parametrize(
    "form",
    [
        pytest.param(("applyInPandas", _pandas_seen), id="pandas"),
        pytest.param(("applyInArrow", _arrow_seen), id="arrow", marks=_ARROW),
    ],
)
@pytest.mark.parametrize("keys", SIDE_KEYS.values(), ids=SIDE_KEYS.keys())
def test_sides_keyed_otherwise_cogroup_by_position_as_spark_does(
    spark: SparkSession,
    service: ShuffleService,
    sides: Sides,
    keys: Groupings,
    form: tuple[str, Callable[..., Any]],
) -> None:
    api, function = form

    def cogroup() -> DataFrame:
        left, right = keys(*sides)
        made: DataFrame = getattr(left.cogroup(right), api)(function, SEEN_SCHEMA)
        return made

    runs = run_both(spark, service, cogroup)
    runs.assert_same()
    assert [call.path for call in runs.calls] == ["pyshuffle"]
    rows = runs.switched.rows or []
    assert rows
    # each side handed its own columns, none that carries a key expression
    assert {row[1][1] for row in rows} == {"k,v"}
    assert {row[2][1] for row in rows} <= {"k,w,name", "j,w,name"}
