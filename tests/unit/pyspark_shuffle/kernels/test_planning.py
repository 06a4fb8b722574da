"""``pyspark_shuffle.kernels.planning``: reducer plans from map outputs' sizes (one reducer
per subpartition, adaptive, skewed subpartitions split), bytes weighed alike whatever the
codec, and how many map tasks read the input."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from pyspark_shuffle.kernels.planning import (
    MapOutputBytes,
    adaptive_plan,
    codec_neutral_bytes,
    map_task_count,
    one_reducer_per_map_task,
    one_reducer_per_subpartition,
)
from scheduling.map_sizes import MapSizes
from scheduling.skew import ConsumerTask, InputSlice, ProducerRange
from shuffle_api import Configuration, PartitionStatistics, SubpartitionRange


def test_fixed_reducers_read_one_subpartition_of_every_map_task_each() -> None:
    left = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int64)
    right = np.array([[10, 0, 0]], dtype=np.int64)
    plan = one_reducer_per_subpartition([left, right])
    assert [task.bytes for task in plan.tasks] == [15, 7, 9]
    assert plan.tasks[1].inputs == (
        InputSlice(SubpartitionRange.single(1), ProducerRange(0, 1)),
        InputSlice(SubpartitionRange.single(1), ProducerRange(0, 0)),
    )
    assert plan.skewed == plan.unsplittable == ()


def test_adaptive_plan_takes_its_bounds_and_skew_limits_from_the_configuration() -> None:
    # 4 map tasks x 8 subpartitions of 10 bytes, but subpartition 5 holds 400 (100 per map).
    matrix = np.full((4, 8), 10, dtype=np.int64)
    matrix[:, 5] = 100
    configuration = Configuration.load(
        {
            "pyspark-shuffle.reducer.target-size": "100",
            "pyspark-shuffle.reducer.min-count": "1",
            "scheduling.skew.threshold": "200",
        }
    )
    split = adaptive_plan(configuration, [matrix], [True], default_parallelism=2)
    assert split.skewed == (5,) and split.unsplittable == ()
    # Subpartition 5 read by 4 reducers, one map task each; the others coalesced.
    assert sorted(t.inputs[0].producers.start for t in split.tasks if t.bytes == 100) == [
        0, 1, 2, 3,
    ]  # fmt: skip
    assert max(task.bytes for task in split.tasks) == 100
    whole = adaptive_plan(configuration, [matrix], [False], default_parallelism=2)
    assert whole.unsplittable == (5,)
    assert max(task.bytes for task in whole.tasks) == 400


def test_map_tasks_that_stored_the_same_rows_with_different_codecs_weigh_alike() -> None:
    # Four map tasks wrote the same rows to subpartition 1 (skewed) and a few to the 7
    # others; tasks 0 and 1 compressed theirs to a third. Split by stored bytes, one reducer
    # would read the rows of tasks 0 and 1 together, twice those of each other reducer.
    arrow = np.full((4, 8), 300, dtype=np.int64)
    arrow[:, 1] = 30_000
    stored = arrow.copy()
    stored[:2] //= 3
    weighed = codec_neutral_bytes(stored, arrow, int(stored.sum()), int(arrow.sum()))
    assert (weighed[:, 1] == weighed[0, 1]).all()
    assert 0 <= int(weighed.sum()) - int(stored.sum()) < weighed.size  # rounded up, cell by cell
    configuration = Configuration.load(
        {
            "pyspark-shuffle.reducer.target-size": str(int(weighed[0, 1])),
            "pyspark-shuffle.reducer.min-count": "1",
            "scheduling.skew.threshold": str(int(weighed[:, 1].sum()) // 2),
        }
    )
    plan = adaptive_plan(configuration, [weighed], [True], default_parallelism=1)
    assert plan.skewed == (1,)
    map_tasks_per_reducer = sorted(
        len(task.inputs[0].producers)
        for task in plan.tasks
        if task.inputs[0].subpartitions == SubpartitionRange.single(1)
    )
    assert map_tasks_per_reducer == [1, 1, 1, 1]


def _map_sizes(maps: int, subpartitions: int, seed: int) -> list[MapSizes]:
    """Map outputs of random sizes, a few subpartitions empty and one skewed; half the map
    tasks compressed theirs to a third."""
    rng = np.random.default_rng(seed)
    sizes = []
    for m in range(maps):
        arrow = rng.integers(1, 1_000, subpartitions) * (rng.random(subpartitions) > 0.1)
        arrow[3] *= 200
        stored = arrow // 3 if m % 2 else arrow
        rows = tuple((arrow // 10).tolist())
        statistics = PartitionStatistics(rows, tuple(stored.tolist()), tuple(arrow.tolist()))
        sizes.append(MapSizes.of(statistics))
    return sizes


@pytest.mark.parametrize("min_count", ["0", "7"])
def test_plans_from_map_output_sizes_equal_those_of_the_whole_matrix(min_count: str) -> None:
    sizes = _map_sizes(40, 60, seed=int(min_count))
    estimates = [map_sizes.estimate() for map_sizes in sizes]
    stored = np.stack([stored for stored, _ in estimates])
    arrow = np.stack([arrow for _, arrow in estimates])
    matrix = codec_neutral_bytes(stored, arrow, int(stored.sum()), int(arrow.sum()))
    configuration = Configuration.load(
        {
            "pyspark-shuffle.reducer.target-size": "20000",
            "pyspark-shuffle.reducer.min-count": min_count,
            "scheduling.skew.threshold": "100000",
        }
    )
    by_rows = adaptive_plan(configuration, [MapOutputBytes(sizes)], [True], 2)
    assert by_rows == adaptive_plan(configuration, [matrix], [True], 2)
    assert by_rows.skewed == (3,), "the skewed subpartition is split: its column was read"
    assert one_reducer_per_map_task(MapOutputBytes(sizes)).tasks == tuple(
        ConsumerTask((InputSlice(SubpartitionRange(0, 59), ProducerRange(m, m)),), int(row))
        for m, row in enumerate(matrix.sum(axis=1).tolist())
    )


def test_planning_from_map_output_sizes_holds_no_matrix_of_every_block() -> None:
    maps, subpartitions = 400, 5_000  # a matrix of their bytes: 16 MB
    written = MapOutputBytes(_map_sizes(maps, subpartitions, seed=1))
    tracemalloc.start()
    try:
        configuration = Configuration.load(
            {"scheduling.skew.threshold": "1000000", "pyspark-shuffle.reducer.target-size": "4MiB"}
        )
        plan = adaptive_plan(configuration, [written], [True], 2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert plan.skewed == (3,)
    assert peak < maps * subpartitions * 8 // 8, f"{peak:,} bytes at the peak"


def test_a_subpartition_with_rows_never_weighs_nothing() -> None:
    arrow = np.array([[1, 0, 1_000_000]], dtype=np.int64)
    weighed = codec_neutral_bytes(
        arrow // 1000, arrow, int((arrow // 1000).sum()), int(arrow.sum())
    )
    assert weighed[0, 0] > 0 and weighed[0, 1] == 0


def test_adaptive_plan_gives_every_core_a_reducer_by_default() -> None:
    matrix = np.full((2, 8), 10, dtype=np.int64)  # 160 bytes: one reducer by size alone
    plan = adaptive_plan(Configuration.load({}), [matrix], [False], default_parallelism=4)
    assert len(plan.tasks) == 4


def test_adaptive_plan_rounds_reducers_up_to_whole_waves_of_cores_sharing_bytes_evenly() -> None:
    configuration = Configuration.load({"pyspark-shuffle.reducer.target-size": "100"})
    matrix = np.full((1, 8), 30, dtype=np.int64)  # 240 bytes: 3 reducers by size alone
    assert len(adaptive_plan(configuration, [matrix], [False], default_parallelism=1).tasks) == 3
    waves = adaptive_plan(configuration, [matrix], [False], default_parallelism=2)
    assert [task.bytes for task in waves.tasks] == [60, 60, 60, 60]  # even, not 90 90 30 30
    few = np.full((1, 3), 80, dtype=np.int64)  # no fourth subpartition to make a reducer of
    assert len(adaptive_plan(configuration, [few], [False], default_parallelism=2).tasks) == 3


def test_adaptive_plan_keeps_a_min_count_the_user_set_without_rounding_to_waves() -> None:
    configuration = Configuration.load(
        {"pyspark-shuffle.reducer.target-size": "100", "pyspark-shuffle.reducer.min-count": "1"}
    )
    tiny = np.full((1, 64), 1, dtype=np.int64)  # 64 bytes: one reducer by size
    assert len(adaptive_plan(configuration, [tiny], [False], default_parallelism=8).tasks) == 1


@pytest.mark.parametrize(
    ("partitions", "estimated", "target", "cores", "tasks"),
    [
        (1_000, 16 << 20, 64 << 20, 2, 4),  # small partitions: two map tasks a core
        (1_000, 640 << 20, 64 << 20, 2, 10),  # one per target's bytes
        (1_000, 1 << 40, 64 << 20, 2, 1_000),  # never more than one a partition
        (16, 1 << 20, 64 << 20, 8, 16),  # no fewer than two a core: as they are
        (1_000, 16 << 20, 0, 2, 1_000),  # off
        (1_000, 0, 64 << 20, 200, 400),
        # Partitions not known (Spark Connect): as many as the bytes say, two a core at least.
        (None, 16 << 20, 64 << 20, 2, 4),
        (None, 640 << 20, 64 << 20, 2, 10),
        (None, 16 << 20, 0, 2, None),
    ],
)
def test_map_tasks_read_about_the_target_size_each_two_a_core_at_least(
    partitions: int | None, estimated: int, target: int, cores: int, tasks: int | None
) -> None:
    assert map_task_count(partitions, estimated, target, cores) == tasks
