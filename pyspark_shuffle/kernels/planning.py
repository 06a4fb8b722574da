"""How many reducers, and what each reads of every shuffled input: one per subpartition, or
adaptive - chosen from the bytes each map task wrote per subpartition, with skewed
subpartitions split among reducers where the operation allows."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from pyspark_shuffle.options import REDUCER_MIN_COUNT, REDUCER_TARGET_SIZE
from scheduling.map_sizes import MapSizes
from scheduling.options import SKEW_FACTOR, SKEW_THRESHOLD
from scheduling.parallelism import ParallelismBounds
from scheduling.producer_bytes import ProducerBytes
from scheduling.skew import (
    ConsumerPlan,
    ConsumerTask,
    InputSlice,
    ProducerRange,
    SkewOptions,
    plan_consumers,
)
from shuffle_api import Configuration, SubpartitionRange

__all__ = [
    "MapOutputBytes",
    "adaptive_plan",
    "codec_neutral_bytes",
    "map_task_count",
    "one_reducer",
    "one_reducer_per_map_task",
    "one_reducer_per_subpartition",
]

BytesMatrix = npt.NDArray[np.int64]
"""Bytes map task m wrote to subpartition s, at ``[m, s]`` (or one map task's row of it)."""
Inputs = Sequence[ProducerBytes | BytesMatrix]


def codec_neutral_bytes(
    stored: BytesMatrix, arrow: BytesMatrix, stored_total: int, arrow_total: int
) -> BytesMatrix:
    """What plans weigh: each map task's Arrow bytes per subpartition, scaled so that they
    add up to the bytes stored (the exchange's totals). With the ``auto`` codec, map tasks of
    one exchange may store the same rows compressed or not; by stored bytes, a reducer of
    compressed outputs would get more rows than one of uncompressed outputs. Scaled, sizes
    keep the meaning of stored bytes (the target size, the skew threshold). Rounded up: what
    holds Arrow bytes never weighs nothing."""
    if not arrow_total:
        return stored
    scaled: BytesMatrix = np.ceil(arrow * (stored_total / arrow_total)).astype(np.int64)
    return scaled


def map_task_count(
    partitions: int | None, estimated_bytes: int, target_bytes: int, cores: int
) -> int | None:
    """How many map tasks read ``partitions`` partitions of about ``estimated_bytes`` in all:
    one per ``target_bytes`` (0: one per partition), at least two for each core (every core
    busy, in two waves), at most one per partition. ``partitions`` None: not known (a Spark
    Connect DataFrame), nor is the cap: coalescing never makes more partitions."""
    if not target_bytes or (partitions is not None and partitions <= 2 * cores):
        return partitions
    wanted = max(2 * cores, -(-max(0, estimated_bytes) // target_bytes))
    return wanted if partitions is None else min(partitions, wanted)


class MapOutputBytes(ProducerBytes):
    """An exchange's map outputs as plans weigh them: :func:`codec_neutral_bytes` of the
    estimates of each map task's :class:`~scheduling.map_sizes.MapSizes`, made map task by
    map task, so planning holds a row at a time, never map tasks x subpartitions numbers."""

    def __init__(self, sizes: Sequence[MapSizes]) -> None:
        self._sizes = tuple(sizes)
        self._stored_total = sum(map_sizes.stored_bytes for map_sizes in self._sizes)
        self._arrow_total = sum(map_sizes.arrow_bytes for map_sizes in self._sizes)
        self._subpartition_totals: BytesMatrix | None = None  # a plan asks several times

    @property
    def shape(self) -> tuple[int, int]:
        return len(self._sizes), self._sizes[0].subpartitions if self._sizes else 0

    def _weighed(self, map_sizes: MapSizes) -> BytesMatrix:
        stored, arrow = map_sizes.estimate()
        return codec_neutral_bytes(stored, arrow, self._stored_total, self._arrow_total)

    def subpartition_totals(self) -> BytesMatrix:
        if self._subpartition_totals is None:
            totals = np.zeros(self.shape[1], dtype=np.int64)
            for map_sizes in self._sizes:
                totals += self._weighed(map_sizes)
            self._subpartition_totals = totals
        return self._subpartition_totals

    def producer_totals(self) -> BytesMatrix:
        return np.array([int(self._weighed(s).sum()) for s in self._sizes], dtype=np.int64)

    def columns(self, subpartitions: Sequence[int]) -> BytesMatrix:
        chosen = list(subpartitions)
        columns = np.zeros((len(self._sizes), len(chosen)), dtype=np.int64)
        for index, map_sizes in enumerate(self._sizes):
            columns[index] = self._weighed(map_sizes)[chosen]
        return columns


def one_reducer_per_subpartition(inputs: Inputs) -> ConsumerPlan:
    """Reducer k reads subpartition k of every map task of every input."""
    subpartitions = inputs[0].shape[1]
    # min = max = S: one reducer per subpartition, empty ones too.
    bounds = ParallelismBounds(subpartitions, subpartitions, bytes_per_task=1)
    return plan_consumers(inputs, bounds, skew=None, splittable=(False,) * len(inputs))


def one_reducer(inputs: Inputs) -> ConsumerPlan:
    """A single reducer that reads every subpartition of every map task (a side read whole)."""
    bounds = ParallelismBounds(1, 1, bytes_per_task=1)
    return plan_consumers(inputs, bounds, skew=None, splittable=(False,) * len(inputs))


def one_reducer_per_map_task(written: ProducerBytes) -> ConsumerPlan:
    """Reducer m reads what map task m wrote, all its subpartitions: a kept result read back
    task by task, pointwise (the producer ranges of a skew split, one map task each)."""
    subpartitions = SubpartitionRange(0, written.shape[1] - 1)
    tasks = tuple(
        ConsumerTask((InputSlice(subpartitions, ProducerRange(m, m)),), int(total))
        for m, total in enumerate(written.producer_totals().tolist())
    )
    return ConsumerPlan(tasks, (), ())


def adaptive_plan(
    configuration: Configuration,
    inputs: Inputs,
    splittable: Sequence[bool],
    default_parallelism: int,
) -> ConsumerPlan:
    """Reducers of about ``pyspark-shuffle.reducer.target-size`` bytes each, at least
    ``reducer.min-count`` of them (Spark's default parallelism when 0) and at most one per
    subpartition; skewed subpartitions of splittable inputs divided by map task ranges.

    When ``reducer.min-count`` is 0 (automatic) and nothing is skewed, their number is rounded
    up to whole waves of ``default_parallelism`` (where there are subpartitions enough) and the
    bytes are shared out as evenly as the subpartitions allow: 3 reducers on 2 cores take two
    reducers' time with one core idle in the second wave, where 4 smaller ones take the time of
    two. (Cut by the target size, more reducers than it gives would be as large as before but
    one, left nearly empty.) A min-count the user set is kept as it is.
    """
    most = inputs[0].shape[1]  # the subpartitions the map tasks wrote
    chosen_minimum = configuration.get(REDUCER_MIN_COUNT)
    fewest = chosen_minimum or default_parallelism
    skew = SkewOptions(configuration.get(SKEW_FACTOR), configuration.get(SKEW_THRESHOLD))

    def plan(least: int, greatest: int, bytes_per_task: int) -> ConsumerPlan:
        bounds = ParallelismBounds(least, greatest, bytes_per_task)
        return plan_consumers(inputs, bounds, skew=skew, splittable=splittable)

    target = configuration.get(REDUCER_TARGET_SIZE)
    least = max(1, min(fewest, most))
    if chosen_minimum:
        return plan(least, most, target)
    by_size = plan(1, most, target)
    if by_size.skewed or by_size.unsplittable:
        return plan(least, most, target)
    wanted = -(-max(len(by_size.tasks), least) // default_parallelism) * default_parallelism
    wanted = min(wanted, most)
    if wanted == len(by_size.tasks):
        return by_size
    total = sum(task.bytes for task in by_size.tasks)  # nothing split: each byte read once
    return plan(wanted, wanted, max(1, -(-total // wanted)))
