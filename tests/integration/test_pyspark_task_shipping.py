"""What a SparkShuffle ships with its tasks, in a real local Spark session: a reduce task
carries a fixed-size closure whatever the number of reducers (the deployments travel in one
broadcast, which lives as long as the result can be read), and map tasks name their
partitions by Spark's task attempt id, not by a random one."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import pytest

from pyspark_shuffle import SparkShuffle
from tests.integration.services import ShuffleService

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

ROWS = 2_000


@pytest.fixture(scope="module")
def data(spark: SparkSession) -> DataFrame:
    frame: DataFrame = spark.range(0, ROWS, 1, 4).selectExpr("id", "id % 97 as k")
    return frame.cache()


def _reduce_function(result: DataFrame) -> Any:
    """The Python function of ``result``'s reduce stage as the JVM holds it: the pickled
    command every reduce task receives and the broadcasts Spark ships beside it."""
    return result._jdf.queryExecution().logical().functionExpr().func()


def test_a_reduce_task_receives_the_same_bytes_whatever_the_number_of_reducers(
    shuffle: SparkShuffle, data: DataFrame
) -> None:
    few, many = (shuffle.repartition(data, "k", num_partitions=n) for n in (4, 400))
    few_command = _reduce_function(few).command().length()
    many_command = _reduce_function(many).command().length()
    # The same closure but for a few digits of the broadcast and accumulator ids; the
    # deployments of 400 reducers would add tens of kilobytes.
    assert abs(many_command - few_command) < 32, (few_command, many_command)
    assert _reduce_function(many).broadcastVars().size() == 1
    assert few.count() == ROWS


def test_the_deployments_live_while_the_result_can_be_read_and_go_at_close(
    spark: SparkSession, data: DataFrame, service: ShuffleService
) -> None:
    shuffle = SparkShuffle(spark, config=service.config())
    result = shuffle.repartition(data, "k", num_partitions=3)
    [deployments] = _reduce_function(result).broadcastVars()
    assert result.count() == ROWS
    assert result.count() == ROWS  # re-evaluated: the broadcast is still there
    recovered = shuffle.recover(result)
    [recovered_deployments] = _reduce_function(recovered).broadcastVars()
    assert recovered_deployments.id() != deployments.id()
    shuffle.release(recovered)
    assert result.count() == ROWS  # releasing another result leaves this one's deployments
    shuffle.close()
    assert not deployments.isValid()


def test_map_tasks_name_their_partitions_by_spark_task_attempt(
    shuffle: SparkShuffle, data: DataFrame
) -> None:
    first = shuffle.hash_exchange(data, "k", num_partitions=3)
    second = shuffle.hash_exchange(data, "k", num_partitions=3)
    attempts = [
        output.descriptor.result_partition_id.producer_attempt_id
        for exchange in (first, second)
        for output in exchange.outputs.values()
    ]
    assert all(re.fullmatch(r"task-\d+", attempt) for attempt in attempts), attempts
    # Spark numbers task attempts once per application: the same map task of two exchanges
    # (two Spark jobs) gets two ids.
    assert len(set(attempts)) == len(attempts) == 8
