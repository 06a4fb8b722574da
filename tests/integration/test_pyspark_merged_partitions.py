"""Many small map outputs merged per reducer before the reduce stage, on both services (the
external one's workers merge the partitions they hold): reducers read the same rows in the
same order as unmerged, a rerun map task is read from its own output, never twice, and a
merged partition lost or corrupt as it is read is read from its sources."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from pyspark.sql import functions as F  # noqa: N812 (Spark's own spelling)

from pyspark_shuffle import SparkShuffle
from tests.integration.services import ShuffleService

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


@pytest.mark.parametrize("how", ["deleted", "corrupt"])
def test_a_merged_partition_that_fails_as_it_is_read_is_read_from_its_sources(
    shuffle: SparkShuffle, service: ShuffleService, data: DataFrame, how: str
) -> None:
    """Within the action: the reducers read its sources instead, every row once, and no map
    task runs again. A lost one is dropped before the next reduce stage."""
    exchange = shuffle.hash_exchange(data, "k", num_partitions=REDUCERS)
    result = shuffle.read(exchange)
    first = _by_reducer(result)
    [failing] = [
        descriptor
        for descriptor in exchange.read_descriptors()
        if descriptor.result_partition_id.partition_id.partition_index == MAPS + 1
    ]
    if how == "deleted":
        service.delete_partition(failing)
    else:
        service.corrupt_partition(failing)

    again = _by_reducer(result)  # the same reduce stage, run again
    assert {reducer: sorted(rows) for reducer, rows in again.items()} == {
        reducer: sorted(rows) for reducer, rows in first.items()
    }
    assert exchange.runs.per_map == dict.fromkeys(range(MAPS), 1)  # no map task rerun
    later = shuffle.read(exchange)
    assert _by_reducer(later) == again
    if how == "deleted":
        assert _merged(exchange) == [MAPS, MAPS + 2]
        assert shuffle.statistics(later).map_outputs_merged == MAPS - PER_MERGE
    shuffle.release(later)
    shuffle.release(result)
    # Released with the exchange: its map outputs and merged partitions, nothing left over.
    assert exchange.released
    assert not [path for path in service.stored_paths() if exchange.result_id in path]


def test_map_outputs_spark_reruns_inside_actions_are_not_merged(
    spark: SparkSession, service: ShuffleService, data: DataFrame
) -> None:
    """Where Spark keeps a shuffle of the map outputs to rerun those lost with an executor
    inside an action, a merged partition lost with it would fail the action: none is made.
    The external service's map outputs outlive executors: Spark keeps none, and they merge."""
    held = {**_MERGED, "pyspark-shuffle.rerun-in-actions": "true"}
    with SparkShuffle(spark, config=service.config(**held)) as holding:
        exchange = holding.hash_exchange(data, "k", num_partitions=REDUCERS)
        on_executors = service.cluster is None
        assert exchange.on_executors is on_executors
        result = holding.read(exchange)
        assert sorted(row for rows in _by_reducer(result).values() for row in rows) == sorted(
            (row.k, row.v) for row in data.collect()
        )
        merged = 0 if on_executors else MAPS // PER_MERGE
        assert holding.statistics(result).merged_partitions == merged
        assert len(_merged(exchange)) == merged


def test_map_outputs_on_workers_apart_merge_per_worker(
    spark: SparkSession, service: ShuffleService, data: DataFrame
) -> None:
    """Without replicas, the external service's map outputs are spread over its workers: each
    merged partition is made of one worker's, and reducers read each row once. (The default
    service's all share one store here: one site.)"""
    alone = {**_MERGED}
    if service.cluster is not None:
        alone["external-shuffle.replication-factor"] = 1
    with SparkShuffle(spark, config=service.config(**alone)) as spread:
        exchange = spread.hash_exchange(data, "k", num_partitions=REDUCERS)
        workers = {exchange.outputs[index].descriptor.merge_site() for index in range(MAPS)}
        result = spread.read(exchange)
        assert sorted(row for rows in _by_reducer(result).values() for row in rows) == sorted(
            (row.k, row.v) for row in data.collect()
        )
        statistics = spread.statistics(result)
        assert statistics.map_outputs_merged == MAPS
        assert statistics.merged_partitions >= len(workers)
        assert len(workers) == (1 if service.cluster is None else 2)
        merged_on = {
            descriptor.merge_site()
            for descriptor in exchange.read_descriptors()
            if descriptor.result_partition_id.partition_id.partition_index >= MAPS
        }
        assert merged_on == workers  # each on one worker: the one its sources are on
