"""A plain-Python reference of Spark's semantics (NaN equals NaN, -0.0 equals 0.0, nulls
first and NaN last), for the tests of ``pyspark_shuffle.kernels``."""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Any

from pyspark_shuffle.kernels.sorting import SortKey

NAN = float("nan")


def _canonical(value: object) -> Hashable:
    """A hashable stand-in equal for values Spark considers equal in a result (NaN = NaN)."""
    if isinstance(value, float) and math.isnan(value):
        return ("NaN",)
    if isinstance(value, float) and value == 0.0:
        return 0.0
    if isinstance(value, list):
        return tuple(_canonical(each) for each in value)
    if isinstance(value, dict):
        return tuple(sorted((key, _canonical(each)) for key, each in value.items()))
    return value


def _spark_key(row: dict[str, Any], keys: Sequence[SortKey]) -> tuple[Any, ...]:
    """Spark's order for a row: null smallest, NaN largest; descending negates the rank."""
    parts: list[Any] = []
    for key in keys:
        value = row[key.column]
        if value is None:
            rank: tuple[Any, ...] = (0,)
        elif isinstance(value, float) and math.isnan(value):
            rank = (2,)
        else:
            rank = (1, value)
        parts.append(_Ordered(rank, key.ascending))
    return tuple(parts)


class _Ordered:
    def __init__(self, rank: tuple[Any, ...], ascending: bool) -> None:
        self.rank, self.ascending = rank, ascending

    def __lt__(self, other: _Ordered) -> bool:
        return self.rank < other.rank if self.ascending else other.rank < self.rank

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Ordered) and self.rank == other.rank

    def __hash__(self) -> int:
        return hash(self.rank)
