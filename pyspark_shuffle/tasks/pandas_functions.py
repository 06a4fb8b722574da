"""Users' pandas functions per key group, run as Spark's ``groupBy(keys).applyInPandas(f,
schema)`` and ``groupBy(keys).cogroup(...).applyInPandas(f, schema)`` run them: the same
frames in, the same checks and conversion of what comes out, the same errors.

:func:`pandas_function` marks a function for :meth:`SparkShuffle.group_apply
<pyspark_shuffle.SparkShuffle.group_apply>` and :meth:`~pyspark_shuffle.SparkShuffle.cogroup_apply`;
on the driver, :meth:`PandasGroupFunction.of` (:meth:`PandasCogroupFunction.of`) makes of it,
the declared schema and the session's settings the Arrow function the reduce tasks run on each
group (each cogroup), so that the per-group operation stays pure Arrow.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from inspect import getfullargspec
from typing import TYPE_CHECKING, Any, Self

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from pyspark_shuffle.spark.internals import (
    check_pandas_result,
    pandas_group,
    pandas_result_batch,
)
from pyspark_shuffle.spark.link import session_flag

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "PandasCogroupFunction",
    "PandasFunction",
    "PandasGroupFunction",
    "PandasSettings",
    "pandas_function",
]


@dataclass(frozen=True, slots=True)
class PandasFunction:
    """A function of pandas frames, ``f(pdf)`` or ``f(key, pdf)`` as Spark's
    ``applyInPandas`` takes it, marked by :func:`pandas_function`."""

    function: Callable[..., Any]


def pandas_function(function: Callable[..., Any]) -> PandasFunction:
    """Mark ``function`` as a pandas one: ``group_apply(frame, keys, pandas_function(f),
    schema)`` runs ``f`` as ``frame.groupBy(keys).applyInPandas(f, schema)`` would."""
    return PandasFunction(function)


@dataclass(frozen=True, slots=True)
class PandasSettings:
    """The session's settings that change what a pandas function sees and what its result
    becomes, read as Spark's Python worker reads them (same keys, same defaults). Arrow
    functions checked as Spark checks them (:mod:`~pyspark_shuffle.tasks.arrow_functions`)
    read two: ``assign_columns_by_name`` and ``large_var_types``."""

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
        """The settings of ``spark`` now, with Spark's defaults (a key this Spark lacks: false)."""
        legacy, sql = "spark.sql.legacy.execution.pandas", "spark.sql.execution"
        return cls(
            timezone=str(spark.conf.get("spark.sql.session.timeZone")),
            assign_columns_by_name=session_flag(spark, f"{legacy}.groupedMap.assignColumnsByName"),
            safe_conversion=session_flag(spark, f"{sql}.pandas.convertToArrowArraySafely"),
            int_to_decimal=session_flag(
                spark, f"{sql}.pythonUDF.pandas.intToDecimalCoercionEnabled"
            ),
            prefer_int_extension=session_flag(
                spark, f"{sql}.pythonUDF.pandas.preferIntExtensionDtype"
            ),
            large_var_types=session_flag(spark, f"{sql}.arrow.useLargeVarTypes"),
        )


def _frame(table: pa.Table, settings: PandasSettings) -> pd.DataFrame:
    return pandas_group(
        table, timezone=settings.timezone, prefer_int_extension=settings.prefer_int_extension
    )


def _key(frame: pd.DataFrame, keys: Sequence[str]) -> tuple[Any, ...]:
    """As Spark hands a key to a function: the key columns' values in the first row."""
    return tuple(frame[name].iloc[0] for name in keys)


def _result_table(result: Any, schema: StructType, settings: PandasSettings) -> pa.Table:
    """What the function returned, checked and converted to ``schema`` as Spark does."""
    check_pandas_result(result, schema, by_name=settings.assign_columns_by_name)
    batch = pandas_result_batch(
        result,
        schema,
        timezone=settings.timezone,
        safecheck=settings.safe_conversion,
        by_name=settings.assign_columns_by_name,
        int_to_decimal=settings.int_to_decimal,
        large_var_types=settings.large_var_types,
    )
    return pa.Table.from_batches([batch])


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
        frame = _frame(table, self.settings)
        if self.pass_key:
            result = self.function(_key(frame, self.keys), frame)
        else:
            result = self.function(frame)
        return _result_table(result, self.schema, self.settings)


@dataclass(frozen=True, slots=True)
class PandasCogroupFunction:
    """A pandas function of two frames as an Arrow one, as Spark's
    ``cogroup().applyInPandas`` runs it: each side's table of a key in (empty, with that
    side's columns, where it has no rows), the result's table out.

    The function takes the left and the right frame and, where it takes three parameters,
    the key first: the left frame's first row's key values, or the right's where the left
    has no rows (numpy scalars, as Spark's). Its result is checked and converted as
    :class:`PandasGroupFunction`'s is. Called with the two tables only: it takes the key
    itself, so ``cogroup_apply`` passes none."""

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
        pass_key = len(getfullargspec(marked.function).args) == 3  # as Spark decides
        return cls(marked.function, tuple(keys), schema, settings, pass_key)

    def __call__(self, left: pa.Table, right: pa.Table) -> pa.Table:
        left_frame, right_frame = _frame(left, self.settings), _frame(right, self.settings)
        if self.pass_key:
            keyed = right_frame if left_frame.empty else left_frame
            result = self.function(_key(keyed, self.keys), left_frame, right_frame)
        else:
            result = self.function(left_frame, right_frame)
        return _result_table(result, self.schema, self.settings)
