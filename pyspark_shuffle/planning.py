"""How many reducers, and which subpartitions each reads."""

from __future__ import annotations

from collections.abc import Sequence

from shuffle_api import SubpartitionRange

__all__ = ["coalesce_subpartitions", "one_per_subpartition"]


def one_per_subpartition(subpartitions: int) -> tuple[SubpartitionRange, ...]:
    return tuple(SubpartitionRange.single(index) for index in range(subpartitions))


def coalesce_subpartitions(
    bytes_per_subpartition: Sequence[int], target_bytes: int, *, parallelism: int = 1
) -> tuple[SubpartitionRange, ...]:
    """Neighbouring subpartitions merged while a reducer stays within ``target_bytes``
    (Spark AQE's coalescing), lowered so that there are about ``parallelism`` reducers when
    the data allows (AQE's parallelism-first). Neighbours only, so range-partitioned data
    stays in order; at least one reducer, even with no data."""
    total = sum(bytes_per_subpartition)
    target_bytes = max(1, min(target_bytes, -(-total // max(1, parallelism))))
    ranges: list[SubpartitionRange] = []
    start, size = 0, 0
    for index, subpartition_bytes in enumerate(bytes_per_subpartition):
        if index > start and size + subpartition_bytes > target_bytes:
            ranges.append(SubpartitionRange(start, index - 1))
            start, size = index, 0
        size += subpartition_bytes
    ranges.append(SubpartitionRange(start, max(start, len(bytes_per_subpartition) - 1)))
    return tuple(ranges)
