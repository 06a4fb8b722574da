"""Telling Spark that the map outputs of one of its shuffles are gone, so that it recomputes
them (and, through the lineage, whatever they were computed from) the next time a stage needs
them, as it does for outputs lost with an executor.

An exchange on the default service keeps a Spark shuffle of its map tasks' metadata rows (see
``Exchange.held_map_outputs``): Spark reruns lost map tasks through it. Once pyshuffle deletes
the exchange's partitions, Spark must stop believing that shuffle holds them, else a rerun of a
later stage fused from the exchange would read deleted partitions instead of remaking them.

PySpark has no API for this. Spark's ``MapOutputTrackerMaster`` is reached through the
DAGScheduler with Py4J reflection (``SparkEnv``'s own methods cannot be listed by Py4J in
Spark 4); where that fails, :attr:`SparkShuffleOutputs.available` is false and callers keep
what a rerun may need instead.
"""

from __future__ import annotations

import logging
from typing import Any

from pyspark import RDD
from pyspark.sql import SparkSession

__all__ = ["SparkShuffleOutputs"]

_LOG = logging.getLogger(__name__)


def _map_output_tracker(spark: SparkSession) -> Any | None:
    try:
        scheduler = spark.sparkContext._jsc.sc().dagScheduler()
        field = scheduler.getClass().getDeclaredField("mapOutputTracker")
        field.setAccessible(True)
        tracker = field.get(scheduler)
        tracker.getNumAvailableOutputs(-1)  # proves the method is reachable
    except Exception as error:  # Py4J raises several kinds; any means "not reachable"
        _LOG.warning(
            "Spark's map output tracker is not reachable (%s): exchanges on executors stay"
            " while a later stage may rerun from them",
            error,
        )
        return None
    return tracker


def _shuffle_id(rdd: RDD[Any]) -> int:
    """The id of the Spark shuffle nearest below ``rdd`` in its lineage (first parents)."""
    java_rdd = rdd._jrdd.rdd()
    while True:
        dependencies = java_rdd.dependencies()
        if dependencies.isEmpty():
            raise ValueError(f"no shuffle in the lineage of {rdd}")
        dependency = dependencies.head()
        if dependency.getClass().getSimpleName() == "ShuffleDependency":
            return int(dependency.shuffleId())
        java_rdd = dependency.rdd()


class SparkShuffleOutputs:
    """The driver's map output tracker of one Spark application."""

    def __init__(self, spark: SparkSession) -> None:
        self._context = spark.sparkContext
        self._tracker = _map_output_tracker(spark)

    @property
    def available(self) -> bool:
        """Whether :meth:`forget` works here."""
        return self._tracker is not None

    def forget(self, rdd: RDD[Any]) -> bool:
        """Unregister every map output of the shuffle that made ``rdd``: the next stage that
        needs them reruns its map stage first. False if Spark could not be told (nothing to
        tell once the application stopped)."""
        if self._context._jsc is None:
            return True
        if self._tracker is None:
            return False
        try:
            self._tracker.unregisterAllMapAndMergeOutput(_shuffle_id(rdd))
        except Exception as error:  # Py4J's errors, or Spark's for a shuffle it dropped
            _LOG.warning("Spark's map outputs of %s were not unregistered: %s", rdd, error)
            return False
        return True
