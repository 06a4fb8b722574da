"""What a map stage reads: a Spark DataFrame (its rows handed over by the JVM), or a source
that the map tasks read themselves (see :mod:`pyspark_shuffle.parquet`)."""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

if TYPE_CHECKING:
    from pyspark_shuffle.exchange import Exchange

__all__ = ["BatchWriter", "FrameInput", "MapInput", "Produce", "TaskOutput"]

BatchWriter = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]
"""What a map task runs on its input's batches: it writes them, and yields its metadata row."""

Produce = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]
"""What a task runs on the batches of its partition of ``TaskOutput.tasks`` to make its rows."""


@dataclass(frozen=True, slots=True)
class TaskOutput:
    """The tasks that make some rows: task ``i`` turns the batches of partition ``i`` of
    ``tasks`` into its rows with ``produce``."""

    tasks: DataFrame
    produce: Produce
    description: str


class MapInput(abc.ABC):
    """The input of one map stage: one map task per partition."""

    @property
    @abc.abstractmethod
    def schema(self) -> StructType:
        """The rows' Spark schema (as the DataFrame the user passed has it)."""

    @property
    @abc.abstractmethod
    def number_of_maps(self) -> int: ...

    @abc.abstractmethod
    def task_output(self) -> TaskOutput:
        """The tasks that read the input, one per map task, and what makes their rows."""

    def map_in_arrow(self, write: BatchWriter, schema: StructType | str) -> DataFrame:
        """The map tasks as a DataFrame of what ``write`` yields (of ``schema``): task ``i``
        hands ``write`` the rows of map task ``i``."""
        output = self.task_output()
        produce = output.produce

        def read_and_write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            return write(produce(batches))

        return output.tasks.mapInArrow(read_and_write, schema)

    @property
    def upstream(self) -> Sequence[Exchange]:
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
    def number_of_maps(self) -> int:
        return self._frame.rdd.getNumPartitions()

    def task_output(self) -> TaskOutput:
        return TaskOutput(self._frame, _unchanged, "DataFrame")
