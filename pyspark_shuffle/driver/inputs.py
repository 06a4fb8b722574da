"""What a map stage reads: a Spark DataFrame (its rows handed over by the JVM), or a source
that the map tasks read themselves (see :mod:`pyspark_shuffle.driver.parquet`)."""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from pyspark_shuffle.driver.registry import RegisteredExchange
from pyspark_shuffle.spark.link import is_connect

__all__ = ["BatchWriter", "FrameInput", "MapInput", "Produce", "RowTasks"]

BatchWriter = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]
"""What a map task runs on its input's batches: it writes them, and yields its metadata row."""

Produce = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]
"""What a task runs on the batches of its partition of ``RowTasks.frame`` to make its rows."""


@dataclass(frozen=True, slots=True)
class RowTasks:
    """The tasks that make some rows: task ``i`` turns the batches of partition ``i`` of
    ``frame`` into its rows with ``produce``."""

    frame: DataFrame
    produce: Produce
    description: str
    number_of_tasks: int | None = None
    """Partitions of ``frame``, where known without running them."""


class MapInput(abc.ABC):
    """The input of one map stage: one map task per partition."""

    @property
    @abc.abstractmethod
    def schema(self) -> StructType:
        """The rows' Spark schema (as the DataFrame the user passed has it)."""

    @property
    @abc.abstractmethod
    def number_of_maps(self) -> int | None:
        """One map task per partition; ``None`` where Spark cannot say before running them
        (a DataFrame under Spark Connect): the map stage then tells."""

    @abc.abstractmethod
    def row_tasks(self) -> RowTasks:
        """The tasks that read the input, one per map task, and what makes their rows."""

    def map_in_arrow(self, write: BatchWriter, schema: StructType | str) -> DataFrame:
        """The map tasks as a DataFrame of what ``write`` yields (of ``schema``): task ``i``
        hands ``write`` the rows of map task ``i``."""
        tasks = self.row_tasks()
        produce = tasks.produce

        def read_and_write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            return write(produce(batches))

        return tasks.frame.mapInArrow(read_and_write, schema)

    def with_one_task(self) -> MapInput:
        """No rows, in one task: where a stage had no task at all (an empty local DataFrame
        under Spark Connect has no partition), an exchange still needs one."""
        return _NoRows(self.row_tasks().frame.sparkSession, self.schema)

    @property
    def upstream(self) -> Sequence[RegisteredExchange]:
        """The exchanges the map tasks read (a fused stage's), which must outlive them."""
        return ()

    @property
    def producer_stage(self) -> str | None:
        """The reduce stage whose tasks are the map tasks (a fused stage's), else ``None``."""
        return None


def _unchanged(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    return batches


class FrameInput(MapInput):
    """A DataFrame's partitions, as the JVM hands them to Python (``mapInArrow``)."""

    def __init__(self, frame: DataFrame) -> None:
        self._frame = frame

    @property
    def schema(self) -> StructType:
        return self._frame.schema

    @property
    def number_of_maps(self) -> int | None:
        if is_connect(self._frame.sparkSession):
            return None
        return int(self._frame.rdd.getNumPartitions())

    def row_tasks(self) -> RowTasks:
        # Not counted here: with adaptive execution, counting runs the DataFrame's shuffles.
        return RowTasks(self._frame, _unchanged, "DataFrame")


def _nothing(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    return iter(())


class _NoRows(MapInput):
    """A schema, with one task that hands over no rows (Spark optimizes away any repartition
    of an empty relation, so the task is a one-row range's)."""

    def __init__(self, spark: SparkSession, schema: StructType) -> None:
        self._spark = spark
        self._schema = schema

    @property
    def schema(self) -> StructType:
        return self._schema

    @property
    def number_of_maps(self) -> int:
        return 1

    def row_tasks(self) -> RowTasks:
        one_task = self._spark.range(0, 1, 1, 1)
        return RowTasks(one_task, _nothing, "empty DataFrame", 1)
