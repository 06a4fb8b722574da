"""Failures around a SparkShuffle in a real local Spark session: map outputs lost between the
stages, a map task that fails after writing some rows and is retried by Spark, and errors that
must name their cause (bad keys before any Spark job, a user function's own exception)."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest

from pyspark_shuffle import Exchange, SparkShuffle
from pyspark_shuffle.driver.progress import JOB_PROPERTIES
from pyspark_shuffle.spark.internals import _shuffle_dependency, held_shuffle
from pyspark_shuffle.spark.link import is_connect
from shuffle_api import InvalidOperationError, StageCancelledError, StageFailedError
from tests.integration.services import ShuffleService
from tests.integration.spark_rows import multiset

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

ROWS = 12_000


@pytest.fixture(scope="module")
def data(spark: SparkSession) -> DataFrame:
    frame: DataFrame = spark.range(0, ROWS, 1, 4).selectExpr(
        "id",
        "case when id % 9 = 0 then null else id % 37 end as k",
        "concat('v', id) as s",
        "array(id) as l",
        "map('id', id) as m",
    )
    return frame.cache()


def _directories(exchange: Exchange, map_index: int) -> list[str]:
    return ShuffleService.partition_directories(exchange.outputs[map_index].descriptor)


def _delete_outputs(exchange: Exchange, map_indexes: list[int]) -> None:
    for map_index in map_indexes:
        for directory in _directories(exchange, map_index):
            assert os.path.isdir(directory)
            shutil.rmtree(directory)


def test_lost_map_outputs_are_rerun_before_the_reduce_stage(
    shuffle: SparkShuffle, data: DataFrame
) -> None:
    exchange = shuffle.hash_exchange(data, "k", num_partitions=4)
    assert exchange.runs.per_map == {0: 1, 1: 1, 2: 1, 3: 1}
    before = {index: output.descriptor for index, output in exchange.outputs.items()}
    _delete_outputs(exchange, [1, 3])
    assert exchange.lost_maps() == [1, 3]

    result = shuffle.read(exchange)
    assert multiset(result) == multiset(data)
    assert exchange.runs.per_map == {0: 1, 1: 2, 2: 1, 3: 2}
    after = {index: output.descriptor for index, output in exchange.outputs.items()}
    assert after[0] == before[0]
    assert after[2] == before[2]
    assert after[1] != before[1]
    assert after[3] != before[3]
    assert exchange.lost_maps() == []
    statistics = shuffle.statistics(result)
    assert statistics.rows_written == ROWS  # the lost attempts' rows are not counted twice
    assert statistics.map_tasks == 4


def test_the_shuffle_of_map_output_rows_is_made_without_spark_rerun_checksums(
    spark: SparkSession, data: DataFrame
) -> None:
    """Spark 4.2+ reruns every task that read a shuffle whose rerun map task wrote other rows,
    and fails the job if one was a finished result task: a rerun map task's rows name the new
    attempt, so an executor lost once some reducers finished failed the action."""
    held = held_shuffle(data.select("id").repartition(1))
    dependency = _shuffle_dependency(held.java_rdd)
    assert len(dependency.rowBasedChecksums()) == 0
    assert not dependency.checksumMismatchFullRetryEnabled()
    # The session's own shuffles keep them.
    own = _shuffle_dependency(data.repartition(3, "k")._jdf.javaRDD().rdd())
    assert len(own.rowBasedChecksums()) == 3
    assert own.checksumMismatchFullRetryEnabled()


def test_recover_after_a_failed_action_gives_a_result_that_reads(
    shuffle: SparkShuffle, data: DataFrame
) -> None:
    result = shuffle.repartition(data, "k", num_partitions=3)
    [exchange] = shuffle.exchanges(result)
    _delete_outputs(exchange, [2])
    with pytest.raises(Exception, match=exchange.result_id) as raised:
        result.count()
    assert "PartitionNotFoundError" in str(raised.value)
    recovered = shuffle.recover(result)
    assert exchange.runs.per_map == {0: 1, 1: 1, 2: 2, 3: 1}  # only the lost producer reran
    assert multiset(recovered) == multiset(data)


def _rows_per_key(table: pa.Table) -> pa.Table:
    return pa.table({"k": table["k"][:1], "rows": pa.array([table.num_rows], pa.int64())})


def test_lost_kept_rows_are_remade_before_a_later_read(
    shuffle: SparkShuffle, data: DataFrame
) -> None:
    counts = shuffle.group_apply(data, "k", _rows_per_key, "k long, rows long")
    again = shuffle.repartition(counts, "k", num_partitions=2)  # keeps the counts' rows
    assert shuffle.statistics(counts).kept
    [kept] = shuffle.exchanges(again)[0].upstream
    assert isinstance(kept, Exchange)
    _delete_outputs(kept, [0])
    expected = Counter((row["k"], row["count"]) for row in data.groupBy("k").count().collect())
    # to_arrow reads the kept rows: the lost one is remade first, and read where it is now.
    table = shuffle.to_arrow(counts)
    assert Counter(zip(table["k"].to_pylist(), table["rows"].to_pylist(), strict=True)) == (
        expected
    )
    assert kept.runs.per_map[0] == 2
    assert sum(expected.values()) == 38  # 37 keys and null


def test_a_recovered_broadcast_join_does_not_share_kept_rows(
    shuffle: SparkShuffle, data: DataFrame
) -> None:
    counts = shuffle.group_apply(data, "k", _rows_per_key, "k long, rows long")
    joined = shuffle.join(
        counts, counts.selectExpr("k", "rows * 2 as twice"), "k", broadcast="right"
    )
    shuffle.repartition(joined, "k", num_partitions=2)  # keeps the join's rows
    recovered = shuffle.recover(joined)
    assert shuffle.statistics(joined).kept
    assert not shuffle.statistics(recovered).kept
    shuffle.release(joined)  # its kept rows go; the recovered join reads its own tasks
    spark_counts = data.groupBy("k").count().withColumnRenamed("count", "rows")
    expected = spark_counts.join(spark_counts.selectExpr("k", "rows * 2 as twice"), "k")
    assert multiset(recovered) == multiset(expected)
    assert shuffle.to_arrow(recovered).num_rows == 37  # the null key joins nothing


def test_a_retried_map_task_writes_no_duplicate_rows(
    spark: SparkSession, shuffle: SparkShuffle, tmp_path: Path
) -> None:
    marker = tmp_path / "failed-once"

    def fail_first_attempt(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext  # noqa: PLC0415

        task = TaskContext.get()
        assert task is not None
        failing = task.partitionId() == 1 and task.attemptNumber() == 0
        for batch in batches:
            for start in range(0, batch.num_rows, 500):
                yield batch.slice(start, 500)
                if failing:
                    marker.write_text(str(start))
                    raise RuntimeError("injected failure after writing some rows")

    source = spark.range(0, ROWS, 1, 4)
    flaky = source.mapInArrow(fail_first_attempt, source.schema)
    exchange = shuffle.hash_exchange(flaky, "id", num_partitions=3)
    assert marker.exists(), "the first attempt of map task 1 did not fail"
    assert exchange.runs.per_map == {0: 1, 1: 1, 2: 1, 3: 1}  # Spark's retry is no rerun
    result = shuffle.read(exchange)
    ids = Counter(row["id"] for row in result.toArrow().to_pylist())
    assert ids == Counter(range(ROWS))
    assert shuffle.statistics(result).rows_written == ROWS
    # The failed attempt left no directory next to the registered one.
    for directory in _directories(exchange, 1):
        assert os.listdir(os.path.dirname(directory)) == [os.path.basename(directory)]


def _poisoned(data: DataFrame) -> DataFrame:
    """``data`` whose evaluation fails: a key check that ran a Spark job would say so."""

    def explode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        raise ValueError("this DataFrame must not be evaluated")
        yield from batches

    frame: DataFrame = data.mapInArrow(explode, data.schema)
    return frame


def test_bad_keys_fail_before_any_spark_job(shuffle: SparkShuffle, data: DataFrame) -> None:
    bad = _poisoned(data)
    other = _poisoned(data.selectExpr("cast(k as int) as k", "s as t"))
    with pytest.raises(InvalidOperationError, match="'missing'"):
        shuffle.repartition(bad, "missing")
    with pytest.raises(InvalidOperationError, match=r"'m'.*map<string,bigint>"):
        shuffle.hash_exchange(bad, ["k", "m"])
    with pytest.raises(InvalidOperationError, match="'m'"):
        shuffle.sort(bad, "m")
    with pytest.raises(InvalidOperationError, match="'m'"):
        shuffle.group_apply(bad, "m", lambda table: table, bad.schema)
    with pytest.raises(InvalidOperationError, match="at least one key"):
        shuffle.repartition(bad, [])
    with pytest.raises(InvalidOperationError, match=r"'k'.*bigint.*int"):
        shuffle.join(bad, other, "k")
    with pytest.raises(InvalidOperationError, match="'cross'"):
        shuffle.join(bad, other, "k", "cross")
    with pytest.raises(InvalidOperationError, match=r"\['k'\] are on both sides"):
        shuffle.join(bad, other.withColumnRenamed("t", "s"), "s")
    with pytest.raises(InvalidOperationError, match="ascending"):
        shuffle.sort(bad, ["k", "s"], ascending=[True])
    # Evaluating it does fail, so none of the above ran it.
    with pytest.raises(StageFailedError, match="ValueError: this DataFrame must not be evaluated"):
        shuffle.repartition(bad, "k")


def test_a_user_function_error_names_the_exception(shuffle: SparkShuffle, data: DataFrame) -> None:
    def broken(table: pa.Table) -> pa.Table:
        if table.column("k")[0].as_py() == 5:
            raise ZeroDivisionError("group 5 cannot be summarised")
        return table.select(["k"]).slice(0, 1)

    result = shuffle.group_apply(data, "k", broken, "k long")
    with pytest.raises(Exception, match="ZeroDivisionError: group 5 cannot be summarised"):
        result.collect()


def _slow(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        time.sleep(30)
        yield batch


def test_a_cancelled_map_stage_fails_as_a_cancellation(
    shuffle: SparkShuffle, spark: SparkSession
) -> None:
    """The user's own handle stops pyshuffle's jobs: a job group cancelled (classic) or a tag
    interrupted (Spark Connect); the operation raises the cancellation, typed, at once."""
    frame = spark.range(0, 4, 1, 2).mapInArrow(_slow, "id long")
    connect = is_connect(spark)
    if connect:
        spark.addTag("nightly-etl")
        cancel = threading.Timer(6, spark.interruptTag, ["nightly-etl"])
    else:
        spark.sparkContext.setJobGroup("nightly-etl", "nightly load", interruptOnCancel=True)
        cancel = threading.Timer(6, spark.sparkContext.cancelJobGroup, ["nightly-etl"])
    started = time.monotonic()
    cancel.start()
    try:
        with pytest.raises(StageCancelledError, match="map stage of repartition"):
            shuffle.repartition(frame, "id", num_partitions=2)
    finally:
        cancel.cancel()
        if connect:
            spark.removeTag("nightly-etl")
        else:
            for key in JOB_PROPERTIES:
                spark.sparkContext.setLocalProperty(key, None)  # type: ignore[arg-type]
    assert time.monotonic() - started < 25, "the stage ran on after the cancellation"
