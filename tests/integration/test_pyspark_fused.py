"""Chains of pyshuffle operations in a real local Spark session, on the default service (a
fused chain on both, and on an object store, is in test_pyspark_every_operation.py; dropped
results released as the chain goes on, on both): an operation
whose input is the untouched result of an earlier one reads it straight from that result's
reduce tasks (a fused stage), equal to Spark's answer for the same chain; the earlier result
stays a valid DataFrame; and the exchanges of results the user dropped are released while the
chain goes on."""

from __future__ import annotations

import gc
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from pyspark_shuffle import SparkShuffle
from tests.integration.services import DEFAULT_SERVICE_ONLY, ShuffleService
from tests.integration.spark_rows import multiset, ordered

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

ROWS = 30_000
SUMMARY = "user long, events long, total double"


@pytest.fixture(scope="module")
def events(spark: SparkSession) -> DataFrame:
    frame: DataFrame = spark.range(0, ROWS, 1, 4).selectExpr(
        "id",
        "case when id % 17 = 0 then null else id % 211 end as user",
        "cast(id % 23 as double) * 1.5 as amount",
        "concat('c', id % 4) as category",
    )
    return frame.cache()


@pytest.fixture(scope="module")
def users(spark: SparkSession) -> DataFrame:
    frame: DataFrame = spark.range(0, 200).selectExpr(
        "id as user", "concat('s', id % 5) as segment"
    )
    return frame.cache()


def summarize(table: pa.Table) -> pa.Table:
    return pa.table(
        {
            "user": table["user"][:1],
            "events": pa.array([table.num_rows], pa.int64()),
            "total": pa.array([pc.sum(table["amount"]).as_py()], pa.float64()),
        }
    )


def per_segment(table: pa.Table) -> pa.Table:
    return pa.table(
        {
            "segment": table["segment"][:1],
            "users": pa.array([table.num_rows], pa.int64()),
            "total": pa.array([pc.sum(table["total"]).as_py()], pa.float64()),
        }
    )


def _spark_summary(events: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F  # noqa: N812, PLC0415

    return events.groupBy("user").agg(F.count("*").alias("events"), F.sum("amount").alias("total"))


@DEFAULT_SERVICE_ONLY
def test_a_chain_runs_fused_and_equals_spark(
    shuffle: SparkShuffle, events: DataFrame, users: DataFrame
) -> None:
    from pyspark.sql import functions as F  # noqa: N812, PLC0415

    summary = shuffle.group_apply(events, "user", summarize, SUMMARY)
    joined = shuffle.join(summary, users, "user")
    segments = shuffle.group_apply(
        joined, "segment", per_segment, "segment string, users long, total double"
    )
    ranked = shuffle.sort(segments, ["total", "segment"], ascending=[False, True])

    spark_joined = _spark_summary(events).join(users, "user")
    spark_segments = spark_joined.groupBy("segment").agg(
        F.count("*").alias("users"), F.sum("total").alias("total")
    )
    assert ordered(ranked) == ordered(spark_segments.orderBy(F.desc("total"), "segment"))
    assert shuffle.statistics(summary).fused_inputs == 0
    assert shuffle.statistics(joined).fused_inputs == 1  # the left side; users from the JVM
    assert shuffle.statistics(segments).fused_inputs == 1
    assert shuffle.statistics(ranked).fused_inputs == 1
    # Each earlier result is still an ordinary DataFrame.
    assert multiset(summary) == multiset(_spark_summary(events))
    assert multiset(joined) == multiset(spark_joined)


@DEFAULT_SERVICE_ONLY
def test_a_result_changed_by_spark_is_an_ordinary_input(
    shuffle: SparkShuffle, events: DataFrame
) -> None:
    summary = shuffle.group_apply(events, "user", summarize, SUMMARY)
    busy = summary.filter("events > 140")
    result = shuffle.repartition(busy, "user", num_partitions=3)
    assert shuffle.statistics(result).fused_inputs == 0
    assert multiset(result) == multiset(_spark_summary(events).filter("events > 140"))


@DEFAULT_SERVICE_ONLY
def test_a_result_the_user_cached_is_read_from_spark_s_cache(
    shuffle: SparkShuffle, events: DataFrame
) -> None:
    summary = shuffle.group_apply(events, "user", summarize, SUMMARY).cache()
    try:
        ranked = shuffle.sort(summary, ["total", "user"])
        assert shuffle.statistics(ranked).fused_inputs == 0
        assert ordered(ranked) == ordered(_spark_summary(events).orderBy("total", "user"))
    finally:
        summary.unpersist()


@DEFAULT_SERVICE_ONLY
def test_a_fused_stage_casts_what_a_function_returns_to_the_declared_schema(
    shuffle: SparkShuffle, events: DataFrame
) -> None:
    def narrow(table: pa.Table) -> pa.Table:  # int32 and float32 where long and double are declared
        return pa.table(
            {
                "user": table["user"][:1].cast(pa.int32()),
                "events": pa.array([table.num_rows], pa.int32()),
                "total": pa.array([pc.sum(table["amount"]).as_py()], pa.float32()),
            }
        )

    summary = shuffle.group_apply(events, "user", narrow, SUMMARY)
    again = shuffle.repartition(summary, "user", num_partitions=2)
    assert shuffle.statistics(again).fused_inputs == 1
    assert multiset(again) == multiset(summary)


def test_dropped_results_are_released_while_the_chain_goes_on(
    shuffle: SparkShuffle, service: ShuffleService, events: DataFrame, users: DataFrame
) -> None:
    before = len(service.stored_paths())
    summary = shuffle.group_apply(events, "user", summarize, SUMMARY)
    joined = shuffle.join(summary, users, "user", broadcast="none")  # two exchanges of its own
    del summary
    gc.collect()
    segments = shuffle.group_apply(
        joined, "segment", per_segment, "segment string, users long, total double"
    )
    del joined
    gc.collect()
    while_chained = len(service.stored_paths())
    ranked = shuffle.sort(segments, ["total"])
    statistics = shuffle.statistics(ranked)
    after = len(service.stored_paths())
    assert ranked.count() == 5
    # The group_apply's and the join's exchanges, and the rows each kept for its reader, go as
    # soon as their results are dropped: on the external service no rerun of a later stage
    # needs them; on the default service Spark is told they are gone, so a rerun remakes them.
    assert statistics.upstream_released == 5
    assert after - before < while_chained - before
    shuffle.release(ranked)
    shuffle.release(segments)


@DEFAULT_SERVICE_ONLY
def test_a_broadcast_join_over_a_dropped_result_stays_readable(
    spark: SparkSession, service: ShuffleService, events: DataFrame, users: DataFrame
) -> None:
    # The join's tasks are the dropped result's reduce tasks: they read its descriptor lists,
    # here every one offloaded to the blob store.
    offloaded = service.config(**{"scheduling.descriptors.offload-threshold": 1})
    with SparkShuffle(spark, config=offloaded) as shuffle:
        summary = shuffle.group_apply(events, "user", summarize, SUMMARY)
        joined = shuffle.join(summary, users, "user", broadcast="right")
        del summary
        gc.collect()
        assert shuffle.statistics(joined).broadcast_side == "right"
        assert multiset(joined) == multiset(_spark_summary(events).join(users, "user"))


def _counted(directory: Path) -> Callable[[pa.Table], pa.Table]:
    """``summarize`` that notes the rows of every call in ``directory`` (local mode: the
    executors share the driver's disk)."""

    def counted(table: pa.Table) -> pa.Table:
        note = directory / f"{os.getpid()}-{uuid.uuid4().hex}"
        note.write_text(str(table.num_rows))
        return summarize(table)

    return counted


@DEFAULT_SERVICE_ONLY
@pytest.mark.parametrize("keep", [True, False])
def test_a_result_two_operations_read_runs_its_function_once_per_row(
    spark: SparkSession,
    service: ShuffleService,
    events: DataFrame,
    tmp_path: Path,
    keep: bool,
) -> None:
    from pyspark.sql import functions as F  # noqa: N812, PLC0415

    before = len(service.stored_paths())
    config = service.config(**{"pyspark-shuffle.keep-results": keep})
    with SparkShuffle(spark, config=config) as shuffle:
        summary = shuffle.group_apply(events, "user", _counted(tmp_path), SUMMARY)
        busiest = shuffle.sort(summary, ["events", "user"], ascending=[False, True])
        sizes = shuffle.group_apply(
            summary,
            "events",
            lambda table: pa.table({"events": table["events"][:1], "users": [table.num_rows]}),
            "events long, users long",
        )
        expected = _spark_summary(events)
        assert ordered(busiest) == ordered(expected.orderBy(F.desc("events"), "user"))
        assert multiset(sizes) == multiset(
            expected.groupBy("events").agg(F.count("*").alias("users"))
        )
        assert shuffle.statistics(summary).kept is keep
        assert shuffle.statistics(busiest).fused_inputs == 1
        rows = sum(int(note.read_text()) for note in tmp_path.iterdir())
        # Kept: once. Else three times: the sort's sample and map stage, the group-apply's.
        assert rows == (ROWS if keep else 3 * ROWS)
    assert len(service.stored_paths()) == before


@DEFAULT_SERVICE_ONLY
def test_a_kept_sort_keeps_its_order(shuffle: SparkShuffle, events: DataFrame) -> None:
    ranked = shuffle.sort(events, ["amount", "id"], ascending=[False, True])
    shuffle.repartition(ranked, "category", num_partitions=2)  # keeps the sort's rows
    assert shuffle.statistics(ranked).kept
    table = shuffle.to_arrow(ranked)  # read back through the kept rows
    pairs = list(zip(table["amount"].to_pylist(), table["id"].to_pylist(), strict=True))
    assert len(pairs) == ROWS
    assert pairs == sorted(pairs, key=lambda pair: (-pair[0], pair[1]))
