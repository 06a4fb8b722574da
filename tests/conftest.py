"""Fixtures shared by every test directory: one local Spark session for the whole run (a JVM
takes ~10 s to start), created only when a test asks for it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from pyspark_shuffle.local_spark import local_spark_session
from pyspark_shuffle.options import SPARK_CONF_PREFIX

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
