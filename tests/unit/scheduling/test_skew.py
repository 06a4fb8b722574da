"""Consumer plans with skewed subpartitions split across producer ranges.

Hand-computed cases first (the arithmetic is in the comments), then invariants on random
inputs.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import Counter

import numpy
import numpy.typing
import pytest

from scheduling.parallelism import ParallelismBounds, ranges_by_bytes
from scheduling.skew import (
    ConsumerPlan,
    ConsumerTask,
    InputSlice,
    ProducerRange,
    SkewOptions,
    plan_consumers,
)
from shuffle_api import ConfigError, InvalidOperationError, SubpartitionRange

Matrix = numpy.typing.NDArray[numpy.int64]
NO_THRESHOLD = SkewOptions(factor=4.0, threshold_bytes=0)


def _m(rows: list[list[int]]) -> Matrix:
    return numpy.array(rows, dtype=numpy.int64)


def _task(bytes_read: int, *slices: tuple[tuple[int, int], tuple[int, int]]) -> ConsumerTask:
    return ConsumerTask(
        inputs=tuple(
            InputSlice(SubpartitionRange(*subpartitions), ProducerRange(*producers))
            for subpartitions, producers in slices
        ),
        bytes=bytes_read,
    )


def _half_in_one_key() -> Matrix:
    # 8 producers x 8 subpartitions: key 0 gets 7 from each producer (56), the other seven
    # keys 1 from each (8 each, 56 together): key 0 holds half the bytes.
    matrix = numpy.ones((8, 8), dtype=numpy.int64)
    matrix[:, 0] = 7
    return matrix


# --- value objects -------------------------------------------------------------------------


def test_producer_range_is_inclusive() -> None:
    assert len(ProducerRange(2, 5)) == 4
    assert list(ProducerRange(2, 5)) == [2, 3, 4, 5]


@pytest.mark.parametrize(("start", "end"), [(3, 2), (-1, 0)])
def test_producer_range_rejects_reversed_or_negative(start: int, end: int) -> None:
    with pytest.raises(InvalidOperationError, match="producer range"):
        ProducerRange(start, end)


@pytest.mark.parametrize(
    ("factor", "threshold", "field"),
    [(0.0, 0, "factor"), (math.nan, 0, "factor"), (4.0, -1, "threshold_bytes")],
)
def test_skew_options_reject_bad_values(factor: float, threshold: int, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        SkewOptions(factor=factor, threshold_bytes=threshold)


def test_skew_options_default_to_flink_values() -> None:
    assert SkewOptions() == SkewOptions(factor=4.0, threshold_bytes=256 * 1024 * 1024)


# --- without skew handling -----------------------------------------------------------------


def test_without_skew_each_range_reads_all_producers_of_every_input() -> None:
    left = _m([[1, 1, 1, 1], [1, 1, 1, 1]])  # totals 2 per subpartition
    right = numpy.ones((3, 4), dtype=numpy.int64)  # totals 3 per subpartition
    # Combined 5 per subpartition; limit 10 -> pairs.
    plan = plan_consumers(
        [left, right], ParallelismBounds(1, 10, 10), skew=None, splittable=[True, True]
    )
    assert plan == ConsumerPlan(
        tasks=(
            _task(10, ((0, 1), (0, 1)), ((0, 1), (0, 2))),
            _task(10, ((2, 3), (0, 1)), ((2, 3), (0, 2))),
        ),
        skewed=(),
        unsplittable=(),
    )


# --- splitting -----------------------------------------------------------------------------


def test_key_with_half_the_bytes_is_split_into_producer_slices() -> None:
    # Totals [56, 8 x7]: median 8, threshold max(8*4, 0) = 32 -> key 0 is skewed.
    # Target max(16, 56 // 7 = 8) = 16: 7+7=14, +7=21 > 16 -> slices of two producers (14).
    # Keys 1..7 (8 each), limit 16: [1,2] [3,4] [5,6] [7].
    plan = plan_consumers(
        [_half_in_one_key()], ParallelismBounds(1, 100, 16), skew=NO_THRESHOLD, splittable=[True]
    )
    assert plan.tasks == (
        _task(14, ((0, 0), (0, 1))),
        _task(14, ((0, 0), (2, 3))),
        _task(14, ((0, 0), (4, 5))),
        _task(14, ((0, 0), (6, 7))),
        _task(16, ((1, 2), (0, 7))),
        _task(16, ((3, 4), (0, 7))),
        _task(16, ((5, 6), (0, 7))),
        _task(8, ((7, 7), (0, 7))),
    )
    assert (plan.skewed, plan.unsplittable) == ((0,), ())
    sizes = [task.bytes for task in plan.tasks]
    assert max(sizes) <= 2 * (sum(sizes) / len(sizes))  # 16 <= 2 * 14


def test_key_with_half_the_bytes_is_a_straggler_without_skew_handling() -> None:
    # The same data unsplit: [0] alone (56) then four ranges -> max 56 > 2 * mean 22.4.
    # (Proves the balance assertion above can fail.)
    plan = plan_consumers(
        [_half_in_one_key()], ParallelismBounds(1, 100, 16), skew=None, splittable=[True]
    )
    sizes = [task.bytes for task in plan.tasks]
    assert sizes == [56, 16, 16, 16, 8]
    assert max(sizes) > 2 * (sum(sizes) / len(sizes))


def test_join_splits_the_skewed_left_and_replicates_the_right() -> None:
    left = _m([[1, 1, 10, 1]] * 4)  # totals [4, 4, 40, 4]: median 4, threshold 16 -> key 2
    right = _m([[2, 2, 2, 2]] * 2)  # totals [4, 4, 4, 4]: nothing skewed
    # Left target max(20, 12 // 3 = 4) = 20: 10+10=20, +10 > 20 -> producers [0,1] [2,3].
    # Each of those tasks reads the right whole at key 2: 20 + 4 = 24 bytes.
    # Combined [8, 8, _, 8], limit 20: [0,1] (16) and [3] (8).
    plan = plan_consumers(
        [left, right], ParallelismBounds(1, 10, 20), skew=NO_THRESHOLD, splittable=[True, False]
    )
    assert plan.tasks == (
        _task(16, ((0, 1), (0, 3)), ((0, 1), (0, 1))),
        _task(24, ((2, 2), (0, 1)), ((2, 2), (0, 1))),
        _task(24, ((2, 2), (2, 3)), ((2, 2), (0, 1))),
        _task(8, ((3, 3), (0, 3)), ((3, 3), (0, 1))),
    )
    assert (plan.skewed, plan.unsplittable) == ((2,), ())


def test_join_with_both_sides_skewed_reads_the_cartesian_product_of_slices() -> None:
    left = _m([[10, 1, 1], [10, 1, 1]])  # totals [20, 2, 2]: median 2, threshold 8 -> key 0
    right = _m([[6, 1, 1]] * 3)  # totals [18, 3, 3]: median 3, threshold 12 -> key 0
    # Left target max(10, 4 // 2) = 10 -> [0] [1] (10 each); right target max(10, 6 // 2) = 10:
    # 6+6=12 > 10 -> [0] [1] [2] (6 each). 2 x 3 = 6 tasks of 16 bytes; keys 1..2 -> one (10).
    plan = plan_consumers(
        [left, right], ParallelismBounds(1, 100, 10), skew=NO_THRESHOLD, splittable=[True, True]
    )
    at_0 = (0, 0)
    assert plan.tasks == (
        _task(16, (at_0, (0, 0)), (at_0, (0, 0))),
        _task(16, (at_0, (0, 0)), (at_0, (1, 1))),
        _task(16, (at_0, (0, 0)), (at_0, (2, 2))),
        _task(16, (at_0, (1, 1)), (at_0, (0, 0))),
        _task(16, (at_0, (1, 1)), (at_0, (1, 1))),
        _task(16, (at_0, (1, 1)), (at_0, (2, 2))),
        _task(10, ((1, 2), (0, 1)), ((1, 2), (0, 2))),
    )
    assert (plan.skewed, plan.unsplittable) == ((0,), ())


def test_skew_is_detected_against_each_inputs_own_median() -> None:
    left = _m([[100, 100, 100, 100]])  # uniform and large
    right = _m([[1, 1, 1, 20], [1, 1, 1, 20]])  # totals [2, 2, 2, 40]: threshold 8 -> key 3
    # Combined [102, 102, 102, 140] would show no skew. Right target max(20, 6 // 3) = 20:
    # 20+20 > 20 -> [0] [1]; the left is read whole by both: 100 + 20 = 120.
    plan = plan_consumers(
        [left, right], ParallelismBounds(1, 10, 20), skew=NO_THRESHOLD, splittable=[True, True]
    )
    assert plan.tasks == (
        _task(102, ((0, 0), (0, 0)), ((0, 0), (0, 1))),
        _task(102, ((1, 1), (0, 0)), ((1, 1), (0, 1))),
        _task(102, ((2, 2), (0, 0)), ((2, 2), (0, 1))),
        _task(120, ((3, 3), (0, 0)), ((3, 3), (0, 0))),
        _task(120, ((3, 3), (0, 0)), ((3, 3), (1, 1))),
    )
    assert (plan.skewed, plan.unsplittable) == ((3,), ())


def test_threshold_bytes_keeps_small_subpartitions_from_counting_as_skewed() -> None:
    # Same data as the half-in-one-key case, but 56 <= threshold 100: nothing is split.
    plan = plan_consumers(
        [_half_in_one_key()],
        ParallelismBounds(1, 100, 16),
        skew=SkewOptions(factor=4.0, threshold_bytes=100),
        splittable=[True],
    )
    assert [task.bytes for task in plan.tasks] == [56, 16, 16, 16, 8]
    assert (plan.skewed, plan.unsplittable) == ((), ())


# --- unsplittable --------------------------------------------------------------------------


def test_skewed_key_written_by_one_producer_is_unsplittable_and_read_alone() -> None:
    matrix = numpy.ones((4, 4), dtype=numpy.int64)
    matrix[:, 1] = [40, 0, 0, 0]  # totals [4, 40, 4, 4]: threshold 16 -> key 1
    # Target max(8, 12 // 3) = 8 < 40 from producer 0 alone; the empty producers join its
    # slice, so there is one slice: not split. Keys 0 and 2..3 (limit 8): [0] and [2,3].
    plan = plan_consumers(
        [matrix], ParallelismBounds(1, 10, 8), skew=NO_THRESHOLD, splittable=[True]
    )
    assert plan.tasks == (
        _task(4, ((0, 0), (0, 3))),
        _task(40, ((1, 1), (0, 3))),
        _task(8, ((2, 3), (0, 3))),
    )
    assert (plan.skewed, plan.unsplittable) == ((), (1,))


def test_key_split_around_one_oversized_producer_is_both_skewed_and_unsplittable() -> None:
    matrix = numpy.ones((4, 4), dtype=numpy.int64)
    matrix[:, 1] = [30, 5, 5, 5]  # totals [4, 45, 4, 4]: threshold 16 -> key 1, target 8
    # 30 alone (> 8); 30+5 > 8 cuts; 5+5 > 8 cuts twice -> [0] [1] [2] [3].
    plan = plan_consumers(
        [matrix], ParallelismBounds(1, 10, 8), skew=NO_THRESHOLD, splittable=[True]
    )
    assert [task.bytes for task in plan.tasks] == [4, 30, 5, 5, 5, 8]
    assert [task.inputs[0].producers for task in plan.tasks[1:5]] == [
        ProducerRange(p, p) for p in range(4)
    ]
    assert (plan.skewed, plan.unsplittable) == ((1,), (1,))


def test_skewed_input_that_may_not_be_split_is_unsplittable() -> None:
    # As the half-in-one-key case, but its producers may not be divided (e.g. a sort).
    # Key 0 is a task alone (56); keys 1..7 with limit 16: [1,2] [3,4] [5,6] [7].
    plan = plan_consumers(
        [_half_in_one_key()], ParallelismBounds(1, 100, 16), skew=NO_THRESHOLD, splittable=[False]
    )
    assert [task.bytes for task in plan.tasks] == [56, 16, 16, 16, 8]
    assert plan.tasks[0] == _task(56, ((0, 0), (0, 7)))
    assert (plan.skewed, plan.unsplittable) == ((), (0,))


def test_join_skewed_only_on_its_preserved_side_is_unsplittable() -> None:
    left = _m([[2, 2, 2, 2]] * 2)  # nothing skewed
    right = _m([[1, 1, 10, 1]] * 4)  # key 2 skewed, but a left outer join cannot split it
    plan = plan_consumers(
        [left, right], ParallelismBounds(1, 10, 20), skew=NO_THRESHOLD, splittable=[True, False]
    )
    # Key 2 alone: 4 + 40; [0,1]: 8 + 8; [3]: 4 + 4.
    assert [task.bytes for task in plan.tasks] == [16, 44, 8]
    assert plan.tasks[1] == _task(44, ((2, 2), (0, 1)), ((2, 2), (0, 3)))
    assert (plan.skewed, plan.unsplittable) == ((), (2,))


# --- parallelism bounds with split tasks ---------------------------------------------------


def test_split_tasks_count_toward_max_parallelism() -> None:
    # 4 split tasks leave max 6 - 4 = 2 for keys 1..7 (8 each): the smallest limit giving
    # <= 2 ranges is 32 -> [1,4] (32) and [5,7] (24).
    plan = plan_consumers(
        [_half_in_one_key()], ParallelismBounds(1, 6, 16), skew=NO_THRESHOLD, splittable=[True]
    )
    assert [task.bytes for task in plan.tasks] == [14, 14, 14, 14, 32, 24]
    assert [task.inputs[0].subpartitions for task in plan.tasks[4:]] == [
        SubpartitionRange(1, 4),
        SubpartitionRange(5, 7),
    ]


def test_split_tasks_may_exceed_max_parallelism() -> None:
    # 4 split tasks > max 2: splits stay, keys 1..7 become one range; 5 tasks in all.
    plan = plan_consumers(
        [_half_in_one_key()], ParallelismBounds(1, 2, 16), skew=NO_THRESHOLD, splittable=[True]
    )
    assert [task.bytes for task in plan.tasks] == [14, 14, 14, 14, 56]
    assert plan.tasks[4].inputs[0].subpartitions == SubpartitionRange(1, 7)


# --- validation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("inputs", "splittable", "message"),
    [
        ([], [], "no inputs"),
        ([_m([[1, 1]])], [True, True], "splittable has 2"),
        ([_m([[1, 1]]), _m([[1, 1, 1]])], [True, True], "3 subpartitions"),
        ([_m([[1, -1]])], [True], "negative"),
        ([numpy.ones(3, dtype=numpy.int64)], [True], "2-d"),
        ([numpy.ones((0, 3), dtype=numpy.int64)], [True], "at least one producer"),
        ([numpy.ones((2, 2), dtype=numpy.float64)], [True], "integer"),
    ],
)
def test_plan_consumers_rejects_malformed_inputs(
    inputs: list[Matrix], splittable: list[bool], message: str
) -> None:
    with pytest.raises(InvalidOperationError, match=message):
        plan_consumers(inputs, ParallelismBounds(1, 4, 1), skew=NO_THRESHOLD, splittable=splittable)


# --- invariants on random inputs -----------------------------------------------------------


def _random_case(
    seed: int,
) -> tuple[list[Matrix], ParallelismBounds, SkewOptions, list[bool]]:
    rng = numpy.random.default_rng(seed)
    subpartitions = int(rng.integers(1, 11))
    inputs: list[Matrix] = []
    for _ in range(int(rng.integers(1, 4))):
        matrix = rng.integers(0, 10, size=(int(rng.integers(1, 6)), subpartitions))
        matrix[rng.random(matrix.shape) < 0.3] = 0
        for key in rng.integers(0, subpartitions, size=int(rng.integers(0, 3))):
            matrix[:, key] *= rng.integers(5, 40)
        inputs.append(matrix.astype(numpy.int64))
    low = int(rng.integers(1, 7))
    bounds = ParallelismBounds(low, low + int(rng.integers(0, 7)), int(rng.integers(1, 40)))
    skew = SkewOptions(float(rng.uniform(1.0, 4.0)), int(rng.integers(0, 30)))
    splittable = [bool(flag) for flag in rng.random(len(inputs)) < 0.7]
    return inputs, bounds, skew, splittable


def _expected_skew(
    inputs: list[Matrix], bounds: ParallelismBounds, skew: SkewOptions, splittable: list[bool]
) -> tuple[set[int], set[int], set[int], list[int]]:
    """(detected, split, unsplittable, targets), worked out plainly from the rule."""
    skewed_sets: list[set[int]] = []
    targets: list[int] = []
    for matrix in inputs:
        totals = [int(v) for v in matrix.sum(axis=0)]
        threshold = max(statistics.median(totals) * skew.factor, skew.threshold_bytes)
        skewed_sets.append({k for k, v in enumerate(totals) if v > threshold})
        normal = [v for k, v in enumerate(totals) if k not in skewed_sets[-1]]
        targets.append(max(bounds.bytes_per_task, sum(normal) // len(normal) if normal else 0))
    detected = set().union(*skewed_sets)
    split: set[int] = set()
    unsplittable: set[int] = set()
    for k in detected:
        cut = [i for i in range(len(inputs)) if k in skewed_sets[i] and splittable[i]]
        columns = {i: [int(v) for v in inputs[i][:, k]] for i in cut}
        if not cut or any(max(columns[i]) > targets[i] for i in cut):
            unsplittable.add(k)
        # Greedy cuts somewhere iff the column exceeds the target and two producers have data.
        if any(sum(columns[i]) > targets[i] and sum(v > 0 for v in columns[i]) > 1 for i in cut):
            split.add(k)
    return detected, split, unsplittable, targets


def _check_plan(
    inputs: list[Matrix],
    bounds: ParallelismBounds,
    skew: SkewOptions,
    splittable: list[bool],
    plan: ConsumerPlan,
) -> Counter[str]:
    seen: Counter[str] = Counter()
    subpartitions = inputs[0].shape[1]
    detected, split, unsplittable, targets = _expected_skew(inputs, bounds, skew, splittable)
    assert set(plan.skewed) == split and list(plan.skewed) == sorted(plan.skewed)
    assert set(plan.unsplittable) == unsplittable

    groups: dict[SubpartitionRange, list[ConsumerTask]] = {}
    for task in plan.tasks:
        assert len(task.inputs) == len(inputs)
        ranges = {piece.subpartitions for piece in task.inputs}
        assert len(ranges) == 1  # one subpartition range per task, across inputs
        (sub,) = ranges
        assert task.bytes == sum(
            int(m[piece.producers.start : piece.producers.end + 1, sub.start : sub.end + 1].sum())
            for m, piece in zip(inputs, task.inputs, strict=True)
        )
        # Tasks of one range are adjacent, and ranges come in subpartition order.
        assert sub in groups or not groups or sub.start == list(groups)[-1].end + 1
        assert sub not in groups or sub == list(groups)[-1]
        groups.setdefault(sub, []).append(task)
    ordered = list(groups)
    assert ordered[0].start == 0 and ordered[-1].end == subpartitions - 1

    for sub, tasks in groups.items():
        if sub.start in detected:
            assert len(sub) == 1  # a detected subpartition is never merged with others
        else:
            assert not any(k in detected for k in sub)
        if len(tasks) == 1:
            # Not split: every (producer, subpartition) cell of every input read exactly once.
            for m, piece in zip(inputs, tasks[0].inputs, strict=True):
                assert piece.producers == ProducerRange(0, m.shape[0] - 1)
            continue
        (k,) = sub
        distinct = [
            list(dict.fromkeys(task.inputs[i].producers for task in tasks))
            for i in range(len(inputs))
        ]
        cut = [i for i, slices in enumerate(distinct) if len(slices) > 1]
        for i, slices in enumerate(distinct):
            if len(slices) == 1:
                # Replicated: each task of k reads all of this input's producers there.
                assert slices[0] == ProducerRange(0, inputs[i].shape[0] - 1)
                seen["replicated"] += 1
                continue
            assert splittable[i]
            cells = [p for producers in slices for p in producers]
            assert cells == list(range(inputs[i].shape[0]))  # slices partition the producers
            for producers in slices:
                column = inputs[i][producers.start : producers.end + 1, k]
                assert int(column.sum()) <= targets[i] or int((column > 0).sum()) == 1
        # Every combination of one slice per cut input is read by exactly one task, so each
        # pair of rows of a join meets once.
        combos = Counter(tuple(task.inputs[i].producers for i in cut) for task in tasks)
        assert set(combos) == set(itertools.product(*(distinct[i] for i in cut)))
        assert set(combos.values()) == {1}
        if len(cut) == 1:
            reads = Counter(p for task in tasks for p in task.inputs[cut[0]].producers)
            assert reads == Counter(range(inputs[cut[0]].shape[0]))  # each cell once
        seen["cartesian" if len(cut) > 1 else "split"] += 1

    fixed = sum(len(tasks) for sub, tasks in groups.items() if sub.start in detected)
    coalesced = len(plan.tasks) - fixed
    covered = subpartitions - len(detected)
    runs = sum(
        1 for k in range(subpartitions) if k not in detected and (k == 0 or k - 1 in detected)
    )
    if covered:
        assert min(bounds.min_parallelism - fixed, covered) <= coalesced
        assert coalesced <= max(bounds.max_parallelism - fixed, runs)
    seen["unsplittable"] += len(plan.unsplittable)
    return seen


def test_random_plans_read_every_cell_as_the_rules_say() -> None:
    seen: Counter[str] = Counter()
    for seed in range(600):
        inputs, bounds, skew, splittable = _random_case(seed)
        plan = plan_consumers(inputs, bounds, skew=skew, splittable=splittable)
        seen += _check_plan(inputs, bounds, skew, splittable, plan)
    # The random cases must exercise every kind of subpartition, or they prove little.
    assert seen["split"] > 20
    assert seen["cartesian"] > 5
    assert seen["replicated"] > 20
    assert seen["unsplittable"] > 20


def test_without_detected_skew_the_plan_equals_the_plan_without_skew_handling() -> None:
    never = SkewOptions(factor=4.0, threshold_bytes=1 << 40)
    for seed in range(200):
        inputs, bounds, _, splittable = _random_case(seed)
        plain = plan_consumers(inputs, bounds, skew=None, splittable=splittable)
        assert plan_consumers(inputs, bounds, skew=never, splittable=splittable) == plain
        combined = [int(v) for v in sum(m.sum(axis=0) for m in inputs)]
        assert [t.inputs[0].subpartitions for t in plain.tasks] == list(
            ranges_by_bytes(combined, bounds)
        )
