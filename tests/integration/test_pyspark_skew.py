"""Adaptive reducers with real PySpark: one key holding half the rows is split among reducers
where the operation allows it (a rebalance, a join's splittable side) and reported where it does
not (a group-apply); descriptors offloaded to the blob store reach every reducer and go with
the result. Results are compared with Spark's own operators on the same data."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql import DataFrame, SparkSession

from pyspark_shuffle import SparkShuffle
from tests.integration.services import ShuffleService
from tests.integration.spark_rows import multiset

ROWS = 40_000
MAPS = 8
SKEWED_KEY = 0


@pytest.fixture(scope="module")
def skewed(spark: SparkSession) -> DataFrame:
    """Half the rows (and a few more) on key 0, spread over all 8 map tasks; the rest over
    997 keys."""
    frame: DataFrame = spark.range(0, ROWS, 1, MAPS).selectExpr(
        "id",
        f"cast(case when id % 2 = 0 then {SKEWED_KEY} else id % 997 end as bigint) as key",
        "concat('payload-', cast(id as string)) as text",
    )
    return frame.cache()


@pytest.fixture(scope="module")
def dimension(spark: SparkSession) -> DataFrame:
    """Every key once, key 0 three times (so each split of it meets all three)."""
    frame: DataFrame = spark.range(0, 997, 1, 2).selectExpr(
        "cast(id as bigint) as key", "concat('name-', cast(id as string)) as name"
    )
    extra = spark.createDataFrame([(SKEWED_KEY, "zero-b"), (SKEWED_KEY, "zero-c")], frame.schema)
    return frame.union(extra).cache()


@pytest.fixture(scope="module")
def adaptive(spark: SparkSession, service: ShuffleService) -> Iterator[SparkShuffle]:
    """Reducers of ~100 kB from 16 subpartitions; any subpartition over 4x the median is
    skewed (no minimum size, so test-sized data can be). A map task a partition: a skewed
    subpartition is split among the map tasks that wrote it, and coalesced partitions (Spark's
    estimate of a cached frame is small once it is cached) would leave fewer."""
    config = service.config(
        **{
            "pyspark-shuffle.map.target-size": "0",
            "pyspark-shuffle.max-subpartitions": "16",
            "pyspark-shuffle.reducer.target-size": "100k",
            "scheduling.skew.threshold": "0",
        }
    )
    with SparkShuffle(spark, config=config) as made:
        yield made


def _at_most_twice_the_mean(sizes: tuple[int, ...] | list[int]) -> None:
    mean = statistics.mean(sizes)
    assert max(sizes) <= 2 * mean, f"a reducer reads {max(sizes)}, the mean is {mean:.0f}"


def test_a_rebalance_splits_the_skewed_key_among_reducers(
    adaptive: SparkShuffle, skewed: DataFrame
) -> None:
    result = adaptive.rebalance(skewed, "key")
    assert multiset(result) == multiset(skewed)
    shuffled = adaptive.statistics(result)
    assert len(shuffled.skewed_subpartitions) == 1
    assert shuffled.unsplittable_subpartitions == ()
    _at_most_twice_the_mean(shuffled.bytes_per_reducer)
    rows_per_reducer = result.rdd.glom().map(len).collect()
    assert len(rows_per_reducer) == shuffled.reducers
    _at_most_twice_the_mean(rows_per_reducer)
    # The skewed key really is in several reducers now.
    reducers_with_key = result.rdd.glom().filter(
        lambda rows: any(row["key"] == SKEWED_KEY for row in rows)
    )
    assert reducers_with_key.count() > 1


def test_a_group_apply_keeps_the_skewed_key_whole_and_reports_it(
    adaptive: SparkShuffle, skewed: DataFrame, caplog: pytest.LogCaptureFixture
) -> None:
    def count(table: pa.Table) -> pa.Table:
        return pa.table(
            {"key": table.column("key").slice(0, 1), "rows": pa.array([table.num_rows])}
        )

    result = adaptive.group_apply(skewed, "key", count, "key long, rows long")
    expected = skewed.groupBy("key").count().withColumnRenamed("count", "rows")
    assert multiset(result) == multiset(expected)
    shuffled = adaptive.statistics(result)
    assert len(shuffled.unsplittable_subpartitions) == 1
    assert shuffled.skewed_subpartitions == ()
    [warning] = [r for r in caplog.records if "read whole by one reducer" in r.getMessage()]
    assert (warning.name, warning.levelname) == ("pyspark_shuffle.driver.reduce_stage", "WARNING")


@pytest.mark.parametrize("how", ["inner", "left"])
def test_a_join_splits_the_skewed_side_and_replicates_the_other(
    adaptive: SparkShuffle, skewed: DataFrame, dimension: DataFrame, how: str
) -> None:
    # Shuffled, not broadcast: the dimension is small enough for a broadcast join.
    result = adaptive.join(skewed, dimension, "key", how, broadcast="none")
    assert multiset(result) == multiset(skewed.join(dimension, "key", how))
    shuffled = adaptive.statistics(result)
    assert len(shuffled.skewed_subpartitions) == 1
    _at_most_twice_the_mean(shuffled.bytes_per_reducer)


def test_a_right_join_cannot_split_its_left_side_and_still_joins_right(
    adaptive: SparkShuffle, skewed: DataFrame, dimension: DataFrame
) -> None:
    result = adaptive.join(skewed, dimension, "key", "right", broadcast="none")
    assert multiset(result) == multiset(skewed.join(dimension, "key", "right"))
    assert len(adaptive.statistics(result).unsplittable_subpartitions) == 1


def test_offloaded_descriptors_reach_every_reducer_and_go_with_the_result(
    spark: SparkSession, service: ShuffleService, skewed: DataFrame, tmp_path: Path
) -> None:
    blobs = tmp_path / "blobs"
    config = service.config(
        **{
            "scheduling.descriptors.offload-threshold": "1",
            "blob.store-url": str(blobs),
            "pyspark-shuffle.max-subpartitions": "4",
        }
    )
    with SparkShuffle(spark, config=config) as shuffle:
        result = shuffle.repartition(skewed, "key", num_partitions=4)
        stored = [path for path in blobs.rglob("*") if path.is_file()]
        assert len(stored) == 1  # one shared list for all 4 reducers
        assert multiset(result) == multiset(skewed)
        totals = result.groupBy("key").count().where(f"key = {SKEWED_KEY}").collect()
        assert totals[0]["count"] == skewed.where(f"key = {SKEWED_KEY}").count()
        shuffle.release(result)
        assert not [path for path in blobs.rglob("*") if path.is_file()]


def test_unfinished_blobs_are_deleted_when_the_shuffle_closes(
    spark: SparkSession, service: ShuffleService, skewed: DataFrame, tmp_path: Path
) -> None:
    blobs = tmp_path / "blobs"
    config = service.config(
        **{"scheduling.descriptors.offload-threshold": "1", "blob.store-url": str(blobs)}
    )
    with SparkShuffle(spark, config=config) as shuffle:
        result = shuffle.sort(skewed, "id")
        first = result.limit(1).collect()
        assert first[0]["id"] == pc.min(pa.array(range(ROWS))).as_py()
        assert [path for path in blobs.rglob("*") if path.is_file()]
    assert not [path for path in blobs.rglob("*") if path.is_file()]
