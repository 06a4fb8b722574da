"""Fixtures shared by every test directory: one local Spark session for the whole run (a JVM
takes ~10 s to start), created only when a test asks for it.

``TEST_SPARK_SESSION=connect`` makes it a Spark Connect client's session, on a Connect
server of its own (``make test`` runs the PySpark operations' tests so too, in a pytest
process of their own: a Connect client cannot share its process with a classic session).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pyspark_shuffle.options import SPARK_CONF_PREFIX
from pyspark_shuffle.spark.local import local_connect_server, local_spark_session
from tests.s3_stand_in import S3StandIn, running_stand_in

SPARK_MAX_SUBPARTITIONS = 8
"""``pyspark-shuffle.max-subpartitions`` as the shared session's Spark conf sets it."""


TEST_SPARK = os.environ.get("TEST_SPARK_SESSION", "classic")
"""Which kind of Spark session the tests get: ``classic`` or ``connect``."""

_CONF = {
    f"{SPARK_CONF_PREFIX}pyspark-shuffle.max-subpartitions": str(SPARK_MAX_SUBPARTITIONS),
    f"{SPARK_CONF_PREFIX}pyspark-shuffle.progress.interval": "0",
}


@pytest.fixture(scope="session")
def spark(request: pytest.FixtureRequest) -> Iterator[SparkSession]:
    # Spark's processes keep the environment they start with: the S3 stand-in's first, so its
    # Python workers (and a Connect server) reach it. Not where moto is not installed (the
    # older Spark releases' environments run no test on an object store).
    if importlib.util.find_spec("moto") is not None:
        request.getfixturevalue("s3_stand_in")
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


@pytest.fixture(scope="session")
def s3_stand_in() -> Iterator[S3StandIn]:
    """moto's S3 server, one per test process, as this process's S3 (its environment): s3fs
    keeps one filesystem per process whatever the endpoint, so there is one endpoint."""
    with running_stand_in() as stand_in:
        saved = {name: os.environ.get(name) for name in stand_in.environment()}
        os.environ.update(stand_in.environment())
        yield stand_in
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
