"""pyshuffle in the user's Spark session: the user's job group and description stay theirs
(pyshuffle's jobs are labelled inside them), and ``spark.conf.set`` of a ``spark.pyshuffle.*``
key takes effect for the next operation."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

from pyspark_shuffle import SparkShuffle
from pyspark_shuffle.options import PROGRESS_INTERVAL, SPARK_CONF_PREFIX
from shuffle_api import ConfigError
from tests.eventually import eventually
from tests.integration.services import netty_service
from tests.integration.spark_rows import multiset

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

JOB_PROPERTIES = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")


@pytest.fixture
def shuffle(spark: SparkSession, tmp_path: Path) -> Iterator[SparkShuffle]:
    with SparkShuffle(spark, config=netty_service(tmp_path).config()) as made:
        yield made


@pytest.fixture
def data(spark: SparkSession) -> DataFrame:
    frame: DataFrame = spark.range(0, 5_000, 1, 4).selectExpr("id", "id % 13 as k")
    return frame


@pytest.fixture
def clean_job_properties(spark: SparkSession) -> Iterator[None]:
    yield
    for key in JOB_PROPERTIES:
        spark.sparkContext.setLocalProperty(key, None)  # type: ignore[arg-type]


def _descriptions_of_group(spark: SparkSession, group: str) -> list[str]:
    """The descriptions of the jobs Spark ran in ``group`` (from its status store)."""
    jobs: Any = spark.sparkContext._jsc.sc().statusStore().jobsList(None)  # a Scala Seq
    return [
        job.description().get() if job.description().isDefined() else ""
        for job in (jobs.apply(index) for index in range(jobs.size()))
        if job.jobGroup().isDefined() and job.jobGroup().get() == group
    ]


@pytest.mark.usefixtures("clean_job_properties")
def test_an_operation_keeps_the_users_job_group_and_labels_its_jobs_inside(
    spark: SparkSession, shuffle: SparkShuffle, data: DataFrame
) -> None:
    context = spark.sparkContext
    context.setJobGroup("nightly-etl", "nightly load", interruptOnCancel=True)
    result = shuffle.sort(shuffle.repartition(data, "k", num_partitions=3), "id")
    assert multiset(result) == multiset(data)
    assert [context.getLocalProperty(key) for key in JOB_PROPERTIES] == [
        "nightly-etl",
        "nightly load",
        "true",
    ]
    # pyshuffle's own jobs (map stages, the sort's sample) ran in the user's group, so
    # cancelJobGroup reaches them, and say what they are after the user's description. The
    # status store hears of a job from Spark's listener bus, a moment after it ends.
    labels = ("map stage of repartition", "map stage of sort", "sample of id")

    def labelled() -> bool:
        descriptions = _descriptions_of_group(spark, "nightly-etl")
        ours = [text for text in descriptions if text.startswith("nightly load | pyshuffle: ")]
        return all(any(label in text for text in ours) for label in labels)

    eventually(labelled, f"jobs of the group labelled {labels}")


@pytest.mark.usefixtures("clean_job_properties")
def test_without_a_users_job_group_none_is_left_behind(
    spark: SparkSession, shuffle: SparkShuffle, data: DataFrame
) -> None:
    assert shuffle.repartition(data, "k", num_partitions=3).count() == data.count()
    assert [spark.sparkContext.getLocalProperty(key) for key in JOB_PROPERTIES] == [None] * 3


@pytest.fixture
def session_conf(spark: SparkSession) -> Iterator[list[str]]:
    """Keys the test sets with spark.conf.set, unset afterwards."""
    keys: list[str] = []
    yield keys
    for key in keys:
        spark.conf.unset(key)


def test_spark_conf_set_takes_effect_for_the_next_operation(
    spark: SparkSession, shuffle: SparkShuffle, data: DataFrame, session_conf: list[str]
) -> None:
    # The fixture's session sets no reducer.min-count: automatic reducers are at least Spark's
    # default parallelism (2 here) and, for this little data, exactly that.
    before = shuffle.statistics(shuffle.repartition(data, "k")).reducers
    key = f"{SPARK_CONF_PREFIX}pyspark-shuffle.reducer.min-count"
    session_conf.append(key)
    spark.conf.set(key, "5")
    result = shuffle.repartition(data, "k")
    # 5 of 8 near-even subpartitions: cut in 4 by bytes, the largest then split in two.
    assert before == 2 and shuffle.statistics(result).reducers == 5
    assert multiset(result) == multiset(data)
    spark.conf.unset(key)
    assert shuffle.statistics(shuffle.repartition(data, "k")).reducers == before


def test_spark_conf_may_not_change_what_the_running_service_reads(
    spark: SparkSession, shuffle: SparkShuffle, data: DataFrame, session_conf: list[str]
) -> None:
    key = f"{SPARK_CONF_PREFIX}shuffle-service-factory.class"
    session_conf.append(key)
    spark.conf.set(key, "external_shuffle")
    with pytest.raises(ConfigError, match=r"'shuffle-service-factory\.class' was .* set it before"):
        shuffle.repartition(data, "k")


def test_a_typo_in_spark_conf_is_blamed_on_that_spark_conf_key(
    spark: SparkSession, shuffle: SparkShuffle, data: DataFrame, session_conf: list[str]
) -> None:
    key = f"{SPARK_CONF_PREFIX}pyspark-shuffle.reducer.min-cuont"
    session_conf.append(key)
    spark.conf.set(key, "5")
    with pytest.raises(ConfigError) as raised:
        shuffle.repartition(data, "k")
    message = str(raised.value)
    assert f"from Spark conf {key}" in message
    assert "did you mean 'pyspark-shuffle.reducer.min-count'" in message


def _slowly(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        time.sleep(0.4)
        yield batch


def test_progress_lines_count_the_map_tasks_of_the_stage_they_name(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A chained stage's Spark jobs run its inputs' stages too: its progress lines count its
    own map tasks (once they said "2 of 6 tasks" for a stage of 2)."""
    slow = spark.range(0, 4_000, 1, 4).mapInArrow(_slowly, "id long")
    config = {**netty_service(tmp_path).config(), PROGRESS_INTERVAL.key: 0.1}
    with (
        SparkShuffle(spark, config=config) as shuffle,
        caplog.at_level(logging.INFO, logger="pyspark_shuffle.driver.progress"),
    ):
        first = shuffle.repartition(slow, "id", num_partitions=3)
        second = shuffle.repartition(first.mapInArrow(_slowly, "id long"), "id", num_partitions=2)
        assert second.count() == 4_000
    lines = [record.getMessage() for record in caplog.records]
    counts = [
        re.search(r"\((\d+) tasks\): (\d+) done, (\d+) Spark tasks running", line) for line in lines
    ]
    assert lines and all(counts), lines
    assert all(int(done) <= int(tasks) for tasks, done, _ in (c.groups() for c in counts if c))
    # Both stages reported, each with its own task count.
    assert {int(c.group(1)) for c in counts if c} == {4, 3}
