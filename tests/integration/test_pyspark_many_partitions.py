"""A stage of the size real jobs have: hundreds of map tasks and a thousand reducers, on both
services, against Spark's own shuffle of the same data (speed: benchmarks/many_partitions.py)."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from pyspark.sql import functions as F  # noqa: N812 (Spark's own spelling)

from pyspark_shuffle import SparkShuffle

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MAPS = 200
REDUCERS = 1_000
ROWS = 30_000
KEYS = 7_919


def test_200_map_tasks_into_1000_reducers_equal_spark(
    shuffle: SparkShuffle, spark: SparkSession
) -> None:
    data = spark.range(0, ROWS, 1, MAPS).selectExpr(f"id % {KEYS} as k", "id as v")
    expected = Counter((row.k, row.v) for row in data.repartition(REDUCERS, "k").collect())
    result = shuffle.repartition(data, "k", num_partitions=REDUCERS)
    assert result.rdd.getNumPartitions() == REDUCERS
    placed = result.select("k", "v", F.spark_partition_id().alias("reducer")).collect()
    # Every row exactly once, as Spark's shuffle delivers them.
    assert Counter((row.k, row.v) for row in placed) == expected
    # Each key in one reducer, and the keys spread over (nearly) all of them.
    reducers_of_key: dict[int, set[int]] = {}
    for row in placed:
        reducers_of_key.setdefault(row.k, set()).add(row.reducer)
    assert all(len(reducers) == 1 for reducers in reducers_of_key.values())
    assert len({row.reducer for row in placed}) > 0.95 * REDUCERS
    statistics = shuffle.statistics(result)
    assert (statistics.map_tasks, statistics.reducers) == (MAPS, REDUCERS)
    assert statistics.rows_written == statistics.rows_read == ROWS
    assert statistics.map_tasks_rerun == 0
    shuffle.release(result)
