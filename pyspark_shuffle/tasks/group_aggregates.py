"""Grouped-aggregate UDFs per key group, run as Spark's ``groupBy(keys).agg(udf(col), ...)``
runs them: each UDF gets its argument columns of the group and returns one value, converted to
the UDF's declared type as Spark converts it, with its errors.

- pandas UDFs: the arguments come as pandas Series (converted as Spark's Python worker converts
  them), the values go back as Spark converts a pandas result;
- Arrow UDFs (Spark 4.3 and later, whose worker makes each value a one-row array and enforces
  the declared types on it): the arguments come as ``pyarrow.Array`` slices.

:class:`GroupAggregation` is the function of a reducer's whole partition, its rows sorted by key
(``SparkShuffle.group_apply_sorted``): the columns are converted once per reducer and each
group is a slice of them, so a small group costs a UDF call and little else.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.types import StructField, StructType

from pyspark_shuffle.kernels.operations import group_bounds
from pyspark_shuffle.spark.compat import spark_arrow_schema
from pyspark_shuffle.spark.internals import (
    arrow_aggregates,
    pandas_group,
    pandas_result_batch,
)
from pyspark_shuffle.tasks.pandas_functions import PandasSettings

__all__ = ["GroupAggregate", "GroupAggregation"]

Bounds = list[tuple[int, int]]


@dataclass(frozen=True, slots=True)
class GroupAggregate:
    """One grouped-aggregate UDF: ``function(*columns)`` of the ``arguments`` columns."""

    function: Callable[..., Any]
    arguments: tuple[str, ...]


def _values(aggregate: GroupAggregate, columns: dict[str, Any], bounds: Bounds) -> list[Any]:
    """``aggregate``'s value of each group: the function of its columns' slices."""
    series = [columns[name] for name in aggregate.arguments]
    return [
        aggregate.function(*(_slice(each, start, end) for each in series)) for start, end in bounds
    ]


def _slice(column: Any, start: int, end: int) -> Any:
    if isinstance(column, pa.Array):
        return column.slice(start, end - start)
    # A pandas Series of its own, indexed from 0, as the Series Spark hands over are.
    return type(column)(column.array[start:end], name=column.name, copy=False)


def _positional_fields(schema: StructType, aggregates: int) -> list[StructField]:
    """The value fields of ``schema`` (its last ``aggregates``), named by position as Spark's
    worker names the UDFs' results (its conversion errors say "the column '_0'"); the schema's
    names go on at the end."""
    return [
        StructField(f"_{index}", field.dataType, field.nullable)
        for index, field in enumerate(schema.fields[len(schema.fields) - aggregates :])
    ]


def _keyed(
    table: pa.Table,
    keys: Sequence[str],
    bounds: Bounds,
    values: Sequence[pa.Array | pa.ChunkedArray],
    output: pa.Schema,
) -> pa.Table:
    """A row per group: its keys (where ``output`` has them: ``retainGroupColumns``), then
    the values."""
    kept: list[pa.ChunkedArray] = []
    if len(output) == len(keys) + len(values):
        starts = pa.array([start for start, _ in bounds], pa.int64())
        kept = table.select(list(keys)).take(starts).columns
    return pa.Table.from_arrays([*kept, *values], schema=output)


@dataclass(frozen=True, slots=True)
class GroupAggregation:
    """Per key group of a partition sorted by ``keys``: one row of the keys (where ``schema``
    keeps them, Spark's ``spark.sql.retainGroupColumns``) and each aggregate's value, named
    and typed as ``schema`` (the schema Spark gives the ``agg``) says. Pandas UDFs get their
    columns' slices as Series, converted and their values converted back as Spark's worker
    does under ``settings``; Arrow UDFs (``arrow``) get ``pyarrow.Array`` slices, and their
    values are enforced on the declared types as the 4.3 worker enforces them
    (``RESULT_COLUMN_TYPES_MISMATCH`` where they do not cast)."""

    keys: tuple[str, ...]
    aggregates: tuple[GroupAggregate, ...]
    schema: StructType
    settings: PandasSettings
    arrow: bool = False

    def __call__(self, table: pa.Table) -> pa.Table:
        table, bounds = group_bounds(table, self.keys)
        arguments = sorted({name for each in self.aggregates for name in each.arguments})
        columns = (
            # One array a column, as Spark concatenates a group's batches.
            {name: table.column(name).combine_chunks() for name in arguments}
            if self.arrow
            else self._series(table.select(arguments))
        )
        values = [_values(each, columns, bounds) for each in self.aggregates]
        value_fields = StructType(_positional_fields(self.schema, len(self.aggregates)))
        large_types = self.settings.large_var_types
        converted = (
            arrow_aggregates(
                values,
                spark_arrow_schema(value_fields, timezone="UTC", prefers_large_types=large_types),
            ).columns
            if self.arrow
            else self._from_pandas(values, value_fields)
        )
        output = spark_arrow_schema(self.schema, timezone="UTC", prefers_large_types=large_types)
        return _keyed(table, self.keys, bounds, converted, output)

    def _series(self, table: pa.Table) -> dict[str, Any]:
        settings = self.settings
        frame = pandas_group(
            table,
            timezone=settings.timezone,
            prefer_int_extension=settings.prefer_int_extension,
        )
        return {name: frame[name] for name in table.column_names}

    def _from_pandas(self, values: list[list[Any]], value_fields: StructType) -> list[pa.Array]:
        settings = self.settings
        batch = pandas_result_batch(
            _frame_of(dict(zip(value_fields.names, values, strict=True))),
            value_fields,
            timezone=settings.timezone,
            safecheck=settings.safe_conversion,
            by_name=True,
            int_to_decimal=settings.int_to_decimal,
            large_var_types=settings.large_var_types,
        )
        return list(batch.columns)


def _frame_of(columns: dict[str, list[Any]]) -> Any:
    """The values as a frame, a column per UDF, each of the dtype pandas infers for its values
    (as for Spark's ``pd.Series([value])`` of each; a list stays one list in its cell)."""
    import pandas as pd  # noqa: PLC0415 (loaded only in the workers of pandas functions)

    return pd.DataFrame({name: pd.Series(values) for name, values in columns.items()})
