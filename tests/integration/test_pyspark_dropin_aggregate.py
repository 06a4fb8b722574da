"""The drop-in switch on ``groupBy(...).agg(...)`` of grouped-aggregate pandas UDFs (and Arrow
ones, 4.3 and later): the same user code on plain Spark and with ``pyspark_shuffle.enable``
gives the same rows and schema (names such as ``mean(v)``, aliases, several UDFs in one
``agg``, several arguments, an array result, values cast to the declared type, nulls,
``spark.sql.retainGroupColumns``), the same error for a value of the wrong type, and leaves to
Spark what it does not carry (the facts from PySpark's test_pandas_udf_grouped_agg.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql import functions as F  # noqa: N812 (Spark's own spelling)
from pyspark.sql.pandas.functions import pandas_udf
from pyspark.sql.types import ArrayType, DoubleType, LongType, StringType

from pyspark_shuffle.spark.internals import arrow_aggregates_supported
from tests.integration.dropin_runs import conf_set, run_both

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from tests.integration.services import ShuffleService

pytestmark = pytest.mark.usefixtures("switch_per_service")


@pytest.fixture(scope="module")
def events(spark: SparkSession) -> DataFrame:
    """Keys 0 to 6 and null; ``v`` with nulls, ``w`` weights, a second key ``k2``."""
    return spark.range(0, 300, 1, 3).selectExpr(
        "case when id % 17 = 0 then null else id % 7 end as k",
        "cast(id % 2 as int) as k2",
        "case when id % 5 = 0 then null else id / 4 end as v",
        "cast(id % 3 + 1 as double) as w",
    )


def _mean(values: pd.Series) -> float:
    return float(values.mean())


def _weighted(values: pd.Series, weights: pd.Series) -> float:
    present = values.notna()
    return float((values[present] * weights[present]).sum() / weights[present].sum())


def _count(values: pd.Series) -> int:  # an integer into a double column: cast
    return len(values)


def _bounds(values: pd.Series) -> list[float]:
    return [float(values.min()), float(values.max())]


def _first_label(values: pd.Series) -> str:  # the Series Spark hands over is indexed from 0
    return f"{values.index[0]}:{len(values)}"


def _text(values: pd.Series) -> str:  # text into a double column: Spark's conversion error
    return "many"


@dataclass(frozen=True)
class Case:
    keys: tuple[str, ...]
    columns: Callable[[DataFrame], list[Column]]
    settings: dict[str, str] = field(default_factory=dict)
    error: str = ""


def _udf(function: Callable[..., Any], return_type: Any) -> Any:
    return pandas_udf(function, return_type)  # type: ignore[call-overload]


CASES: dict[str, Case] = {
    "one": Case(("k",), lambda frame: [_udf(_mean, DoubleType())("v")]),
    "aliased-and-several": Case(
        ("k",),
        lambda frame: [
            _udf(_mean, DoubleType())(frame.v).alias("mean_v"),
            _udf(_count, DoubleType())(F.col("w")),
            _udf(_weighted, DoubleType())("v", "w").alias("weighted"),
        ],
    ),
    "array-and-string": Case(
        ("k", "k2"),
        lambda frame: [
            _udf(_bounds, ArrayType(DoubleType()))("w"),
            _udf(_first_label, StringType())("w"),
        ],
    ),
    "no-key-columns": Case(
        ("K",),  # by case, as Spark resolves it
        lambda frame: [_udf(_count, LongType())("v")],
        settings={"spark.sql.retainGroupColumns": "false"},
    ),
    "text-into-double": Case(
        ("k",), lambda frame: [_udf(_text, DoubleType())("v")], error="Failed to convert"
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_pandas_aggregates_through_pyshuffle_give_sparks_result(
    spark: SparkSession, service: ShuffleService, events: DataFrame, case: Case
) -> None:
    _carried_as_spark_runs_it(spark, service, events, case)


# -- Arrow aggregate UDFs (4.1+; carried where they run as on 4.3) ---------------------------

_ARROW_AGGREGATES = pytest.mark.skipif(
    not arrow_aggregates_supported(), reason="Arrow aggregate UDFs through pyshuffle: 4.3+"
)


def _arrow_udf(function: Callable[..., Any], return_type: Any) -> Any:
    from pyspark.sql.functions import arrow_udf  # type: ignore[attr-defined]  # noqa: PLC0415

    return arrow_udf(function, return_type)


def _arrow_mean(values: pa.Array) -> Any:
    return pc.mean(values)  # a pyarrow scalar, as Arrow code returns


def _arrow_weighted(values: pa.Array, weights: pa.Array) -> float:
    present = pc.is_valid(values)
    kept, by = pc.filter(values, present), pc.filter(weights, present)
    return float(pc.sum(pc.multiply(kept, by)).as_py() / pc.sum(by).as_py())


def _arrow_count(values: pa.Array) -> int:  # an integer into a double column: cast
    return len(values)


def _arrow_text(values: pa.Array) -> str:  # text into a double column: Spark's error class
    return "many"


ARROW_CASES: dict[str, Case] = {
    "arrow-one": Case(("k",), lambda frame: [_arrow_udf(_arrow_mean, DoubleType())("v")]),
    "arrow-several-aliased": Case(
        ("k", "k2"),
        lambda frame: [
            _arrow_udf(_arrow_count, DoubleType())("w").alias("n"),
            _arrow_udf(_arrow_weighted, DoubleType())(frame.v, "w"),
        ],
    ),
    "arrow-text-into-double": Case(
        ("k",),
        lambda frame: [_arrow_udf(_arrow_text, DoubleType())("v")],
        error="RESULT_COLUMN_TYPES_MISMATCH",
    ),
}


@_ARROW_AGGREGATES
@pytest.mark.parametrize("case", ARROW_CASES.values(), ids=ARROW_CASES.keys())
def test_arrow_aggregates_through_pyshuffle_give_sparks_result(
    spark: SparkSession, service: ShuffleService, events: DataFrame, case: Case
) -> None:
    _carried_as_spark_runs_it(spark, service, events, case)


@_ARROW_AGGREGATES
def test_pandas_and_arrow_aggregates_in_one_agg_are_sparks(
    spark: SparkSession, service: ShuffleService, events: DataFrame
) -> None:
    def both() -> DataFrame:
        return events.groupBy("k").agg(
            _udf(_mean, DoubleType())("v"), _arrow_udf(_arrow_mean, DoubleType())("w")
        )

    runs = run_both(spark, service, both)
    runs.assert_same()
    assert runs.paths() == ["spark"]


def _carried_as_spark_runs_it(
    spark: SparkSession, service: ShuffleService, events: DataFrame, case: Case
) -> None:
    with conf_set(spark, case.settings):
        runs = run_both(
            spark, service, lambda: events.groupBy(*case.keys).agg(*case.columns(events))
        )
    runs.assert_same()
    assert runs.paths() == ["pyshuffle"]
    if case.error:
        summary = runs.spark.error_summary
        assert summary is not None and case.error in summary[2], runs.spark
        assert summary[3] == "action"
    else:
        assert runs.spark.rows


LEFT_TO_SPARK: dict[str, Callable[[DataFrame], DataFrame]] = {
    "with-a-built-in": lambda frame: frame.groupBy("k").agg(
        _udf(_mean, DoubleType())("v"), F.sum("w")
    ),
    "keyword-argument": lambda frame: frame.groupBy("k").agg(
        _udf(_weighted, DoubleType())(values=frame.v, weights=frame.w)
    ),
    "no-keys": lambda frame: frame.groupBy().agg(_udf(_mean, DoubleType())("v")),
    "expression-argument": lambda frame: frame.groupBy("k").agg(
        _udf(_mean, DoubleType())(frame.v * 2)
    ),
    "expression-key": lambda frame: frame.groupBy(frame.k % 2).agg(_udf(_mean, DoubleType())("v")),
}


@pytest.mark.parametrize("case", sorted(LEFT_TO_SPARK))
def test_what_the_switch_does_not_carry_is_sparks_own(
    spark: SparkSession, service: ShuffleService, events: DataFrame, case: str
) -> None:
    runs = run_both(spark, service, lambda: LEFT_TO_SPARK[case](events))
    runs.assert_same()  # rows, or Spark's own error (a built-in beside a pandas UDF)
    assert runs.paths() == ["spark"]
    assert runs.calls[0].api == "agg" and runs.calls[0].reason


def test_an_agg_without_pandas_udfs_is_not_a_call_for_the_switch(
    spark: SparkSession, service: ShuffleService, events: DataFrame
) -> None:
    def built_ins() -> DataFrame:
        return events.groupBy("k").agg(F.sum("v"), (_udf(_mean, DoubleType())("v") + 1))

    runs = run_both(spark, service, built_ins)
    runs.assert_same()
    assert runs.calls == ()
