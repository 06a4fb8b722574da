"""Consumer tasks with skewed subpartitions split across producer ranges, after Flink 2.x's
adaptive skew handling (reference, section 6).

A subpartition of an input is skewed when its bytes exceed
``max(median * factor, threshold_bytes)`` over that input's subpartitions. A skewed
subpartition of an input whose producers may be divided is read by several tasks, each over a
contiguous range of those producers; the other inputs are read whole by each of those tasks
(replicated), so a join still meets every pair of rows exactly once.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy
import numpy.typing

from scheduling.parallelism import ParallelismBounds, ranges_by_bytes, ranges_by_bytes_in_runs
from scheduling.producer_bytes import MatrixBytes, ProducerBytes
from shuffle_api import ConfigError, InvalidOperationError, SubpartitionRange

__all__ = [
    "ConsumerPlan",
    "ConsumerTask",
    "InputSlice",
    "ProducerRange",
    "SkewOptions",
    "plan_consumers",
]

_Matrix = numpy.typing.NDArray[numpy.int64]


@dataclass(frozen=True, slots=True)
class ProducerRange:
    """An inclusive range ``[start, end]`` of producer (map task) indexes."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if self.start < 0 or self.end < self.start:
            raise InvalidOperationError(
                f"invalid producer range [{self.start}, {self.end}]: need 0 <= start <= end"
            )

    def __len__(self) -> int:
        return self.end - self.start + 1

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.end + 1))


@dataclass(frozen=True, slots=True)
class InputSlice:
    """What one consumer task reads of one input: these subpartitions of these producers."""

    subpartitions: SubpartitionRange
    producers: ProducerRange


@dataclass(frozen=True, slots=True)
class ConsumerTask:
    """One consumer task: one slice per input, in input order, and the bytes it reads."""

    inputs: tuple[InputSlice, ...]
    bytes: int

    def __post_init__(self) -> None:
        if not self.inputs:
            raise InvalidOperationError("a consumer task reads at least one input")
        if self.bytes < 0:
            raise InvalidOperationError(f"a consumer task cannot read {self.bytes} bytes")


@dataclass(frozen=True, slots=True)
class SkewOptions:
    """A subpartition is skewed when its bytes > ``max(median * factor, threshold_bytes)``."""

    factor: float = 4.0
    threshold_bytes: int = 256 << 20

    def __post_init__(self) -> None:
        if not (math.isfinite(self.factor) and self.factor > 0):
            raise ConfigError(f"SkewOptions.factor must be finite and > 0, got {self.factor!r}")
        if isinstance(self.threshold_bytes, bool) or not isinstance(self.threshold_bytes, int):
            raise ConfigError(
                f"SkewOptions.threshold_bytes must be an int, got {self.threshold_bytes!r}"
            )
        if self.threshold_bytes < 0:
            raise ConfigError(
                f"SkewOptions.threshold_bytes must be >= 0, got {self.threshold_bytes}"
            )


@dataclass(frozen=True, slots=True)
class ConsumerPlan:
    """The consumer tasks, ordered by subpartition; ``skewed``: subpartitions split over
    several tasks; ``unsplittable``: subpartitions detected as skewed that could not be split
    down to the target (the two may overlap: a split that still leaves one producer's slice
    above the target is in both)."""

    tasks: tuple[ConsumerTask, ...]
    skewed: tuple[int, ...]
    unsplittable: tuple[int, ...]


def plan_consumers(
    inputs: Sequence[ProducerBytes | _Matrix],
    bounds: ParallelismBounds,
    *,
    skew: SkewOptions | None,
    splittable: Sequence[bool],
) -> ConsumerPlan:
    """Consumer tasks for inputs of ``(producers, subpartitions)`` bytes (matrices, or
    ``ProducerBytes`` that hold less).

    Without ``skew``: one task per range of :func:`ranges_by_bytes` over the bytes per
    subpartition summed over all inputs, reading that range of every producer.

    With ``skew``: per input, skewed subpartitions are detected on its own totals, and its
    target is ``max(bytes_per_task, mean of its non-skewed subpartitions)``. A subpartition
    skewed in a ``splittable`` input has that input's producers cut greedily into contiguous
    slices of about the target; if several inputs are cut there, its tasks are the Cartesian
    product of their slices, and every other input is read whole by each of them. A detected
    subpartition that is not split (no splittable skewed input, or all its bytes in one
    producer) is a task on its own: it is heavy, so nothing is merged into it.

    The other subpartitions are coalesced as :func:`ranges_by_bytes` does, within the runs
    between detected ones, and the bisection counts the tasks of detected subpartitions toward
    ``[min, max]`` (so the runs get ``[min - fixed, max - fixed]``): ``max`` usually stands for
    the slots there are, and split tasks occupy slots too. Splits are never undone to respect
    ``max``: when they (plus one range per run) already exceed it, the rest is coalesced as far
    as it goes and the total exceeds ``max_parallelism``.
    """
    sources = _checked_inputs(inputs, splittable)
    producers = [source.shape[0] for source in sources]
    totals = [source.subpartition_totals() for source in sources]
    combined = [int(value) for value in numpy.vstack(totals).sum(axis=0).tolist()]

    if skew is None:
        tasks = tuple(
            _whole_task(producers, combined, subpartitions)
            for subpartitions in ranges_by_bytes(combined, bounds)
        )
        return ConsumerPlan(tasks=tasks, skewed=(), unsplittable=())

    skewed_masks = [_skewed_mask(total, skew) for total in totals]
    targets = [
        _target(total, mask, bounds) for total, mask in zip(totals, skewed_masks, strict=True)
    ]
    detected = [int(k) for k in numpy.flatnonzero(numpy.logical_or.reduce(skewed_masks))]
    # Every producer's bytes at the detected subpartitions only, of each input.
    columns = [source.columns(detected) for source in sources] if detected else []

    tasks_at: dict[int, list[ConsumerTask]] = {}
    split: list[int] = []
    unsplittable: list[int] = []
    for at, k in enumerate(detected):
        at_k = [input_columns[:, at] for input_columns in columns]
        # Per input: the producer slices it is read in at k (whole unless it is cut).
        slices = [[ProducerRange(0, count - 1)] for count in producers]
        cut_any = False
        too_big = False
        for i, column in enumerate(at_k):
            if not (skewed_masks[i][k] and splittable[i]):
                continue
            cut_any = True
            too_big = too_big or bool((column > targets[i]).any())
            slices[i] = _producer_slices(column, targets[i])
        if not cut_any or too_big:
            unsplittable.append(k)
        tasks_at[k] = [_sliced_task(at_k, k, chosen) for chosen in itertools.product(*slices)]
        if len(tasks_at[k]) > 1:
            split.append(k)

    runs = _runs_between(detected, len(combined))
    fixed = sum(len(tasks) for tasks in tasks_at.values())
    for subpartitions in ranges_by_bytes_in_runs(combined, runs, bounds, fixed_tasks=fixed):
        tasks_at[subpartitions.start] = [_whole_task(producers, combined, subpartitions)]

    ordered = tuple(task for start in sorted(tasks_at) for task in tasks_at[start])
    return ConsumerPlan(tasks=ordered, skewed=tuple(split), unsplittable=tuple(unsplittable))


def _checked_inputs(
    inputs: Sequence[ProducerBytes | _Matrix], splittable: Sequence[bool]
) -> list[ProducerBytes]:
    if not inputs:
        raise InvalidOperationError("no inputs: need at least one to plan consumers")
    if len(splittable) != len(inputs):
        raise InvalidOperationError(
            f"splittable has {len(splittable)} entries for {len(inputs)} inputs"
        )
    sources: list[ProducerBytes] = []
    for i, given in enumerate(inputs):
        source = given if isinstance(given, ProducerBytes) else _checked_matrix(i, given)
        shape = source.shape
        if shape[0] < 1 or shape[1] < 1:
            raise InvalidOperationError(
                f"input {i} has shape {shape}: need at least one producer and subpartition"
            )
        if sources and shape[1] != sources[0].shape[1]:
            raise InvalidOperationError(
                f"input {i} has {shape[1]} subpartitions, input 0 has {sources[0].shape[1]}"
            )
        sources.append(source)
    return sources


def _checked_matrix(i: int, matrix: object) -> MatrixBytes:
    if not isinstance(matrix, numpy.ndarray) or matrix.ndim != 2:
        raise InvalidOperationError(
            f"input {i} must be a 2-d array (producers, subpartitions), got {matrix!r:.80}"
        )
    if not numpy.issubdtype(matrix.dtype, numpy.integer):
        raise InvalidOperationError(f"input {i} must hold integer bytes, got {matrix.dtype}")
    if (matrix < 0).any():
        raise InvalidOperationError(f"input {i} holds negative bytes")
    return MatrixBytes(matrix.astype(numpy.int64, copy=False))


def _skewed_mask(totals: _Matrix, skew: SkewOptions) -> numpy.typing.NDArray[numpy.bool_]:
    threshold = max(float(numpy.median(totals)) * skew.factor, float(skew.threshold_bytes))
    return totals > threshold


def _target(
    totals: _Matrix, mask: numpy.typing.NDArray[numpy.bool_], bounds: ParallelismBounds
) -> int:
    normal = totals[~mask]
    # The mean of the normal subpartitions: a split slice should weigh about as much as a
    # normal task; never below bytes_per_task, so small data is not shredded.
    mean = int(normal.sum()) // len(normal) if len(normal) else 0
    return max(bounds.bytes_per_task, mean)


def _producer_slices(column: _Matrix, target: int) -> list[ProducerRange]:
    """Contiguous producer ranges with about ``target`` bytes each (greedy). Unlike
    subpartition ranges, a slice only starts at a producer with data: an empty slice would
    still read every replicated input whole, for nothing."""
    slices: list[ProducerRange] = []
    start, size = 0, 0
    for producer, value in enumerate(column.tolist()):
        if size > 0 and value > 0 and size + value > target:
            slices.append(ProducerRange(start, producer - 1))
            start, size = producer, 0
        size += value
    slices.append(ProducerRange(start, len(column) - 1))
    return slices


def _runs_between(detected: list[int], subpartitions: int) -> list[SubpartitionRange]:
    runs: list[SubpartitionRange] = []
    start = 0
    for k in [*detected, subpartitions]:
        if k > start:
            runs.append(SubpartitionRange(start, k - 1))
        start = k + 1
    return runs


def _whole_task(
    producers: list[int], combined: list[int], subpartitions: SubpartitionRange
) -> ConsumerTask:
    return ConsumerTask(
        inputs=tuple(InputSlice(subpartitions, ProducerRange(0, count - 1)) for count in producers),
        bytes=sum(combined[subpartitions.start : subpartitions.end + 1]),
    )


def _sliced_task(at_k: list[_Matrix], k: int, producers: tuple[ProducerRange, ...]) -> ConsumerTask:
    """The task reading ``producers`` of each input at ``k`` (``at_k``: each input's bytes
    there, by producer)."""
    return ConsumerTask(
        inputs=tuple(InputSlice(SubpartitionRange.single(k), chosen) for chosen in producers),
        bytes=sum(
            int(column[chosen.start : chosen.end + 1].sum())
            for column, chosen in zip(at_k, producers, strict=True)
        ),
    )
