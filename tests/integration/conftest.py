"""Fixtures shared by the integration tests: the shuffle services (the Spark session is in
tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from external_shuffle.local_cluster import LocalCluster
from pyspark_shuffle import SparkShuffle
from tests.integration.dropin_runs import closed_switch
from tests.integration.services import ShuffleService, external_service, netty_service

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


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


@pytest.fixture(scope="module")
def switch_per_service(spark: SparkSession, service: ShuffleService) -> Iterator[None]:
    """No drop-in switch before or after the module on each service (a switch made on another
    service's configuration would refuse the module's): ``pytest.mark.usefixtures`` of it."""
    closed_switch(spark)
    yield
    closed_switch(spark)
