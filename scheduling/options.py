"""Options of the scheduler logic (keys under ``scheduling.``)."""

from __future__ import annotations

from typing import Any, Final

from shuffle_api.config import ConfigOption, float_option, int_option, memory_option

__all__ = [
    "DESCRIPTOR_OFFLOAD_THRESHOLD",
    "SCHEDULING_OPTIONS",
    "SKEW_FACTOR",
    "SKEW_THRESHOLD",
]

DESCRIPTOR_OFFLOAD_THRESHOLD = int_option(
    "scheduling.descriptors.offload-threshold",
    2048 * 2048,
    "A consumed group's compressed descriptor list goes to the blob store, and its consumers"
    " carry only the blob's key, when partitions x consumers reaches this (Flink's default).",
    minimum=1,
)
SKEW_FACTOR = float_option(
    "scheduling.skew.factor",
    4.0,
    "A subpartition is skewed when its bytes exceed this many times the median subpartition"
    " (and scheduling.skew.threshold).",
    minimum=1.0,
)
SKEW_THRESHOLD = memory_option(
    "scheduling.skew.threshold",
    256 << 20,
    "A subpartition smaller than this is never treated as skewed (Flink's and Spark's default).",
    minimum=0,
)

SCHEDULING_OPTIONS: Final[tuple[ConfigOption[Any], ...]] = (
    DESCRIPTOR_OFFLOAD_THRESHOLD,
    SKEW_FACTOR,
    SKEW_THRESHOLD,
)
