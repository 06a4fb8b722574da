"""Sorting Arrow data the way Spark orders rows: nulls first ascending, last descending."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pyspark_shuffle.kernels.ordered_bytes import is_nested, ordered_bytes
from shuffle_api import InvalidOperationError
from shuffle_runtime.ndarrays import arrow_array, numpy_values

__all__ = ["SortKey", "sort_indices", "sort_keys_of"]


@dataclass(frozen=True, slots=True)
class SortKey:
    column: str
    ascending: bool = True


def sort_keys_of(columns: Sequence[str], ascending: bool | Sequence[bool]) -> tuple[SortKey, ...]:
    """Pair each column with its direction (one flag for all, or one per column)."""
    if isinstance(ascending, bool):
        directions = [ascending] * len(columns)
    else:
        directions = list(ascending)
        if len(directions) != len(columns):
            raise InvalidOperationError(
                f"{len(columns)} sort columns but {len(directions)} ascending flags"
            )
    if not columns:
        raise InvalidOperationError("sorting needs at least one column")
    return tuple(SortKey(column, up) for column, up in zip(columns, directions, strict=True))


def sort_indices(table: pa.Table, keys: Sequence[SortKey]) -> pa.Array:
    """Stable sort order of ``table`` by ``keys``.

    Spark treats null as the smallest value (first ascending, last descending) and NaN as the
    largest; Arrow's null placement is one setting for all keys and it puts NaN last in both
    directions, so a key with nulls is preceded by its validity flag, a float key by its NaN flag.
    """
    for key in keys:
        if key.column not in table.column_names:
            raise InvalidOperationError(
                f"no column {key.column!r} to sort by; columns: {table.column_names}"
            )
    if len(keys) == 1 and keys[0].ascending:
        values = table.column(keys[0].column)
        if values.null_count == 0 and (
            pa.types.is_integer(values.type) or pa.types.is_temporal(values.type)
        ):
            # numpy's stable sort of integers is a radix sort: several times Arrow's.
            numbers = numpy_values(values.combine_chunks())
            return arrow_array(np.argsort(numbers, kind="stable"))
    columns: dict[str, pa.ChunkedArray] = {}
    order: list[tuple[str, str]] = []
    for number, key in enumerate(keys):
        direction = "ascending" if key.ascending else "descending"
        values = table.column(key.column)
        if values.null_count:
            columns[f"valid{number}"] = pc.is_valid(values)
            order.append((f"valid{number}", direction))
        if pa.types.is_floating(values.type):
            # Spark orders NaN above every other value; Arrow puts NaN last in both directions.
            columns[f"nan{number}"] = pc.and_kleene(pc.is_nan(values), pc.is_valid(values))
            order.append((f"nan{number}", direction))
        # Structs and arrays: as bytes in Spark's order (nulls inside first, ascending).
        columns[f"value{number}"] = ordered_bytes(values) if is_nested(values.type) else values
        order.append((f"value{number}", direction))
    indices: pa.Array = pc.sort_indices(pa.table(columns), sort_keys=order)
    return indices
