"""How many reducers, and what each reads of every shuffled input: one per subpartition, or
adaptive - chosen from the bytes each map task wrote per subpartition, with skewed
subpartitions split among reducers where the operation allows."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from pyspark_shuffle.options import REDUCER_MIN_COUNT, REDUCER_TARGET_SIZE
from scheduling.options import SKEW_FACTOR, SKEW_THRESHOLD
from scheduling.parallelism import ParallelismBounds
from scheduling.skew import (
    ConsumerPlan,
    SkewOptions,
    plan_consumers,
)
from shuffle_api import Configuration

__all__ = ["adaptive_plan", "one_reducer_per_subpartition"]

BytesMatrix = npt.NDArray[np.int64]
"""Bytes map task m wrote to subpartition s, at ``[m, s]``."""


def one_reducer_per_subpartition(inputs: Sequence[BytesMatrix]) -> ConsumerPlan:
    """Reducer k reads subpartition k of every map task of every input."""
    subpartitions = inputs[0].shape[1]
    # min = max = S: one reducer per subpartition, empty ones too.
    bounds = ParallelismBounds(subpartitions, subpartitions, bytes_per_task=1)
    return plan_consumers(inputs, bounds, skew=None, splittable=(False,) * len(inputs))


def adaptive_plan(
    configuration: Configuration,
    inputs: Sequence[BytesMatrix],
    splittable: Sequence[bool],
    default_parallelism: int,
) -> ConsumerPlan:
    """Reducers of about ``pyspark-shuffle.reducer.target-size`` bytes each, at least
    ``reducer.min-count`` of them (Spark's default parallelism when 0) and at most one per
    subpartition; skewed subpartitions of splittable inputs divided by map task ranges."""
    most = inputs[0].shape[1]  # the subpartitions the map tasks wrote
    fewest = configuration.get(REDUCER_MIN_COUNT) or default_parallelism
    bounds = ParallelismBounds(
        min_parallelism=max(1, min(fewest, most)),
        max_parallelism=most,
        bytes_per_task=configuration.get(REDUCER_TARGET_SIZE),
    )
    skew = SkewOptions(configuration.get(SKEW_FACTOR), configuration.get(SKEW_THRESHOLD))
    return plan_consumers(inputs, bounds, skew=skew, splittable=splittable)
