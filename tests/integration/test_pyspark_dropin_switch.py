"""The drop-in switch's decisions and lifecycle: the calls it leaves to Spark give Spark's own
result (path ``"spark"``, with a reason); the calls Spark refuses fail with Spark's error at
the call, switch on or off; ``enable`` / ``disable`` and the context manager put the session's
methods back as they were and leave results made while enabled readable."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pandas as pd
import pytest

import pyspark_shuffle
from pyspark_shuffle.driver import dropin
from pyspark_shuffle.spark.compat import SPARK_VERSION
from pyspark_shuffle.spark.link import is_connect
from shuffle_api import ConfigError
from tests.integration.dropin_runs import (
    closed_switch,
    conf_set,
    outcome_of,
    run_both,
    switch_config,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from tests.integration.services import ShuffleService

SUMMARY = "k long, rows long, v_sum double"

pytestmark = pytest.mark.usefixtures("switch_per_service")


@pytest.fixture(scope="module")
def events(spark: SparkSession) -> DataFrame:
    """k: four keys and a null one; k2: an int; v: an int with nulls."""
    return spark.range(0, 120, 1, 2).selectExpr(
        "case when id % 13 = 0 then null else id % 4 end as k",
        "cast(id % 3 as int) as k2",
        "case when id % 7 = 0 then null else cast(id % 11 as int) end as v",
    )


def _summary(pdf: pd.DataFrame) -> pd.DataFrame:
    """One row per group whatever groups it (the smallest key: the same on every run)."""
    return pd.DataFrame({"k": [pdf["k"].min()], "rows": [len(pdf)], "v_sum": [pdf["v"].sum()]})


def _summaries(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """Spark's iterator form (told by the type hints, 4.1+): a summary per batch."""
    for pdf in batches:
        yield _summary(pdf)


_ITERATOR = pytest.mark.skipif(
    SPARK_VERSION < (4, 1), reason="applyInPandas's iterator form: Spark 4.1"
)

FALLBACKS: dict[str, Callable[[DataFrame], DataFrame]] = {
    "rollup": lambda frame: frame.rollup("k").applyInPandas(_summary, SUMMARY),
    "pivot": lambda frame: frame.groupBy("k").pivot("k2").applyInPandas(_summary, SUMMARY),
    "no-keys": lambda frame: frame.groupBy().applyInPandas(_summary, SUMMARY),
    "iterator-form": lambda frame: frame.groupBy("k").applyInPandas(_summaries, SUMMARY),
}


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(make, id=name, marks=_ITERATOR if name == "iterator-form" else ())
        for name, make in FALLBACKS.items()
    ],
)
def test_calls_the_switch_cannot_carry_give_sparks_own_result(
    spark: SparkSession,
    service: ShuffleService,
    events: DataFrame,
    make: Callable[[DataFrame], DataFrame],
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger=dropin.__name__):
        runs = run_both(spark, service, lambda: make(events))
    runs.assert_same()
    assert runs.spark.rows
    assert runs.paths() == ["spark"]
    assert runs.calls[0].reason
    # ... and said at INFO, with its reason
    said = [record.getMessage() for record in caplog.records if record.name == dropin.__name__]
    assert f"{runs.calls[0].api} through spark: {runs.calls[0].reason}" in said


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("spark.sql.execution.arrow.useLargeVarTypes", "true"),
    ],
)
def test_a_setting_the_switch_leaves_to_spark_gives_sparks_result(
    spark: SparkSession, service: ShuffleService, events: DataFrame, key: str, value: str
) -> None:
    with conf_set(spark, {key: value}):
        runs = run_both(
            spark, service, lambda: events.groupBy("k").applyInPandas(_summary, SUMMARY)
        )
    runs.assert_same()
    assert runs.spark.rows
    assert runs.paths() == ["spark"]
    assert key in runs.calls[0].reason


def _with_empty_columns(pdf: pd.DataFrame) -> pd.DataFrame:
    """A column of nulls and one of empty strings: buffers of no bytes."""
    return pd.DataFrame(
        {"k": [pdf["k"].min()], "rows": [len(pdf)], "nothing": [None], "blank": [""]}
    )


def test_a_call_under_the_lz4_arrow_codec_is_carried(
    spark: SparkSession, service: ShuffleService, events: DataFrame
) -> None:
    """PySpark cannot read an LZ4-compressed batch from the JVM with an empty buffer (a column
    of nulls): pyshuffle's stage frames have none, so such calls run through it."""
    with conf_set(spark, {"spark.sql.execution.arrow.compression.codec": "lz4"}):
        runs = run_both(
            spark,
            service,
            lambda: (
                events.groupBy("k")
                .applyInPandas(
                    _with_empty_columns, "k long, rows long, nothing string, blank string"
                )
                # A Connect client reads its results under the same codec: they must hold no empty
                # buffer either, or Spark's own run fails before the comparison.
                .selectExpr("k", "rows", "nothing is null as no_value", "blank || '.' as blank")
            ),
        )
    runs.assert_same()
    assert runs.spark.rows
    assert runs.paths() == ["pyshuffle"]


def test_a_group_by_made_before_enable(
    spark: SparkSession, service: ShuffleService, events: DataFrame
) -> None:
    """A classic ``GroupedData`` keeps its keys in the JVM: one made before the switch was on
    is left to Spark. A Connect client's keeps them in Python: it is carried."""
    grouped = events.groupBy("k")
    runs = run_both(spark, service, lambda: grouped.applyInPandas(_summary, SUMMARY))
    runs.assert_same()
    assert runs.spark.rows
    assert runs.paths() == (["pyshuffle"] if is_connect(spark) else ["spark"])


# -- calls Spark refuses ------------------------------------------------------------------


def _one(a: Any) -> Any:
    return a


def _three(a: Any, b: Any, c: Any) -> Any:
    return a


def _four(a: Any, b: Any, c: Any, d: Any) -> Any:
    return a


_ARROW = pytest.mark.skipif(SPARK_VERSION < (4, 0), reason="applyInArrow: Spark 4.0")
APIS = [
    pytest.param("applyInPandas", id="pandas"),
    pytest.param("applyInArrow", id="arrow", marks=_ARROW),
    pytest.param("cogroup.applyInPandas", id="cogroup-pandas"),
    pytest.param("cogroup.applyInArrow", id="cogroup-arrow", marks=_ARROW),
]
REFUSED = {
    "wrong-arity": ("", "k long"),  # the function by the API: see _call
    "not-a-struct": (_one, "long"),
    "bad-ddl": (_one, "k long,, v"),
}


def _call(frame: DataFrame, api: str, function: Callable[..., Any] | str, schema: str) -> Any:
    cogroup = api.startswith("cogroup.")
    if function == "":  # one more parameter than the API takes with the key
        function = _four if cogroup else _three
    grouped: Any = frame.groupBy("k")
    if cogroup:
        grouped = grouped.cogroup(frame.groupBy("k"))
    return getattr(grouped, api.removeprefix("cogroup."))(function, schema)


@pytest.mark.parametrize("refused", REFUSED.values(), ids=REFUSED.keys())
@pytest.mark.parametrize("api", APIS)
def test_calls_spark_refuses_fail_at_the_call_with_sparks_error(
    spark: SparkSession,
    service: ShuffleService,
    events: DataFrame,
    api: str,
    refused: tuple[Callable[..., Any] | str, str],
) -> None:
    function, schema = refused
    runs = run_both(spark, service, lambda: _call(events, api, function, schema))
    runs.assert_same()
    assert runs.spark.raised_at == "call"


# -- lifecycle ------------------------------------------------------------------------------


def _apply(events: DataFrame) -> DataFrame:
    return events.groupBy("k").applyInPandas(_summary, SUMMARY)


def test_enabling_an_enabled_session_gives_its_switch(
    spark: SparkSession, service: ShuffleService
) -> None:
    with pyspark_shuffle.enable(spark, config=switch_config(service)) as switch:
        assert pyspark_shuffle.enable(spark, config=switch_config(service)) is switch


def test_enabling_with_another_configuration_is_refused(
    spark: SparkSession, service: ShuffleService
) -> None:
    with pyspark_shuffle.enable(spark, config=switch_config(service)) as switch:
        other = {**switch_config(service), "pyspark-shuffle.map.target-size": "3m"}
        with pytest.raises(ConfigError, match="another configuration"):
            pyspark_shuffle.enable(spark, config=other)
        assert pyspark_shuffle.enable(spark) is switch  # no configuration: the one made


def test_after_disable_calls_go_to_spark_and_routed_results_still_read(
    spark: SparkSession, service: ShuffleService, events: DataFrame
) -> None:
    grouped_type = type(events.groupBy("k"))
    original = grouped_type.applyInPandas
    switch = pyspark_shuffle.enable(spark, config=switch_config(service))
    try:
        routed = _apply(events)
        assert switch.calls[-1].path == "pyshuffle"
        assert grouped_type.applyInPandas is not original
    finally:
        pyspark_shuffle.disable(spark)
    decided = len(switch.calls)
    after = outcome_of(lambda: _apply(events))
    assert len(switch.calls) == decided
    assert grouped_type.applyInPandas is original
    assert outcome_of(lambda: routed).comparable() == after.comparable()
    assert after.rows


def test_the_context_manager_disables_on_exit(
    spark: SparkSession, service: ShuffleService, events: DataFrame
) -> None:
    original = type(events.groupBy("k")).applyInPandas
    with pyspark_shuffle.enable(spark, config=switch_config(service)) as switch:
        pass
    _apply(events)
    assert not switch.routing
    assert type(events.groupBy("k")).applyInPandas is original
    decided = len(switch.calls)
    _apply(events)
    assert len(switch.calls) == decided


def test_a_session_not_enabled_is_left_alone(
    spark: SparkSession, service: ShuffleService, events: DataFrame
) -> None:
    if is_connect(spark):
        pytest.skip("a second session of a Connect client is a second server session")
    other = spark.newSession()
    frame = other.range(0, 120, 1, 2).selectExpr("id % 4 as k", "cast(id % 11 as int) as v")
    expected = outcome_of(lambda: _apply(frame))
    with pyspark_shuffle.enable(spark, config=switch_config(service)) as switch:
        decided = len(switch.calls)
        got = outcome_of(lambda: _apply(frame))
        assert len(switch.calls) == decided
        _apply(events)  # the enabled session's own call is carried meanwhile
        assert switch.calls[-1].path == "pyshuffle"
    assert got.comparable() == expected.comparable()
    assert got.rows


def test_a_small_input_is_left_to_spark_by_default(
    spark: SparkSession, service: ShuffleService, events: DataFrame
) -> None:
    """Under ``pyspark-shuffle.dropin.min-input-size`` (by Spark's estimate) a call costs
    Spark less than pyshuffle's two stages: Spark's own result, and the reason said."""
    expected = outcome_of(lambda: _apply(events))
    closed_switch(spark)  # the module's, which takes every call
    with pyspark_shuffle.enable(spark, config=service.config()) as switch:
        got = outcome_of(lambda: _apply(events))
        call = switch.calls[-1]
    switch.close()
    assert (call.path, call.reason.split(":")[0]) == ("spark", "a small input")
    assert "pyspark-shuffle.dropin.min-input-size" in call.reason
    assert got.comparable() == expected.comparable()
    assert got.rows
