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

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from inspect import getfullargspec
from typing import TYPE_CHECKING, Any, Final, Self

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from pyspark_shuffle.kernels.operations import cogroup_ids, group_bounds
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
    "PandasCogroupsFunction",
    "PandasFunction",
    "PandasGroupFunction",
    "PandasGroupsFunction",
    "PandasSettings",
    "pandas_function",
]


@dataclass(frozen=True, slots=True)
class PandasFunction:
    """A function of pandas frames, ``f(pdf)`` or ``f(key, pdf)`` as Spark's
    ``applyInPandas`` takes it, marked by :func:`pandas_function`."""

    function: Callable[..., Any]
    key_only: tuple[str, ...] = ()
    """Columns that carry a key but are not the frame's (the values of a key expression):
    read for the key, never handed to the function."""


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


def _as_handed(frame: pd.DataFrame, key_only: tuple[str, ...]) -> pd.DataFrame:
    """``frame`` without the columns that only carry a key."""
    return frame.drop(columns=list(key_only)) if key_only else frame


def _result_table(result: Any, schema: StructType, settings: PandasSettings) -> pa.Table:
    """What the function returned, checked and converted to ``schema`` as Spark does."""
    check_pandas_result(result, schema, by_name=settings.assign_columns_by_name)
    return _converted(result, schema, settings)


def _converted(result: pd.DataFrame, schema: StructType, settings: PandasSettings) -> pa.Table:
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
    key_only: tuple[str, ...]

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
        return cls(marked.function, tuple(keys), schema, settings, pass_key, marked.key_only)

    def __call__(self, table: pa.Table) -> pa.Table:
        return _result_table(self.called(_frame(table, self.settings)), self.schema, self.settings)

    def called(self, frame: pd.DataFrame) -> Any:
        """What the function returns for a group's frame."""
        handed = _as_handed(frame, self.key_only)
        if self.pass_key:
            return self.function(_key(frame, self.keys), handed)
        return self.function(handed)


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
    key_only: tuple[str, ...]

    @classmethod
    def of(
        cls,
        marked: PandasFunction,
        keys: Sequence[str],
        schema: StructType,
        settings: PandasSettings,
    ) -> Self:
        pass_key = len(getfullargspec(marked.function).args) == 3  # as Spark decides
        return cls(marked.function, tuple(keys), schema, settings, pass_key, marked.key_only)

    def __call__(self, left: pa.Table, right: pa.Table) -> pa.Table:
        left_frame, right_frame = _frame(left, self.settings), _frame(right, self.settings)
        return _result_table(self.called(left_frame, right_frame), self.schema, self.settings)

    def called(self, left: pd.DataFrame, right: pd.DataFrame) -> Any:
        """What the function returns for a key's two frames."""
        handed = _as_handed(left, self.key_only), _as_handed(right, self.key_only)
        if self.pass_key:
            keyed = right if left.empty else left
            return self.function(_key(keyed, self.keys), *handed)
        return self.function(*handed)


_CHUNK_ROWS: Final = 1 << 16
"""Rows of a reducer converted to pandas at once, and result rows converted back at once:
enough that the conversions' fixed costs vanish, few enough to bound a reducer's memory."""


def _sliceable(table: pa.Table, settings: PandasSettings) -> bool:
    """Whether a run of groups converted at once and sliced hands each group the frame it
    alone would get: not where an integer or boolean column has nulls (a group without them
    gets integers and booleans, one with them floats and objects), nor for nested or
    dictionary columns (left alone)."""
    for column in table.columns:
        data_type = column.type
        if pa.types.is_nested(data_type) or pa.types.is_dictionary(data_type):
            return False
        if column.null_count and (
            pa.types.is_boolean(data_type)
            or (pa.types.is_integer(data_type) and not settings.prefer_int_extension)
        ):
            return False
    return True


@dataclass(frozen=True, slots=True)
class PandasGroupsFunction:
    """``group``'s function over every group of a reducer's rows sorted by key: what
    ``group_apply`` runs for a pandas function. Each group gets the frame, key and checks
    :class:`PandasGroupFunction` gives it, for less: the rows are converted to pandas a run of
    groups at a time and each group's frame is a slice of them (indexed from 0, as Spark's),
    and results of equal dtypes are converted back to Arrow together. A run whose
    conversion fails is converted again result by result, so that the error raised is the
    one Spark raises for that result."""

    group: PandasGroupFunction

    def __call__(self, table: pa.Table) -> Iterator[pa.RecordBatch]:
        group, settings = self.group, self.group.settings
        table, bounds = group_bounds(table, group.keys)
        if not _sliceable(table, settings):
            for start, end in bounds:
                yield from group(table.slice(start, end - start)).to_batches()
            return
        results = _ResultRuns(group.schema, settings)
        run_start = 0
        for index, (_, end) in enumerate(bounds):
            last = index == len(bounds) - 1
            if end - bounds[run_start][0] < _CHUNK_ROWS and not last:
                continue
            first_row = bounds[run_start][0]
            frame = _frame(table.slice(first_row, end - first_row), settings)
            for group_start, group_end in bounds[run_start : index + 1]:
                rows = frame.iloc[group_start - first_row : group_end - first_row]
                yield from results.add(group.called(rows.reset_index(drop=True)))
            run_start = index + 1
        yield from results.flush()


class _ResultRuns:
    """Results checked one by one as Spark checks them, aligned to the schema's columns and
    gathered while their dtypes agree, then converted together."""

    def __init__(self, schema: StructType, settings: PandasSettings) -> None:
        self._schema, self._settings = schema, settings
        self._names = list(schema.names)
        self._frames: list[pd.DataFrame] = []
        self._dtypes: tuple[Any, ...] = ()
        self._rows = 0

    def add(self, result: Any) -> Iterator[pa.RecordBatch]:
        check_pandas_result(result, self._schema, by_name=self._settings.assign_columns_by_name)
        aligned = self._aligned(result)
        if aligned is None:  # not of the common shape: converted alone
            yield from _converted(result, self._schema, self._settings).to_batches()
            return
        if len(aligned) == 0:
            return
        dtypes = tuple(aligned.dtypes)
        if self._frames and (dtypes != self._dtypes or self._rows >= _CHUNK_ROWS):
            yield from self.flush()
        self._frames.append(aligned)
        self._dtypes = dtypes
        self._rows += len(aligned)

    def _aligned(self, result: pd.DataFrame) -> pd.DataFrame | None:
        """The result's columns in the schema's order under its names, as Spark takes them
        (by name where a label is a string and the setting says so, else by position); None
        for a result with no columns or with repeated labels."""
        labels = result.columns
        if len(labels) == 0 or labels.has_duplicates:
            return None if len(result) else result
        if self._settings.assign_columns_by_name and any(isinstance(x, str) for x in labels):
            return result[self._names]
        return result.iloc[:, : len(self._names)].set_axis(self._names, axis=1)

    def flush(self) -> Iterator[pa.RecordBatch]:
        frames, self._frames, self._rows = self._frames, [], 0
        if not frames:
            return
        import pandas  # noqa: PLC0415 (loaded only in the workers of pandas functions)

        try:
            together = _converted(
                pandas.concat(frames, ignore_index=True), self._schema, self._settings
            )
        except Exception:  # each result again: the error raised is the failing one's
            for frame in frames:
                yield from _converted(frame, self._schema, self._settings).to_batches()
            return
        yield from together.to_batches()


def _in_key_order(
    table: pa.Table, ids: npt.NDArray[np.int64], groups: int
) -> tuple[pa.Table, npt.NDArray[np.int64]]:
    """The side's rows gathered key by key (in key number order), and where each key's rows
    start (``groups + 1`` offsets)."""
    order = np.argsort(ids, kind="stable")
    offsets = np.searchsorted(ids[order], np.arange(groups + 1), side="left")
    return table.take(order), offsets


@dataclass(frozen=True, slots=True)
class PandasCogroupsFunction:
    """``cogroup``'s function over every key of a reducer's two sides: what ``cogroup_apply``
    runs for a pandas function, converting as :class:`PandasGroupsFunction` does (each side a
    run of keys at a time, each key's frames slices of them, results of equal dtypes back
    together), each key's frames, key and checks those :class:`PandasCogroupFunction` gives."""

    cogroup: PandasCogroupFunction

    def __call__(self, left: pa.Table, right: pa.Table) -> Iterator[pa.RecordBatch]:
        cogroup, settings = self.cogroup, self.cogroup.settings
        left_ids, right_ids, groups = cogroup_ids(left, right, cogroup.keys)
        left, left_offsets = _in_key_order(left, left_ids, groups)
        right, right_offsets = _in_key_order(right, right_ids, groups)
        if not (_sliceable(left, settings) and _sliceable(right, settings)):
            for key in range(groups):
                left_rows = left.slice(left_offsets[key], left_offsets[key + 1] - left_offsets[key])
                right_rows = right.slice(
                    right_offsets[key], right_offsets[key + 1] - right_offsets[key]
                )
                yield from cogroup(left_rows, right_rows).to_batches()
            return
        results = _ResultRuns(cogroup.schema, settings)
        first = 0
        for key in range(groups):
            rows = (left_offsets[key + 1] - left_offsets[first]) + (
                right_offsets[key + 1] - right_offsets[first]
            )
            if rows < _CHUNK_ROWS and key < groups - 1:
                continue
            sides = [
                (
                    _frame(
                        table.slice(offsets[first], offsets[key + 1] - offsets[first]), settings
                    ),
                    offsets,
                )
                for table, offsets in ((left, left_offsets), (right, right_offsets))
            ]
            for each in range(first, key + 1):
                left_frame, right_frame = (
                    frame.iloc[
                        offsets[each] - offsets[first] : offsets[each + 1] - offsets[first]
                    ].reset_index(drop=True)
                    for frame, offsets in sides
                )
                yield from results.add(cogroup.called(left_frame, right_frame))
            first = key + 1
        yield from results.flush()
