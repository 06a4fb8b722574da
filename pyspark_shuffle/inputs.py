"""What a map stage reads: a Spark DataFrame (its rows handed over by the JVM), or a source
that the map tasks read themselves (see :mod:`pyspark_shuffle.parquet`)."""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

if TYPE_CHECKING:
    from pyspark_shuffle.exchange import Exchange

__all__ = ["BatchWriter", "FrameInput", "MapInput"]

BatchWriter = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]
"""What a map task runs on its input's batches: it writes them, and yields its metadata row."""


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
    def map_in_arrow(self, write: BatchWriter, schema: str) -> DataFrame:
        """The map tasks as a DataFrame of what ``write`` yields (Spark DDL ``schema``): task
        ``i`` hands ``write`` the batches of partition ``i``."""

    @property
    def upstream(self) -> Sequence[Exchange]:
        """The exchanges the map tasks read (a fused stage's), which must outlive them."""
        return ()


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

    def map_in_arrow(self, write: BatchWriter, schema: str) -> DataFrame:
        return self._frame.mapInArrow(write, schema)
