"""Consumer parallelism from bytes produced: even split, greedy ranges, bisection, fallback.

Expected values are worked out by hand in the comments.
"""

from __future__ import annotations

import numpy
import pytest

from scheduling.parallelism import (
    ParallelismBounds,
    ranges_by_bytes,
    ranges_by_bytes_in_runs,
    split_evenly,
)
from shuffle_api import ConfigError, InvalidOperationError, SubpartitionRange


def _r(*pairs: tuple[int, int]) -> tuple[SubpartitionRange, ...]:
    return tuple(SubpartitionRange(start, end) for start, end in pairs)


# --- ParallelismBounds ---------------------------------------------------------------------


def test_bounds_accept_min_equal_to_max() -> None:
    bounds = ParallelismBounds(4, 4, 1)
    assert (bounds.min_parallelism, bounds.max_parallelism, bounds.bytes_per_task) == (4, 4, 1)


@pytest.mark.parametrize(
    ("args", "field", "value"),
    [
        ((0, 4, 1), "min_parallelism", "0"),
        ((3, 2, 1), "max_parallelism", "2"),
        ((1, 4, 0), "bytes_per_task", "0"),
        ((1, 4, -5), "bytes_per_task", "-5"),
        ((True, 4, 1), "min_parallelism", "True"),
    ],
)
def test_bounds_reject_bad_values_naming_field_and_value(
    args: tuple[int, int, int], field: str, value: str
) -> None:
    with pytest.raises(ConfigError, match=field) as caught:
        ParallelismBounds(*args)
    assert value in str(caught.value)


# --- split_evenly --------------------------------------------------------------------------


def test_split_evenly_gives_consumer_k_floor_k_s_over_n() -> None:
    # S=10, N=3: [0, 10//3-1=2], [3, 20//3-1=5], [6, 30//3-1=9]
    assert split_evenly(10, 3) == _r((0, 2), (3, 5), (6, 9))


def test_split_evenly_puts_the_larger_ranges_last() -> None:
    # S=5, N=2: [0, 5//2-1=1], [2, 4]
    assert split_evenly(5, 2) == _r((0, 1), (2, 4))


def test_split_evenly_with_as_many_consumers_as_subpartitions_gives_one_each() -> None:
    assert split_evenly(4, 4) == _r((0, 0), (1, 1), (2, 2), (3, 3))


def test_split_evenly_with_one_consumer_gives_everything() -> None:
    assert split_evenly(7, 1) == _r((0, 6))


@pytest.mark.parametrize(("subpartitions", "consumers"), [(3, 4), (3, 0), (0, 1)])
def test_split_evenly_rejects_more_consumers_than_subpartitions_or_none(
    subpartitions: int, consumers: int
) -> None:
    with pytest.raises(InvalidOperationError, match="1 <= consumers <= subpartitions"):
        split_evenly(subpartitions, consumers)


# --- ranges_by_bytes -----------------------------------------------------------------------


def test_ranges_grow_while_within_bytes_per_task() -> None:
    # limit 8: 4+4=8 fits, +4=12 does not -> pairs; 3 ranges is within [1, 10].
    assert ranges_by_bytes([4] * 6, ParallelismBounds(1, 10, 8)) == _r((0, 1), (2, 3), (4, 5))


def test_empty_subpartitions_join_the_range_they_follow() -> None:
    # limit 5: 0,5,0,0 -> 5; +5=10 > 5 cuts -> [0,3]; then 5,0 -> [4,5].
    assert ranges_by_bytes([0, 5, 0, 0, 5, 0], ParallelismBounds(1, 10, 5)) == _r((0, 3), (4, 5))


def test_all_zero_bytes_give_one_range_when_min_is_one() -> None:
    assert ranges_by_bytes([0] * 5, ParallelismBounds(1, 10, 5)) == _r((0, 4))


def test_all_zero_bytes_split_evenly_into_min_ranges() -> None:
    # Any limit gives 1 range < 3 -> even split into clamp(ceil(0/5)=0, 3, 10) = 3:
    # [0, 5//3-1=0], [1, 10//3-1=2], [3, 4].
    assert ranges_by_bytes([0] * 5, ParallelismBounds(3, 10, 5)) == _r((0, 0), (1, 2), (3, 4))


def test_min_above_subpartition_count_is_capped_at_it() -> None:
    # min 8 > S=5 -> 5 ranges, one per subpartition.
    assert ranges_by_bytes([0] * 5, ParallelismBounds(8, 10, 5)) == _r(
        (0, 0), (1, 1), (2, 2), (3, 3), (4, 4)
    )


def test_giant_subpartition_is_a_range_alone() -> None:
    # limit 4: 1+1=2, +100 > 4 cuts; 100 alone (over the limit); 101 > 4 cuts; 1+1 -> [3,4].
    assert ranges_by_bytes([1, 1, 100, 1, 1], ParallelismBounds(1, 10, 4)) == _r(
        (0, 1), (2, 2), (3, 4)
    )


def test_single_subpartition_gives_one_range() -> None:
    assert ranges_by_bytes([123], ParallelismBounds(1, 10, 4)) == _r((0, 0))


def test_too_many_ranges_bisect_the_limit_up_to_the_smallest_that_fits_max() -> None:
    # limit 2 -> [0] [1,2] [3] [4] [5,6] [7]: 6 > max 3. Counts by limit: 5 -> 4, 6 -> 4,
    # 7 -> 3 ([5,1,1] [1,5,1] [1,1]), so the smallest limit with <= 3 ranges is 7.
    # (An even split would be [0,1] [2,4] [5,7].)
    got = ranges_by_bytes([5, 1, 1, 1, 5, 1, 1, 1], ParallelismBounds(1, 3, 2))
    assert got == _r((0, 2), (3, 5), (6, 7))


def test_too_few_ranges_bisect_the_limit_down_to_the_largest_that_reaches_min() -> None:
    # limit 100 -> 1 range < min 3. Counts by limit: 9 -> 2 ([6,1,1,1] [1,6,1,1]),
    # 8 -> 3 ([6,1,1] [1,1,6] [1,1]), so the largest limit with >= 3 ranges is 8.
    # (An even split would be [0,1] [2,4] [5,7].)
    got = ranges_by_bytes([6, 1, 1, 1, 1, 6, 1, 1], ParallelismBounds(3, 8, 100))
    assert got == _r((0, 2), (3, 5), (6, 7))


def test_a_count_jumping_past_min_splits_the_largest_ranges_until_min() -> None:
    # limit 199 -> 8 ranges, 200 -> 4 (two each): more than min 5 either way below. The 4
    # ranges of 200, the largest (the first of equals) split in two until there are 5.
    assert ranges_by_bytes([100] * 8, ParallelismBounds(5, 8, 10_000)) == _r(
        (0, 0), (1, 1), (2, 3), (4, 5), (6, 7)
    )
    # Uneven: [0,1]=201 [2,3]=199 [4,5]=202 [6,7]=198; [4,5] is split, then [0,1].
    got = ranges_by_bytes([100, 101, 99, 100, 100, 102, 100, 98], ParallelismBounds(6, 8, 10_000))
    assert got == _r((0, 0), (1, 1), (2, 3), (4, 4), (5, 5), (6, 7))


def test_a_split_cuts_where_half_the_bytes_lie_before() -> None:
    # limit 10 -> [4,0,0,6] [5,5]: 2 < min 3; limit 9 -> 4 ranges. [4,0,0,6] (10 bytes, the
    # first of equals) is cut before its 6: the first boundary with 5 bytes or more before.
    got = ranges_by_bytes([4, 0, 0, 6, 5, 5], ParallelismBounds(3, 8, 10))
    assert got == _r((0, 2), (3, 3), (4, 5))


def test_downward_bisection_can_reach_one_range_per_subpartition() -> None:
    # limit 100 -> 1 < min'=min(4, 2)=2; limit 9 -> [0] [1].
    assert ranges_by_bytes([5, 5], ParallelismBounds(4, 8, 100)) == _r((0, 0), (1, 1))


def test_count_jumping_over_the_bounds_falls_back_to_an_even_split() -> None:
    # min=max=3; limit 1 -> 4 ranges, limit 2 -> 2: no limit gives 3, so an even split into
    # clamp(ceil(4/1)=4, 3, 3)=3: [0,0] [1,1] [2,3].
    assert ranges_by_bytes([1, 1, 1, 1], ParallelismBounds(3, 3, 1)) == _r((0, 0), (1, 1), (2, 3))


def test_too_few_useful_splits_fall_back_to_an_even_split() -> None:
    # Even limit 0 gives [0,2] (empties together) and [3]: 2 < min 3 -> even split into
    # clamp(ceil(10/10)=1, 3, 4) = 3: [0,0] [1,1] [2,3].
    got = ranges_by_bytes([0, 0, 0, 10], ParallelismBounds(3, 4, 10))
    assert got == _r((0, 0), (1, 1), (2, 3))


@pytest.mark.parametrize("values", [[], [1, -1]])
def test_ranges_by_bytes_rejects_no_subpartitions_or_negative_bytes(values: list[int]) -> None:
    with pytest.raises(InvalidOperationError):
        ranges_by_bytes(values, ParallelismBounds(1, 1, 1))


# --- ranges_by_bytes_in_runs ---------------------------------------------------------------


def test_runs_ranges_never_cross_the_gaps_between_runs() -> None:
    # The 100 at 2 is outside the runs; limit 4 would otherwise merge across it.
    got = ranges_by_bytes_in_runs(
        [2, 2, 100, 2, 2], _r((0, 1), (3, 4)), ParallelismBounds(1, 10, 4)
    )
    assert got == _r((0, 1), (3, 4))


def test_fixed_tasks_count_toward_max_parallelism() -> None:
    values = [1, 1, 1, 1, 50, 1, 1, 1, 1]
    runs = _r((0, 3), (5, 8))
    bounds = ParallelismBounds(1, 4, 1)
    # No fixed tasks: smallest limit with <= 4 ranges is 2 -> pairs.
    assert ranges_by_bytes_in_runs(values, runs, bounds) == _r((0, 1), (2, 3), (5, 6), (7, 8))
    # 2 fixed tasks leave 2: limit 3 still gives 2+2, limit 4 gives one range per run.
    assert ranges_by_bytes_in_runs(values, runs, bounds, fixed_tasks=2) == _r((0, 3), (5, 8))


def test_fixed_tasks_beyond_max_leave_one_range_per_run() -> None:
    # 3 fixed > max 1: one range per run is the fewest; the total (5) exceeds max.
    got = ranges_by_bytes_in_runs(
        [1, 1, 1, 1, 50, 1, 1, 1, 1], _r((0, 3), (5, 8)), ParallelismBounds(1, 4, 1), fixed_tasks=3
    )
    assert got == _r((0, 3), (5, 8))


def test_even_split_fallback_shares_ranges_among_runs_by_length() -> None:
    # All zero: greedy gives 1 per run = 2 < min 4 -> 4 ranges shared by length 2 and 6:
    # 1 each, then to the run with the largest pieces: 6/1 -> 2, then 6/2=3 > 2/1 -> 3.
    got = ranges_by_bytes_in_runs([0] * 9, _r((0, 1), (3, 8)), ParallelismBounds(4, 8, 10))
    assert got == _r((0, 1), (3, 4), (5, 6), (7, 8))


def test_no_runs_give_no_ranges() -> None:
    assert ranges_by_bytes_in_runs([5, 5], (), ParallelismBounds(1, 4, 1)) == ()


@pytest.mark.parametrize(
    "runs", [_r((0, 1), (1, 2)), _r((2, 3), (0, 1)), _r((0, 5))], ids=["overlap", "order", "out"]
)
def test_runs_must_be_disjoint_ascending_and_in_range(runs: tuple[SubpartitionRange, ...]) -> None:
    with pytest.raises(InvalidOperationError, match="runs must be"):
        ranges_by_bytes_in_runs([1, 1, 1, 1], runs, ParallelismBounds(1, 4, 1))


# --- against a brute-force reading of the rule ---------------------------------------------


def _greedy(values: list[int], limit: int) -> list[tuple[int, int]]:
    ranges: list[tuple[int, int]] = []
    start, size = 0, 0
    for index, value in enumerate(values):
        if index > start and size + value > limit:
            ranges.append((start, index - 1))
            start, size = index, 0
        size += value
    ranges.append((start, len(values) - 1))
    return ranges


def _split_until(
    values: list[int], ranges: list[tuple[int, int]], wanted: int
) -> list[tuple[int, int]]:
    """The range of the most bytes (the first of equals) split where half its bytes or more
    lie before, until there are ``wanted``."""
    while len(ranges) < wanted:
        splittable = [r for r in ranges if r[1] > r[0]]
        start, end = max(splittable, key=lambda r: (sum(values[r[0] : r[1] + 1]), -r[0]))
        total = sum(values[start : end + 1])
        cut = next((c for c in range(start + 1, end) if 2 * sum(values[start:c]) >= total), end)
        at = ranges.index((start, end))
        ranges[at : at + 1] = [(start, cut - 1), (cut, end)]
    return ranges


def _reference(values: list[int], bounds: ParallelismBounds) -> list[tuple[int, int]]:
    """The rule with every limit tried in turn instead of bisection."""
    total, n = sum(values), len(values)
    low, high, per_task = (
        min(bounds.min_parallelism, n),
        bounds.max_parallelism,
        bounds.bytes_per_task,
    )
    found = _greedy(values, per_task)
    if low <= len(found) <= high:
        return found
    if len(found) > high:
        limit = next(x for x in range(per_task, total + 1) if len(_greedy(values, x)) <= high)
        if len(_greedy(values, limit)) >= low:
            return _greedy(values, limit)
    else:
        reaching = [x for x in range(per_task + 1) if len(_greedy(values, x)) >= low]
        if reaching and len(_greedy(values, max(reaching))) > low:
            return _split_until(values, _greedy(values, max(reaching) + 1), low)
        if reaching and len(_greedy(values, max(reaching))) <= high:
            return _greedy(values, max(reaching))
    wanted = min(max(low, min(-(-total // per_task), high)), n)
    return [(k * n // wanted, (k + 1) * n // wanted - 1) for k in range(wanted)]


def test_ranges_match_a_brute_force_search_over_every_limit() -> None:
    fallbacks = 0
    for seed in range(400):
        rng = numpy.random.default_rng(seed)
        n = int(rng.integers(1, 12))
        values = [int(v) for v in rng.integers(0, 12, size=n)]
        values = [v if rng.random() > 0.3 else 0 for v in values]
        low = int(rng.integers(1, 8))
        bounds = ParallelismBounds(low, low + int(rng.integers(0, 4)), int(rng.integers(1, 20)))
        expected = _reference(values, bounds)
        got = ranges_by_bytes(values, bounds)
        assert [(r.start, r.end) for r in got] == expected, (seed, values, bounds)
        fallbacks += expected != _greedy(values, bounds.bytes_per_task) and all(
            expected != _greedy(values, limit) for limit in range(sum(values) + 1)
        )
    # The cases must include the even-split fallback, or the comparison proves less.
    assert fallbacks > 10
