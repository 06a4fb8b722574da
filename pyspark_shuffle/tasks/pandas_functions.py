"""Users' pandas functions per key group, run as Spark's ``groupBy(keys).applyInPandas(f,
schema)`` runs them: the same frame in, the same checks and conversion of what comes out, the
same errors.

:func:`pandas_function` marks a function for :meth:`SparkShuffle.group_apply
<pyspark_shuffle.SparkShuffle.group_apply>`; on the driver, :meth:`PandasGroupFunction.of`
makes of it, the declared schema and the session's settings the Arrow function the reduce
tasks run on each group (so that the per-group operation stays pure Arrow).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from inspect import getfullargspec
from typing import Any, Self

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from pyspark_shuffle.spark.internals import (
    check_pandas_result,
    pandas_group,
    pandas_result_batch,
)

__all__ = ["PandasFunction", "PandasGroupFunction", "PandasSettings", "pandas_function"]


@dataclass(frozen=True, slots=True)
class PandasFunction:
    """A function of pandas frames, ``f(pdf)`` or ``f(key, pdf)`` as Spark's
    ``applyInPandas`` takes it, marked by :func:`pandas_function`."""

    function: Callable[..., Any]


def pandas_function(function: Callable[..., Any]) -> PandasFunction:
    """Mark ``function`` as a pandas one: ``group_apply(frame, keys, pandas_function(f),
    schema)`` runs ``f`` as ``frame.groupBy(keys).applyInPandas(f, schema)`` would."""
    return PandasFunction(function)


def _setting(spark: SparkSession, key: str, default: str) -> bool:
    return str(spark.conf.get(key, default)).strip().lower() == "true"


@dataclass(frozen=True, slots=True)
class PandasSettings:
    """The session's settings that change what a pandas function sees and what its result
    becomes, read as Spark's Python worker reads them (same keys, same defaults)."""

    timezone: str
    """``spark.sql.session.timeZone``: timestamps are handed over, and read back, as wall
    times in it."""
    assign_columns_by_name: bool = True
    """``spark.sql.legacy.execution.pandas.groupedMap.assignColumnsByName``."""
    safe_conversion: bool = False
    """``spark.sql.execution.pandas.convertToArrowArraySafely``."""
    int_to_decimal: bool = False
    """``spark.sql.execution.pythonUDF.pandas.intToDecimalCoercionEnabled`` (Spark 4.1+)."""
    prefer_int_extension: bool = False
    """``spark.sql.execution.pythonUDF.pandas.preferIntExtensionDtype`` (Spark 4.3+)."""
    large_var_types: bool = False
    """``spark.sql.execution.arrow.useLargeVarTypes``."""

    @classmethod
    def of(cls, spark: SparkSession) -> Self:
        """The settings of ``spark`` now (a key this Spark lacks reads as its default)."""
        return cls(
            timezone=str(spark.conf.get("spark.sql.session.timeZone")),
            assign_columns_by_name=_setting(
                spark, "spark.sql.legacy.execution.pandas.groupedMap.assignColumnsByName", "true"
            ),
            safe_conversion=_setting(
                spark, "spark.sql.execution.pandas.convertToArrowArraySafely", "false"
            ),
            int_to_decimal=_setting(
                spark, "spark.sql.execution.pythonUDF.pandas.intToDecimalCoercionEnabled", "false"
            ),
            prefer_int_extension=_setting(
                spark, "spark.sql.execution.pythonUDF.pandas.preferIntExtensionDtype", "false"
            ),
            large_var_types=_setting(spark, "spark.sql.execution.arrow.useLargeVarTypes", "false"),
        )


@dataclass(frozen=True, slots=True)
class PandasGroupFunction:
    """A pandas function as an Arrow one: a group's table in, the result's table out.

    The function gets the group as Spark would hand it and, where it takes two parameters,
    the key first: a tuple of the key columns' values in the frame's first row (numpy
    scalars, as Spark's). What it returns is checked and converted to ``schema`` by PySpark's
    own functions (:mod:`~pyspark_shuffle.spark.internals`), so wrong results fail with the
    error class and message Spark's ``applyInPandas`` gives on this release."""

    function: Callable[..., Any]
    keys: tuple[str, ...]
    schema: StructType
    settings: PandasSettings
    pass_key: bool

    @classmethod
    def of(
        cls,
        marked: PandasFunction,
        keys: Sequence[str],
        schema: StructType,
        settings: PandasSettings,
    ) -> Self:
        # As Spark decides: by the named positional parameters (a lambda's too).
        pass_key = len(getfullargspec(marked.function).args) == 2
        return cls(marked.function, tuple(keys), schema, settings, pass_key)

    def __call__(self, table: pa.Table) -> pa.Table:
        settings = self.settings
        frame = pandas_group(
            table, timezone=settings.timezone, prefer_int_extension=settings.prefer_int_extension
        )
        if self.pass_key:
            key = tuple(frame[name].iloc[0] for name in self.keys)
            result = self.function(key, frame)
        else:
            result = self.function(frame)
        check_pandas_result(result, self.schema, by_name=settings.assign_columns_by_name)
        batch = pandas_result_batch(
            result,
            self.schema,
            timezone=settings.timezone,
            safecheck=settings.safe_conversion,
            by_name=settings.assign_columns_by_name,
            int_to_decimal=settings.int_to_decimal,
            large_var_types=settings.large_var_types,
        )
        return pa.Table.from_batches([batch])
