"""The drop-in switch on ``groupBy(...).applyInArrow`` (Spark 4.0+): the same user code on
plain Spark and with ``pyspark_shuffle.enable`` gives the same rows, through pyshuffle, and
Spark's errors where Spark checks the result (types exactly, names, the return type; the facts
from PySpark's test_arrow_grouped_map.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from pyspark_shuffle.spark.compat import SPARK_VERSION
from tests.integration.dropin_runs import run_both

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from tests.integration.services import ShuffleService

pytestmark = [
    pytest.mark.skipif(SPARK_VERSION < (4, 0), reason="applyInArrow: Spark 4.0"),
    pytest.mark.usefixtures("switch_per_service"),
]


@pytest.fixture(scope="module")
def events(spark: SparkSession) -> DataFrame:
    """k: five keys and a null one; v, x, s: an int, a double and a string with nulls; day,
    dec, arr, st: a date, a decimal, an array and a struct."""
    return spark.range(0, 200, 1, 2).selectExpr(
        "case when id % 17 = 0 then null else id % 5 end as k",
        "case when id % 7 = 0 then null else cast(id % 11 as int) end as v",
        "case when id % 13 = 0 then null else id / 2 end as x",
        "case when id % 3 = 0 then null else concat('s', id % 9) end as s",
        "date_add(date'2024-02-27', cast(id % 5 as int)) as day",
        "cast(id * 0.25 as decimal(10, 2)) as dec",
        "array(cast(id % 3 as int), cast(id % 4 as int)) as arr",
        "named_struct('a', nullif(id, -1), 'b', concat('b', id % 4)) as st",
    )


EVERY_TYPE = (
    "k long, v int, x double, s string, day date, dec decimal(10, 2), arr array<int>,"
    " st struct<a: long, b: string>"
)


def _every_type(table: pa.Table) -> pa.Table:
    """The group's rows back, ``x`` doubled."""
    return table.set_column(2, "x", pc.multiply(table["x"], 2.0))


KEY_SCHEMA = "key string, rows long, v_sum long"


def _key_text(key: tuple[Any, ...], table: pa.Table) -> pa.Table:
    """The key as the function got it: each part's type and value."""
    text = ",".join(f"{type(part).__name__}:{part.as_py()}" for part in key)
    return pa.table(
        {
            "key": [text],
            "rows": pa.array([table.num_rows], pa.int64()),
            "v_sum": pa.array([pc.sum(table["v"]).as_py()], pa.int64()),
        }
    )


def _reordered(table: pa.Table) -> pa.Table:
    """The schema's columns in another order: taken by name."""
    return table.select(["s", "x", "k"])


def _some_empty(table: pa.Table) -> pa.Table:
    """No columns and no rows for odd and null keys, the rows of the others."""
    key = table["k"][0].as_py()
    if key is None or key % 2:
        return pa.table([])
    return table.select(["k", "v"])


def _narrower(table: pa.Table) -> pa.Table:
    """``k`` as int32 where the schema says bigint: Arrow results are not cast."""
    return table.select(["k"]).set_column(0, "k", table["k"].cast(pa.int32()))


def _not_a_table(table: pa.Table) -> Any:
    return (table.num_rows,)


Rows = list[tuple[Any, ...]]


def _keys_are_scalars(rows: Rows) -> bool:
    return {"Int64Scalar:3", "Int64Scalar:None"} <= {row[0][1] for row in rows}


@dataclass(frozen=True)
class Case:
    function: Callable[..., Any]
    schema: str
    error: str = ""
    """What Spark's error line says: the case's intent."""
    check: Callable[[Rows], bool] | None = None
    """What the function saw, as Spark's tests check it (on the rows through pyshuffle)."""


CASES = {
    "every-type": Case(_every_type, EVERY_TYPE),
    "key": Case(_key_text, KEY_SCHEMA, check=_keys_are_scalars),
    "reordered-by-name": Case(_reordered, "k long, x double, s string"),
    "empty-results": Case(_some_empty, "k long, v int"),
    "int32-for-bigint": Case(_narrower, "k long", "RESULT_COLUMN_TYPES_MISMATCH"),
    "not-a-table": Case(_not_a_table, "k long", "UDF_RETURN_TYPE"),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_apply_in_arrow_through_pyshuffle_gives_sparks_result(
    spark: SparkSession, service: ShuffleService, events: DataFrame, case: Case
) -> None:
    runs = run_both(
        spark, service, lambda: events.groupBy("k").applyInArrow(case.function, case.schema)
    )
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
