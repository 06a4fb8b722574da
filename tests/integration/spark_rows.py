"""Comparing Spark results as Spark does: row multisets (NaN equal to NaN, -0.0 to 0.0)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def canonical(value: object) -> Hashable:
    if isinstance(value, float) and math.isnan(value):
        return ("NaN",)
    if isinstance(value, float) and value == 0.0:
        return 0.0
    if isinstance(value, list | tuple):
        return tuple(canonical(each) for each in value)
    if isinstance(value, dict):
        return tuple((key, canonical(each)) for key, each in value.items())
    return value


def rows_of(frame: DataFrame) -> list[dict[str, Any]]:
    """The rows in the DataFrame's order, through Arrow (fast for lists and decimals)."""
    rows: list[dict[str, Any]] = frame.toArrow().to_pylist()
    return rows


def multiset(frame: DataFrame) -> Counter[Hashable]:
    return Counter(canonical(row) for row in rows_of(frame))


def ordered(frame: DataFrame) -> list[Hashable]:
    return [canonical(row) for row in rows_of(frame)]
