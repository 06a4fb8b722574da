"""Fixtures shared by the integration tests: one local Spark session for the whole run (a JVM
takes ~10 s to start), created only when a test asks for it, and the shuffle services."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from external_shuffle.local_cluster import LocalCluster
from pyspark_shuffle import SparkShuffle
from pyspark_shuffle.local_spark import local_spark_session
from pyspark_shuffle.options import SPARK_CONF_PREFIX
from tests.integration.services import ShuffleService, external_service, netty_service

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SPARK_MAX_SUBPARTITIONS = 8
"""``pyspark-shuffle.max-subpartitions`` as the shared session's Spark conf sets it."""


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = local_spark_session(
        "pyshuffle-tests",
        cores=2,
        max_task_failures=2,
        conf={
            f"{SPARK_CONF_PREFIX}pyspark-shuffle.max-subpartitions": str(SPARK_MAX_SUBPARTITIONS),
            f"{SPARK_CONF_PREFIX}pyspark-shuffle.progress.interval": "0",
        },
    )
    yield session
    session.stop()


@pytest.fixture(scope="module", params=["netty_like", "external_shuffle"])
def service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ShuffleService]:
    """Each module runs on the default service and on a real external cluster (a coordinator
    and two worker daemons of its own)."""
    if request.param == "netty_like":
        yield netty_service(tmp_path_factory.mktemp("store"))
        return
    with LocalCluster(tmp_path_factory.mktemp("cluster"), workers=2) as cluster:
        yield external_service(cluster)


@pytest.fixture(scope="module")
def shuffle(spark: SparkSession, service: ShuffleService) -> Iterator[SparkShuffle]:
    """A SparkShuffle on the module's service, closed after the module."""
    with SparkShuffle(spark, config=service.config()) as made:
        yield made
