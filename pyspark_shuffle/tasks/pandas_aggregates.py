"""Grouped-aggregate pandas UDFs per key group, run as Spark's ``groupBy(keys).agg(udf(col),
...)`` runs them: each UDF gets its argument columns of the group as pandas Series (converted
as Spark's Python worker converts them) and returns one value, converted to the UDF's declared
type as Spark converts it, with its errors.

:class:`PandasGroupAggregation` is the function of a reducer's whole partition, its rows
sorted by key (``SparkShuffle.group_apply_sorted``): the columns are converted once per
reducer and each group is a slice of them, so a small group costs a UDF call and little else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.types import StructField, StructType

from pyspark_shuffle.kernels.operations import group_ids
from pyspark_shuffle.spark.compat import spark_arrow_schema
from pyspark_shuffle.spark.internals import pandas_group, pandas_result_batch
from pyspark_shuffle.tasks.pandas_functions import PandasSettings

__all__ = ["PandasAggregate", "PandasGroupAggregation"]


@dataclass(frozen=True, slots=True)
class PandasAggregate:
    """One grouped-aggregate pandas UDF: ``function(*series)`` of the ``arguments`` columns."""

    function: Callable[..., Any]
    arguments: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PandasGroupAggregation:
    """Per key group of a partition sorted by ``keys``: one row of the keys (where ``schema``
    keeps them, Spark's ``spark.sql.retainGroupColumns``) and each aggregate's value, named and
    typed as ``schema`` (the schema Spark gives the ``agg``) says."""

    keys: tuple[str, ...]
    aggregates: tuple[PandasAggregate, ...]
    schema: StructType
    settings: PandasSettings

    @property
    def keeps_keys(self) -> bool:
        return len(self.schema.fields) == len(self.keys) + len(self.aggregates)

    def __call__(self, table: pa.Table) -> pa.Table:
        ids, _ = group_ids(table, self.keys)
        starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
        ends = np.r_[starts[1:], table.num_rows]
        arguments = sorted({name for each in self.aggregates for name in each.arguments})
        settings = self.settings
        frame = pandas_group(
            table.select(arguments),
            timezone=settings.timezone,
            prefer_int_extension=settings.prefer_int_extension,
        )
        columns = {name: frame[name] for name in arguments}
        values = [self._values(each, columns, starts, ends) for each in self.aggregates]
        # Named by position, as Spark's worker names the UDFs' results (its conversion errors
        # say "the column '_0'"); the schema's names go on at the end.
        value_fields = [
            StructField(f"_{index}", field.dataType, field.nullable)
            for index, field in enumerate(
                self.schema.fields[len(self.schema.fields) - len(self.aggregates) :]
            )
        ]
        batch = pandas_result_batch(
            _frame_of(dict(zip([field.name for field in value_fields], values, strict=True))),
            StructType(value_fields),
            timezone=settings.timezone,
            safecheck=settings.safe_conversion,
            by_name=True,
            int_to_decimal=settings.int_to_decimal,
            large_var_types=settings.large_var_types,
        )
        output = spark_arrow_schema(
            self.schema, timezone="UTC", prefers_large_types=settings.large_var_types
        )
        kept = table.select(list(self.keys)).take(starts).columns if self.keeps_keys else []
        return pa.Table.from_arrays([*kept, *batch.columns], schema=output)

    @staticmethod
    def _values(
        aggregate: PandasAggregate,
        columns: dict[str, Any],
        starts: np.ndarray[Any, Any],
        ends: np.ndarray[Any, Any],
    ) -> list[Any]:
        series = [columns[name] for name in aggregate.arguments]
        # A slice of each column's values as a Series of its own: indexed from 0, as the
        # Series Spark hands over are.
        return [
            aggregate.function(*(_slice(each, start, end) for each in series))
            for start, end in zip(starts.tolist(), ends.tolist(), strict=True)
        ]


def _slice(series: Any, start: int, end: int) -> Any:
    return type(series)(series.array[start:end], name=series.name, copy=False)


def _frame_of(columns: dict[str, list[Any]]) -> Any:
    """The values as a frame, a column per UDF, each of the dtype pandas infers for its values
    (as for Spark's ``pd.Series([value])`` of each; a list stays one list in its cell)."""
    import pandas as pd  # noqa: PLC0415 (loaded only in the workers of pandas functions)

    return pd.DataFrame({name: pd.Series(values) for name, values in columns.items()})
