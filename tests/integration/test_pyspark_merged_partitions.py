"""Many small map outputs merged per reducer before the reduce stage (the default service;
the external one leaves its map outputs unmerged, see test_pyspark_many_partitions.py):
reducers read the same rows in the same order as unmerged, a rerun map task is read from its
own output, never twice, and a merged partition the service lost is read from its sources."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from pyspark.sql import functions as F  # noqa: N812 (Spark's own spelling)

from pyspark_shuffle import SparkShuffle
from tests.integration.services import ShuffleService, netty_service

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from pyspark_shuffle.driver.exchange import Exchange

MAPS = 24
PER_MERGE = 8
REDUCERS = 40
ROWS = 24_000

_MERGED = {
    "pyspark-shuffle.merge.min-blocks": 1,
    "pyspark-shuffle.merge.tasks": MAPS // PER_MERGE,
    "pyspark-shuffle.map.target-size": 0,
}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> ShuffleService:
    return netty_service(Path(tmp_path_factory.mktemp("store")))


@pytest.fixture(scope="module")
def shuffle(spark: SparkSession, service: ShuffleService) -> Iterator[SparkShuffle]:
    with SparkShuffle(spark, config=service.config(**_MERGED)) as made:
        yield made


@pytest.fixture(scope="module")
def data(spark: SparkSession) -> DataFrame:
    return spark.range(0, ROWS, 1, MAPS).selectExpr("id % 997 as k", "id as v")


def _by_reducer(frame: DataFrame) -> dict[int, list[tuple[int, int]]]:
    """Each reducer's rows, in the order it yields them."""
    placed: dict[int, list[tuple[int, int]]] = {}
    for row in frame.select("k", "v", F.spark_partition_id().alias("reducer")).collect():
        placed.setdefault(row.reducer, []).append((row.k, row.v))
    return placed


def _merged(exchange: Exchange) -> list[int]:
    """The merged partitions reducers read, by partition index."""
    return [
        index
        for descriptor in exchange.read_descriptors()
        if (index := descriptor.result_partition_id.partition_id.partition_index) >= MAPS
    ]


def test_merged_reads_equal_unmerged_ones_row_for_row(
    spark: SparkSession, service: ShuffleService, shuffle: SparkShuffle, data: DataFrame
) -> None:
    merged = shuffle.read(shuffle.hash_exchange(data, "k", num_partitions=REDUCERS))
    with SparkShuffle(
        spark, config=service.config(**{**_MERGED, "pyspark-shuffle.merge.min-blocks": 0})
    ) as unmerging:
        unmerged = unmerging.read(unmerging.hash_exchange(data, "k", num_partitions=REDUCERS))
        expected = _by_reducer(unmerged)
        assert unmerging.statistics(unmerged).merged_partitions == 0
    assert _by_reducer(merged) == expected
    assert sorted(row for rows in expected.values() for row in rows) == sorted(
        (row.k, row.v) for row in data.collect()
    )
    statistics = shuffle.statistics(merged)
    assert (statistics.merged_partitions, statistics.map_outputs_merged) == (
        MAPS // PER_MERGE,
        MAPS,
    )
    assert statistics.rows_read == ROWS


def test_a_map_task_rerun_after_the_merge_is_read_from_its_own_output_only(
    shuffle: SparkShuffle, service: ShuffleService, data: DataFrame
) -> None:
    exchange = shuffle.hash_exchange(data, "k", num_partitions=REDUCERS)
    first = _by_reducer(shuffle.read(exchange))
    assert _merged(exchange) == [MAPS, MAPS + 1, MAPS + 2]
    service.delete_partition(exchange.outputs[PER_MERGE + 3].descriptor)
    assert exchange.lost_maps() == [PER_MERGE + 3]

    again = shuffle.read(exchange)
    assert exchange.runs.per_map[PER_MERGE + 3] == 2
    # Its merged partition is gone (released); the others still stand in for their maps.
    assert _merged(exchange) == [MAPS, MAPS + 2]
    assert _by_reducer(again) == first
    statistics = shuffle.statistics(again)
    assert statistics.map_outputs_merged == MAPS - PER_MERGE
    assert statistics.rows_read == ROWS


def test_a_lost_merged_partition_is_read_from_its_sources(
    shuffle: SparkShuffle, service: ShuffleService, data: DataFrame
) -> None:
    exchange = shuffle.hash_exchange(data, "k", num_partitions=REDUCERS)
    result = shuffle.read(exchange)
    first = _by_reducer(result)
    [lost] = [
        descriptor
        for descriptor in exchange.read_descriptors()
        if descriptor.result_partition_id.partition_id.partition_index == MAPS + 1
    ]
    service.delete_partition(lost)
    with pytest.raises(Exception, match="PartitionNotFoundError"):
        result.collect()

    again = shuffle.recover(result)
    assert _by_reducer(again) == first
    assert exchange.runs.per_map == dict.fromkeys(range(MAPS), 1)  # no map task rerun
    assert _merged(exchange) == [MAPS, MAPS + 2]
    assert shuffle.statistics(again).map_outputs_merged == MAPS - PER_MERGE
    shuffle.release(again)
    shuffle.release(result)
    # Released with the exchange: its map outputs and merged partitions, nothing left over.
    assert exchange.released
    assert not [path for path in service.stored_paths() if exchange.result_id in path]


def test_map_outputs_spark_reruns_inside_actions_are_not_merged(
    spark: SparkSession, service: ShuffleService, data: DataFrame
) -> None:
    """Where Spark keeps a shuffle of the map outputs to rerun those lost with an executor
    inside an action, a merged partition lost with it would fail the action: none is made."""
    held = {**_MERGED, "pyspark-shuffle.rerun-in-actions": "true"}
    with SparkShuffle(spark, config=service.config(**held)) as holding:
        exchange = holding.hash_exchange(data, "k", num_partitions=REDUCERS)
        assert exchange.on_executors
        result = holding.read(exchange)
        assert sorted(row for rows in _by_reducer(result).values() for row in rows) == sorted(
            (row.k, row.v) for row in data.collect()
        )
        assert holding.statistics(result).merged_partitions == 0
        assert _merged(exchange) == []
