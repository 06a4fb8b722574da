"""A stage of the size real jobs have: hundreds of map tasks and a thousand reducers, on both
services, against Spark's own shuffle of the same data (speed: benchmarks/many_partitions.py)."""

from __future__ import annotations

import gc
import socket
import tracemalloc
import weakref
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest
from pyspark.sql import functions as F  # noqa: N812 (Spark's own spelling)

from pyspark_shuffle import SparkShuffle
from pyspark_shuffle.spark.internals import task_connection

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row, SparkSession

    from tests.integration.services import ShuffleService

MAPS = 200
REDUCERS = 1_000
ROWS = 30_000
KEYS = 7_919


def _data(spark: SparkSession) -> DataFrame:
    return spark.range(0, ROWS, 1, MAPS).selectExpr(f"id % {KEYS} as k", "id as v")


MAP_TARGET_SIZE = "spark.pyshuffle.pyspark-shuffle.map.target-size"


@pytest.fixture(autouse=True)
def one_map_task_a_partition(spark: SparkSession) -> Iterator[None]:
    """These tests count map outputs: each partition is a map task of its own (the default
    reads small partitions in fewer map tasks)."""
    spark.conf.set(MAP_TARGET_SIZE, "0")
    yield
    spark.conf.unset(MAP_TARGET_SIZE)


@pytest.fixture(scope="module")
def spark_rows(spark: SparkSession) -> Counter[tuple[int, int]]:
    """Each row of the data once: what a repartition delivers, Spark's or pyshuffle's (not
    Spark's 1,000 reducers again: CI time)."""
    return Counter((row.k, row.v) for row in _data(spark).collect())


# 200,000 blocks each way: minutes on a slow shared machine.
@pytest.mark.timeout(900)
def test_200_map_tasks_into_1000_reducers_equal_spark(
    shuffle: SparkShuffle, spark: SparkSession, spark_rows: Counter[tuple[int, int]]
) -> None:
    result = shuffle.repartition(_data(spark), "k", num_partitions=REDUCERS)
    placed = result.select("k", "v", F.spark_partition_id().alias("reducer")).collect()
    # Every row exactly once, as Spark's shuffle delivers them.
    assert Counter((row.k, row.v) for row in placed) == spark_rows
    # Each key in one reducer, and the keys spread over (nearly) all of them.
    assert all(len(reducers) == 1 for reducers in _reducers_of_keys(placed).values())
    assert len({row.reducer for row in placed}) > 0.95 * REDUCERS
    statistics = shuffle.statistics(result)
    assert (statistics.map_tasks, statistics.reducers) == (MAPS, REDUCERS)
    assert statistics.rows_written == statistics.rows_read == ROWS
    assert statistics.map_tasks_rerun == 0
    # A task planned for each reducer, empty ones too (the collect above ran them; reading
    # them again to count took longer than it).
    assert result.rdd.getNumPartitions() == REDUCERS
    shuffle.release(result)


def test_small_partitions_are_read_by_two_map_tasks_a_core_with_every_row_once(
    shuffle: SparkShuffle, spark: SparkSession, spark_rows: Counter[tuple[int, int]]
) -> None:
    """200 partitions of 150 rows: Spark's estimate of their size is far below a map task's
    target, so they are read by two map tasks for each of local[2]'s cores, each reading 50
    neighbouring partitions; the reducers are as asked."""
    spark.conf.unset(MAP_TARGET_SIZE)
    data = _data(spark)
    assert data.rdd.getNumPartitions() == MAPS
    result = shuffle.repartition(data, "k", num_partitions=64)
    placed = result.select("k", "v", F.spark_partition_id().alias("reducer")).collect()
    assert Counter((row.k, row.v) for row in placed) == spark_rows
    assert all(len(reducers) == 1 for reducers in _reducers_of_keys(placed).values())
    statistics = shuffle.statistics(result)
    assert (statistics.map_tasks, statistics.reducers) == (4, 64)
    assert statistics.rows_written == statistics.rows_read == ROWS
    shuffle.release(result)


def _reducers_of_keys(placed: list[Row]) -> dict[int, set[int]]:
    reducers_of_key: dict[int, set[int]] = {}
    for row in placed:
        reducers_of_key.setdefault(row.k, set()).add(row.reducer)
    return reducers_of_key


def _batches_and_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    sizes = [batch.num_rows for batch in batches]
    yield pa.record_batch({"batches": [len(sizes)], "rows": [sum(sizes)]})


def test_a_reducer_gets_the_small_blocks_of_many_map_outputs_in_few_batches(
    shuffle: SparkShuffle, spark: SparkSession
) -> None:
    """Each of 100 map outputs holds a few rows for each reducer: the reducer's function gets
    them gathered, as Spark hands a task its rows, not a batch per map output."""
    data = spark.range(0, 4_000, 1, 100).selectExpr("id % 997 as k", "id as v")
    result = shuffle.repartition_map(
        data, "k", _batches_and_rows, "batches long, rows long", num_partitions=8
    )
    counts = result.collect()
    assert sum(row.rows for row in counts) == 4_000
    assert len(counts) == 8
    assert all(row.batches == 1 for row in counts)  # one batch of ~500 rows from 100 blocks
    shuffle.release(result)


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def _collections_in_the_worker(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for _ in batches:
        pass
    left = weakref.ref(_Cycle())  # garbage a task leaves, in a cycle
    gc.collect()
    yield pa.record_batch({"frozen": [gc.get_freeze_count()], "cycle_left": [left() is not None]})


def test_a_worker_leaves_what_it_keeps_out_of_the_collection_after_each_task(
    shuffle: SparkShuffle, spark: SparkSession
) -> None:
    """PySpark's daemon collects garbage after every task: the objects a pyshuffle worker keeps
    for good (modules, its environment) are frozen so that collection skips them, and what a
    task leaves behind is still collected."""
    data = spark.range(0, 400, 1, 4).selectExpr("id % 13 as k", "id as v")
    result = shuffle.repartition_map(
        data, "k", _collections_in_the_worker, "frozen long, cycle_left boolean", num_partitions=4
    )
    rows = result.collect()
    assert len(rows) == 4
    assert all(row.frozen > 10_000 for row in rows)
    assert not any(row.cycle_left for row in rows)
    shuffle.release(result)


def _the_task_connection(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for _ in batches:
        pass
    descriptor = task_connection()
    assert descriptor is not None
    connection = socket.socket(fileno=descriptor)
    try:
        family, peer = connection.family.name, connection.getpeername()[0]
    finally:
        connection.detach()
    yield pa.record_batch({"family": [family], "peer": [peer]})


def test_a_task_finds_the_connection_its_executor_sends_its_input_on(
    shuffle: SparkShuffle, spark: SparkSession
) -> None:
    """Each pyshuffle task tells that connection to acknowledge at once (a delayed
    acknowledgement held its input back 40 ms:
    tests/unit/pyspark_shuffle/tasks/test_python_worker.py)."""
    data = spark.range(0, 400, 1, 8).selectExpr("id % 13 as k", "id as v")
    result = shuffle.repartition_map(
        data, "k", _the_task_connection, "family string, peer string", num_partitions=8
    )
    rows = result.collect()
    assert len(rows) == 8
    assert {(row.family, row.peer) for row in rows} == {("AF_INET", "127.0.0.1")}
    shuffle.release(result)


def _spark_shuffle_bytes(
    shuffle: SparkShuffle, spark: SparkSession, maps: int, reducers: int
) -> int | None:
    data = spark.range(0, 4_000, 1, maps).selectExpr("id % 997 as k", "id as v")
    result = shuffle.repartition(data, "k", num_partitions=reducers)
    # Written by the map stage (the reducers' rows are the 200 x 1,000 test's).
    statistics = shuffle.statistics(result)
    assert statistics.rows_written == 4_000
    shuffle.release(result)
    return statistics.spark_shuffle_bytes


def test_what_spark_shuffles_for_an_exchange_grows_with_map_tasks_not_reducers(
    shuffle: SparkShuffle, spark: SparkSession, service: ShuffleService
) -> None:
    """The Spark shuffle an exchange keeps where asked to (see ``Exchange.held_map_outputs``)
    carries a row per map task, read by every reducer: were it to grow with the reducers too,
    a stage would read O(M x R^2) bytes of it. By default, local mode keeps none (its one
    executor is the application), nor does any mode for the external service's partitions,
    which outlive executors."""
    assert _spark_shuffle_bytes(shuffle, spark, 20, 400) == 0
    asked = {"pyspark-shuffle.rerun-in-actions": "true"}
    held: dict[tuple[int, int], int | None] = {}
    with SparkShuffle(spark, config=service.config(**asked)) as holding:
        sizes = (
            ((20, 400),) if service.name == "external_shuffle" else ((20, 50), (20, 400), (80, 50))
        )
        for maps, reducers in sizes:
            held[maps, reducers] = _spark_shuffle_bytes(holding, spark, maps, reducers)
    if service.name == "external_shuffle":
        assert held == {(20, 400): 0}
        return
    base = held[20, 50]
    assert base is not None
    assert 0 < base < 20 * 1_024  # under a KiB per map task
    assert held[20, 400] is not None and held[20, 400] <= 1.1 * base  # 8x the reducers
    assert held[80, 50] is not None and 3.5 * base <= held[80, 50] <= 4.5 * base  # 4x the maps


def test_what_the_driver_keeps_of_an_exchange_grows_with_map_tasks_plus_reducers(
    shuffle: SparkShuffle, spark: SparkSession
) -> None:
    """Python memory the driver still holds once an exchange is written and its reducers
    planned, at two sizes 4x apart in M + R and 16x apart in M x R: it grew 9.3-9.6x when the
    driver kept what each map task wrote to each subpartition, 3.6-3.7x since."""
    held: dict[tuple[int, int], int] = {}
    # The first of the three warms up what any exchange loads once (modules, caches).
    for maps, reducers in ((4, 10), (16, 500), (64, 2_000)):
        data = spark.range(0, 2 * maps * reducers, 1, maps).selectExpr("id % 7919 as k", "id")
        gc.collect()
        tracemalloc.start()
        try:
            result = shuffle.repartition(data, "k", num_partitions=reducers)
            gc.collect()
            held[maps, reducers] = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        assert shuffle.statistics(result).rows_written == 2 * maps * reducers
        shuffle.release(result)
    growth = held[64, 2_000] / held[16, 500]
    assert growth < 6, f"{held}: {growth:.1f}x"
