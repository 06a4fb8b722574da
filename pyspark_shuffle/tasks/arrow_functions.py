"""Users' Arrow functions per key group, run as Spark's ``groupBy(keys).applyInArrow(f,
schema)`` and ``groupBy(keys).cogroup(...).applyInArrow(f, schema)`` run them: the same tables
and key in, the same checks of what comes out, the same errors.

:meth:`SparkShuffle.group_apply <pyspark_shuffle.SparkShuffle.group_apply>` and
:meth:`~pyspark_shuffle.SparkShuffle.cogroup_apply` trust an Arrow function: what it returns
is cast to the declared schema. A caller that must fail where Spark fails (the drop-in for
``applyInArrow``) wraps the function on the driver, ``ArrowGroupFunction.of(f, keys, schema,
PandasSettings.of(spark))`` (:class:`ArrowCogroupFunction` for a cogroup), and passes the
wrapper as the function. The wrapper takes the key itself, as Spark decides (by ``f``'s
parameters), and takes only the table (the two tables), so those operations pass it none:
they tell a function that wants the key by its parameter count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from inspect import getfullargspec
from typing import Any, Self

import pyarrow as pa
from pyspark.sql.types import StructType

from pyspark_shuffle.spark.internals import arrow_result, arrow_result_schema
from pyspark_shuffle.tasks.pandas_functions import PandasSettings

__all__ = ["ArrowCogroupFunction", "ArrowGroupFunction"]


def _as_spark_hands_it(table: pa.Table) -> pa.Table:
    """``table`` as Spark hands it to the function: every column nullable (Spark's schema of
    it says nothing of the data at the top; nested flags stay), with no copy."""
    if not any(not field.nullable for field in table.schema):
        return table
    schema = pa.schema([field.with_nullable(True) for field in table.schema])
    return pa.Table.from_arrays(table.columns, schema=schema)


def _key(table: pa.Table, keys: Sequence[str]) -> tuple[pa.Scalar, ...]:
    """As Spark hands a key to the function: the key columns' values in the first row."""
    return tuple(table.column(name)[0] for name in keys)


def _as_handed(table: pa.Table, key_only: tuple[str, ...]) -> pa.Table:
    """``table`` as the function gets it: without the columns that only carry a key, every
    column nullable."""
    return _as_spark_hands_it(table.drop_columns(list(key_only)) if key_only else table)


@dataclass(frozen=True, slots=True)
class ArrowGroupFunction:
    """An Arrow function of a group, ``f(table)`` or ``f(key, table)``, whose result is
    checked as Spark checks it: a ``pyarrow.Table`` of the declared columns (by name, or by
    position where ``spark.sql.legacy.execution.pandas.groupedMap.assignColumnsByName`` is
    false) of exactly the declared Arrow types (timestamps in UTC), or a table of no rows and
    no columns. Wrong results fail with the error class and message of this release's
    ``applyInArrow`` (:func:`~pyspark_shuffle.spark.internals.arrow_result`)."""

    function: Callable[..., Any]
    keys: tuple[str, ...]
    expected: pa.Schema
    """The result's Arrow types, as this release's Spark expects them."""
    by_name: bool
    pass_key: bool
    key_only: tuple[str, ...]

    @classmethod
    def of(
        cls,
        function: Callable[..., Any],
        keys: Sequence[str],
        schema: StructType,
        settings: PandasSettings,
        key_only: Sequence[str] = (),
    ) -> Self:
        """``function`` (one parameter, or two with the key first: Spark's test of its named
        positional ones) declared ``schema``, under the session's ``settings``; ``key_only``:
        columns that carry a key but are not the frame's (a key expression's values), never
        handed to it."""
        expected = arrow_result_schema(schema, large_var_types=settings.large_var_types)
        pass_key = len(getfullargspec(function).args) == 2
        by_name = settings.assign_columns_by_name
        return cls(function, tuple(keys), expected, by_name, pass_key, tuple(key_only))

    def __call__(self, table: pa.Table) -> pa.Table:
        handed = _as_handed(table, self.key_only)
        if self.pass_key:
            result = self.function(_key(table, self.keys), handed)
        else:
            result = self.function(handed)
        return arrow_result(result, self.expected, by_name=self.by_name)


@dataclass(frozen=True, slots=True)
class ArrowCogroupFunction:
    """An Arrow function of a cogroup, ``f(left, right)`` or ``f(key, left, right)`` (the key:
    the left rows' first, or the right's where the left has none), checked as
    :class:`ArrowGroupFunction` is. Called with the two tables only."""

    function: Callable[..., Any]
    keys: tuple[str, ...]
    expected: pa.Schema
    """The result's Arrow types, as this release's Spark expects them."""
    by_name: bool
    pass_key: bool
    key_only: tuple[str, ...]

    @classmethod
    def of(
        cls,
        function: Callable[..., Any],
        keys: Sequence[str],
        schema: StructType,
        settings: PandasSettings,
        key_only: Sequence[str] = (),
    ) -> Self:
        """``function`` (two parameters, or three with the key first, as Spark tells them)
        declared ``schema``, under the session's ``settings``; ``key_only``: columns
        that carry a key but are not the frame's (a key expression's values), never handed
        to it."""
        expected = arrow_result_schema(schema, large_var_types=settings.large_var_types)
        pass_key = len(getfullargspec(function).args) == 3
        by_name = settings.assign_columns_by_name
        return cls(function, tuple(keys), expected, by_name, pass_key, tuple(key_only))

    def __call__(self, left: pa.Table, right: pa.Table) -> pa.Table:
        handed = _as_handed(left, self.key_only), _as_handed(right, self.key_only)
        if self.pass_key:
            key = _key(left if left.num_rows else right, self.keys)
            result = self.function(key, *handed)
        else:
            result = self.function(*handed)
        return arrow_result(result, self.expected, by_name=self.by_name)
