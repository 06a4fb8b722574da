"""A map stage that runs longer than the coordinator's application timeout, on the external
service: what its first map tasks placed belongs to the application from the start, so the
coordinator keeps it until the driver claims it at the stage's end, and nothing reruns."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from external_shuffle.local_cluster import LocalCluster
from pyspark_shuffle import SparkShuffle
from tests.integration.pausing import paused, wait_for
from tests.integration.services import ShuffleService, external_service
from tests.integration.spark_rows import multiset

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

APPLICATION_TIMEOUT = 4.0


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShuffleService]:
    settings = {"external-shuffle.coordinator.application-timeout": APPLICATION_TIMEOUT}
    with LocalCluster(tmp_path_factory.mktemp("cluster"), settings=settings) as cluster:
        made = external_service(cluster)
        # The driver's heartbeats keep the application alive; only the map stage is long.
        made.settings["external-shuffle.client.heartbeat-interval"] = APPLICATION_TIMEOUT / 10
        yield made


def test_what_a_long_map_stage_placed_early_waits_for_the_drivers_claim(
    spark: SparkSession, service: ShuffleService, tmp_path: Path
) -> None:
    data = spark.range(0, 4_000, 1, 4).selectExpr("id", "id % 41 as k")
    ready, go = tmp_path / "ready", tmp_path / "go"
    with SparkShuffle(spark, config=service.config()) as shuffle:
        made: dict[str, DataFrame] = {}
        mapping = threading.Thread(
            target=lambda: made.setdefault(
                "result", shuffle.repartition(paused(data, ready, go, 3), "k", num_partitions=3)
            )
        )
        mapping.start()
        wait_for(ready)  # the first map tasks have placed their partitions; map 3 waits
        time.sleep(3 * APPLICATION_TIMEOUT)  # the coordinator reaps a few times meanwhile
        go.touch()
        mapping.join(timeout=300)
        result = made["result"]
        assert multiset(result) == multiset(data)
        assert shuffle.statistics(result).map_tasks_rerun == 0
