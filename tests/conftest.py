"""Fixtures shared by every test directory: one local Spark session for the whole run (a JVM
takes ~10 s to start), created only when a test asks for it.

``TEST_SPARK_SESSION=connect`` makes it a Spark Connect client's session, on a Connect
server of its own (``make test`` runs the PySpark operations' tests so too, in a pytest
process of their own: a Connect client cannot share its process with a classic session).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pyspark_shuffle.local_spark import local_connect_server, local_spark_session
from pyspark_shuffle.options import SPARK_CONF_PREFIX

SPARK_MAX_SUBPARTITIONS = 8
"""``pyspark-shuffle.max-subpartitions`` as the shared session's Spark conf sets it."""


TEST_SPARK = os.environ.get("TEST_SPARK_SESSION", "classic")
"""Which kind of Spark session the tests get: ``classic`` or ``connect``."""

_CONF = {
    f"{SPARK_CONF_PREFIX}pyspark-shuffle.max-subpartitions": str(SPARK_MAX_SUBPARTITIONS),
    f"{SPARK_CONF_PREFIX}pyspark-shuffle.progress.interval": "0",
}


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    if TEST_SPARK == "connect":
        root = str(Path(__file__).resolve().parent.parent)  # tests' own modules ship by name
        with local_connect_server(
            cores=2, max_task_failures=2, conf=_CONF, python_path=[root]
        ) as url:
            session = SparkSession.builder.remote(url).getOrCreate()
            yield session
            session.stop()
        return
    assert TEST_SPARK == "classic", f"TEST_SPARK_SESSION={TEST_SPARK}: classic or connect"
    session = local_spark_session("pyshuffle-tests", cores=2, max_task_failures=2, conf=_CONF)
    yield session
    session.stop()
