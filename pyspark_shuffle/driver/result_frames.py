"""A result's DataFrame: Spark's own (classic or Connect), whose ``mapInArrow`` first asks
pyshuffle to run the function in the result's reduce tasks.

``shuffle.repartition(frame, keys).mapInArrow(function, schema)`` would read the shuffled
rows in a Python worker, hand them to the JVM, and have Spark start a second Python worker in
the same task to give them to ``function``: two workers and two trips through the JVM per
task, where ``repartition_map`` runs ``function`` in the reduce task itself. The DataFrame a
result is made of takes the second path by itself where pyshuffle can (see
``Stages.map_in_arrow``); anything else is Spark's, as it would have been.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from pyspark_shuffle.kernels.operations import BatchFunction

__all__ = ["MapInArrow", "as_result_frame"]

MapInArrow = Callable[[DataFrame, BatchFunction, StructType | str], DataFrame | None]
"""``frame.mapInArrow(function, schema)`` run by pyshuffle, or ``None`` where it does not."""

_FUSED = "_pyshuffle_map_in_arrow"


def as_result_frame(frame: DataFrame, map_in_arrow: MapInArrow) -> DataFrame:
    """``frame`` itself, its ``mapInArrow`` asking ``map_in_arrow`` first (the same object:
    the registry knows the result by it)."""
    frame.__class__ = _result_frame_class(type(frame))
    setattr(frame, _FUSED, map_in_arrow)
    return frame


def _result_frame_class(spark_class: type[DataFrame]) -> type[DataFrame]:
    """A subclass of ``spark_class`` (classic and Connect DataFrames are different classes)
    that only adds the question to ``mapInArrow``; one for each."""
    made = _CLASSES.get(spark_class)
    if made is not None:
        return made

    class ResultFrame(spark_class):  # type: ignore[misc, valid-type]
        def mapInArrow(  # noqa: N802 (Spark's name)
            self, func: BatchFunction, schema: StructType | str, *args: Any, **kwargs: Any
        ) -> DataFrame:
            # A barrier stage or a resource profile (any argument but the two) is Spark's.
            if not args and not any(kwargs.values()):
                fused: DataFrame | None = getattr(self, _FUSED)(self, func, schema)
                if fused is not None:
                    return fused
            spark_map: DataFrame = super().mapInArrow(func, schema, *args, **kwargs)
            return spark_map

    ResultFrame.__name__ = ResultFrame.__qualname__ = spark_class.__name__
    _CLASSES[spark_class] = ResultFrame
    return ResultFrame


_CLASSES: dict[type[DataFrame], type[DataFrame]] = {}
