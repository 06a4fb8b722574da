"""Broadcast joins in a real local Spark session, on the default service (a broadcast join
on both, and on an object store, is in test_pyspark_every_operation.py): the side Spark may
broadcast for each join type is broadcast when its map stage wrote little (the other side is
never shuffled), a larger one is shuffled with what it wrote reused, a hint forces a side the
join type allows and is refused otherwise; fused and Parquet inputs join in their own tasks; a
small Parquet side is read by the driver, with no Spark job of its own.
Every result equals Spark's join of the same DataFrames."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest

from pyspark_shuffle import SparkShuffle
from shuffle_api import InvalidOperationError
from tests.integration.services import DEFAULT_SERVICE_ONLY
from tests.integration.spark_rows import multiset, partitions_of

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = DEFAULT_SERVICE_ONLY

THRESHOLD_KEY = "spark.pyshuffle.pyspark-shuffle.join.broadcast-threshold"
SPARK_JOIN_NAMES = {"semi": "left_semi", "anti": "left_anti"}


@pytest.fixture(scope="module")
def facts(spark: SparkSession) -> DataFrame:
    frame: DataFrame = spark.range(0, 20_000, 1, 4).selectExpr(
        "id",
        "case when id % 13 = 0 then null else id % 300 end as k",
        "cast(id % 7 as double) as amount",
    )
    return frame.cache()


@pytest.fixture(scope="module")
def dimension(spark: SparkSession) -> DataFrame:
    # Keys 0..249 (some facts find none), a null key (never matches), a list payload.
    frame: DataFrame = spark.range(0, 251, 1, 2).selectExpr(
        "case when id = 250 then null else id end as k",
        "concat('name-', id) as name",
        "array(id, id * 2) as tags",
    )
    return frame.cache()


@contextmanager
def broadcast_threshold(spark: SparkSession, value: str) -> Iterator[None]:
    spark.conf.set(THRESHOLD_KEY, value)
    try:
        yield
    finally:
        spark.conf.unset(THRESHOLD_KEY)


def spark_join(left: DataFrame, right: DataFrame, how: str) -> DataFrame:
    return left.join(right, on="k", how=SPARK_JOIN_NAMES.get(how, how))


@pytest.mark.parametrize(
    ("how", "side"),
    [
        ("inner", "right"),
        ("left", "right"),
        ("semi", "right"),
        ("anti", "right"),
        ("right", "left"),
        ("full", None),
    ],
)
def test_the_side_spark_may_broadcast_is_broadcast_when_small(
    shuffle: SparkShuffle, facts: DataFrame, dimension: DataFrame, how: str, side: str | None
) -> None:
    # For a right join the left side is the one that may be broadcast: make it the small one.
    left, right = (dimension, facts) if how == "right" else (facts, dimension)
    result = shuffle.join(left, right, "k", how)
    assert result.columns == spark_join(left, right, how).columns
    got = multiset(result)
    # After an action: under Spark Connect the joining tasks are counted as they run.
    statistics = shuffle.statistics(result)
    assert statistics.broadcast_side == side
    if side is not None:
        small = right if side == "right" else left
        # Only the small side was written; the other side's tasks joined with all of it.
        assert shuffle.exchanges(result) == []
        assert statistics.rows_written == small.count()
        assert statistics.map_tasks == partitions_of(small)
        assert statistics.reducers == partitions_of(left if side == "right" else right)
    assert got == multiset(spark_join(left, right, how))
    assert sum(got.values()) > 0
    shuffle.release(result)


@pytest.mark.parametrize("how", ["inner", "left"])
def test_a_side_above_the_threshold_is_shuffled_and_written_once(
    shuffle: SparkShuffle, spark: SparkSession, facts: DataFrame, dimension: DataFrame, how: str
) -> None:
    with broadcast_threshold(spark, "1k"):
        result = shuffle.join(facts, dimension, "k", how)
    statistics = shuffle.statistics(result)
    assert statistics.broadcast_side is None
    left_exchange, right_exchange = shuffle.exchanges(result)
    assert left_exchange.name.startswith("join-left")
    assert right_exchange.name.startswith("join-right")
    # The right side's map stage ran once: its output, too large to broadcast, is shuffled.
    assert set(right_exchange.runs.per_map.values()) == {1}
    assert right_exchange.total_rows == dimension.count()
    assert multiset(result) == multiset(spark_join(facts, dimension, how))


def test_a_hint_broadcasts_a_side_whatever_its_size(
    shuffle: SparkShuffle, spark: SparkSession, facts: DataFrame, dimension: DataFrame
) -> None:
    with broadcast_threshold(spark, "0"):
        left_broadcast = shuffle.join(dimension, facts, "k", "inner", broadcast="left")
        right_broadcast = shuffle.join(facts, dimension, "k", "inner", broadcast="right")
        neither = shuffle.join(facts, dimension, "k", "inner")
    assert shuffle.statistics(left_broadcast).broadcast_side == "left"
    assert shuffle.statistics(right_broadcast).broadcast_side == "right"
    assert shuffle.statistics(neither).broadcast_side is None
    assert multiset(left_broadcast) == multiset(dimension.join(facts, "k"))
    assert multiset(right_broadcast) == multiset(facts.join(dimension, "k"))
    forced_off = shuffle.join(facts, dimension, "k", "left", broadcast="none")
    assert shuffle.statistics(forced_off).broadcast_side is None
    assert multiset(forced_off) == multiset(facts.join(dimension, "k", "left"))


@pytest.mark.parametrize(
    ("how", "side"),
    [("full", "right"), ("full", "left"), ("left", "left"), ("anti", "left"), ("right", "right")],
)
def test_a_side_the_join_type_cannot_broadcast_is_refused(
    shuffle: SparkShuffle, facts: DataFrame, dimension: DataFrame, how: str, side: str
) -> None:
    with pytest.raises(InvalidOperationError, match=f"cannot broadcast its {side} side"):
        shuffle.join(facts, dimension, "k", how, broadcast=side)


def test_an_unknown_broadcast_choice_is_refused(
    shuffle: SparkShuffle, facts: DataFrame, dimension: DataFrame
) -> None:
    with pytest.raises(InvalidOperationError, match="broadcast='sideways'"):
        shuffle.join(facts, dimension, "k", broadcast="sideways")


def test_an_empty_side_is_broadcast(
    shuffle: SparkShuffle, spark: SparkSession, facts: DataFrame
) -> None:
    empty = spark.createDataFrame([], "k long, name string")
    inner = shuffle.join(facts, empty, "k")
    left = shuffle.join(facts, empty, "k", "left")
    assert shuffle.statistics(inner).broadcast_side == "right"
    assert multiset(inner) == multiset(facts.join(empty, "k"))
    assert multiset(left) == multiset(facts.join(empty, "k", "left"))


def count_per_key(table: pa.Table) -> pa.Table:
    return pa.table(
        {"k": table.column("k").slice(0, 1), "n": pa.array([table.num_rows], pa.int64())}
    )


def test_fused_and_parquet_inputs_join_in_their_own_tasks(
    shuffle: SparkShuffle,
    spark: SparkSession,
    facts: DataFrame,
    dimension: DataFrame,
    tmp_path: Path,
) -> None:
    counts = shuffle.group_apply(facts, "k", count_per_key, "k long, n long")
    joined = shuffle.join(counts, dimension, "k", "left")
    statistics = shuffle.statistics(joined)
    assert (statistics.broadcast_side, statistics.fused_inputs) == ("right", 1)
    spark_counts = facts.groupBy("k").count().withColumnRenamed("count", "n")
    assert multiset(joined) == multiset(spark_counts.join(dimension, "k", "left"))
    recovered = shuffle.recover(joined)  # nothing lost: the same rows again
    assert shuffle.statistics(recovered).broadcast_side == "right"
    assert multiset(recovered) == multiset(joined)
    # A broadcast join's result feeds the next operation fused, too.
    again = shuffle.repartition(joined, "name", num_partitions=3)
    assert shuffle.statistics(again).fused_inputs == 1
    assert multiset(again) == multiset(joined)

    facts.write.parquet(str(tmp_path / "facts"))
    source = shuffle.read_parquet(str(tmp_path / "facts"), columns=["k", "amount"])
    from_files = shuffle.join(source, dimension, "k", "semi")
    assert shuffle.statistics(from_files).broadcast_side == "right"
    expected = facts.select("k", "amount").join(dimension, "k", "left_semi")
    assert multiset(from_files) == multiset(expected)


@pytest.mark.parametrize("how", ["inner", "left", "anti"])
def test_a_small_parquet_side_is_read_by_the_driver_with_no_spark_job_of_its_own(
    shuffle: SparkShuffle,
    facts: DataFrame,
    dimension: DataFrame,
    tmp_path: Path,
    how: str,
) -> None:
    dimension.write.parquet(str(tmp_path / "dimension"))
    # Columns and a filter, as Spark would read them: keys 0..199 and the null key.
    source = shuffle.read_parquet(
        str(tmp_path / "dimension"), columns=["k", "name"], filter=[("k", "<", 200)]
    )
    result = shuffle.join(facts, source, "k", how)
    expected = facts.join(
        dimension.select("k", "name").where("k < 200"), "k", SPARK_JOIN_NAMES.get(how, how)
    )
    assert result.columns == expected.columns
    assert multiset(result) == multiset(expected)
    statistics = shuffle.statistics(result)
    assert statistics.broadcast_side == "right"
    # No map task wrote the side: the driver read its files, and all of its rows.
    assert (statistics.map_tasks, statistics.rows_written) == (0, 200)
    assert statistics.reducers == partitions_of(facts)
    shuffle.release(result)


def test_a_parquet_side_larger_than_the_threshold_is_shuffled_unless_forced(
    shuffle: SparkShuffle,
    spark: SparkSession,
    facts: DataFrame,
    dimension: DataFrame,
    tmp_path: Path,
) -> None:
    dimension.write.parquet(str(tmp_path / "dimension"))
    source = shuffle.read_parquet(str(tmp_path / "dimension"))
    expected = multiset(facts.join(dimension, "k", "left"))
    with broadcast_threshold(spark, "1k"):
        shuffled = shuffle.join(facts, source, "k", "left")
        forced = shuffle.join(facts, source, "k", "left", broadcast="right")
    assert shuffle.statistics(shuffled).broadcast_side is None
    assert len(shuffle.exchanges(shuffled)) == 2
    assert multiset(shuffled) == expected
    assert (shuffle.statistics(forced).broadcast_side, shuffle.statistics(forced).map_tasks) == (
        "right",
        0,
    )
    assert multiset(forced) == expected
