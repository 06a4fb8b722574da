"""Consumer (reduce) parallelism from the bytes produced, after Flink 1.17+'s adaptive batch
scheduler ("all-to-all even distribution"; reference, section 6).

Consumers read contiguous subpartition ranges, so range-partitioned data stays in order.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from shuffle_api import ConfigError, InvalidOperationError, SubpartitionRange

__all__ = [
    "ParallelismBounds",
    "ranges_by_bytes",
    "ranges_by_bytes_in_runs",
    "split_evenly",
]


@dataclass(frozen=True, slots=True)
class ParallelismBounds:
    """Consumer parallelism must land in ``[min_parallelism, max_parallelism]``; each consumer
    should read about ``bytes_per_task`` bytes."""

    min_parallelism: int
    max_parallelism: int
    bytes_per_task: int

    def __post_init__(self) -> None:
        for name in ("min_parallelism", "max_parallelism", "bytes_per_task"):
            value = getattr(self, name)
            # bool is an int subclass; True as a parallelism is a bug at the call site.
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"ParallelismBounds.{name} must be an int, got {value!r}")
        if self.min_parallelism < 1:
            raise ConfigError(
                f"ParallelismBounds.min_parallelism must be >= 1, got {self.min_parallelism}"
            )
        if self.max_parallelism < self.min_parallelism:
            raise ConfigError(
                f"ParallelismBounds.max_parallelism must be >= min_parallelism "
                f"({self.min_parallelism}), got {self.max_parallelism}"
            )
        if self.bytes_per_task < 1:
            raise ConfigError(
                f"ParallelismBounds.bytes_per_task must be >= 1, got {self.bytes_per_task}"
            )


def split_evenly(subpartitions: int, consumers: int) -> tuple[SubpartitionRange, ...]:
    """Consumer ``k`` of ``N`` reads ``[floor(k*S/N), floor((k+1)*S/N) - 1]`` of ``S``
    subpartitions; needs ``1 <= N <= S`` so that no consumer reads nothing."""
    if consumers < 1 or consumers > subpartitions:
        raise InvalidOperationError(
            f"cannot split {subpartitions} subpartitions evenly among {consumers} consumers: "
            "need 1 <= consumers <= subpartitions"
        )
    return tuple(
        SubpartitionRange(k * subpartitions // consumers, (k + 1) * subpartitions // consumers - 1)
        for k in range(consumers)
    )


def ranges_by_bytes(
    bytes_per_subpartition: Sequence[int], bounds: ParallelismBounds
) -> tuple[SubpartitionRange, ...]:
    """Contiguous ranges covering every subpartition once, each holding about
    ``bounds.bytes_per_task`` bytes, their number within the bounds when the data allows.

    Greedy: a range grows while its bytes stay within a limit (it always holds at least one
    subpartition). The limit starts at ``bytes_per_task`` and is bisected up (too many ranges)
    or down (too few) to the nearest limit whose count lands in ``[min, max]``; ``min`` is
    capped at the number of subpartitions. Where the count jumps from below ``min`` to above
    it (near-equal subpartitions), the ranges below are cut and the largest split in two
    until there are ``min``. If no limit lands, an even split by count into
    ``clamp(ceil(total / bytes_per_task), min, max)`` ranges. O(S log total).
    """
    values = _checked_bytes(bytes_per_subpartition)
    return ranges_by_bytes_in_runs(values, (SubpartitionRange(0, len(values) - 1),), bounds)


def ranges_by_bytes_in_runs(
    bytes_per_subpartition: Sequence[int],
    runs: Sequence[SubpartitionRange],
    bounds: ParallelismBounds,
    *,
    fixed_tasks: int = 0,
) -> tuple[SubpartitionRange, ...]:
    """:func:`ranges_by_bytes` over only the subpartitions in ``runs`` (disjoint, ascending);
    no range crosses a run's end. ``fixed_tasks`` consumers decided elsewhere (e.g. split
    skewed subpartitions) count toward ``[min, max]``, so these ranges aim at
    ``[min - fixed_tasks, max - fixed_tasks]``; there is at least one range per run, so the
    total can exceed ``max`` when ``fixed_tasks + len(runs) > max``.
    """
    values = _checked_bytes(bytes_per_subpartition)
    _check_runs(runs, len(values))
    if fixed_tasks < 0:
        raise InvalidOperationError(f"fixed_tasks must be >= 0, got {fixed_tasks}")
    if not runs:
        return ()
    prefix = [0, *itertools.accumulate(values)]
    # Each run's own prefix sums: ranges are cut per run, never across a gap.
    run_prefixes = [prefix[run.start : run.end + 2] for run in runs]
    covered = sum(len(run) for run in runs)
    total = sum(p[-1] - p[0] for p in run_prefixes)
    low = min(bounds.min_parallelism - fixed_tasks, covered)
    high = bounds.max_parallelism - fixed_tasks

    def count(limit: int) -> int:
        return sum(len(_greedy_ends(p, limit)) for p in run_prefixes)

    limit: int | None = bounds.bytes_per_task
    found = count(bounds.bytes_per_task)
    if found > high:
        # A limit of `total` leaves one range per run: the fewest there can be.
        if len(runs) > high:
            limit = None
        else:
            # count(bytes_per_task) > high >= count(total).
            hi = _first_limit(lambda limit: count(limit) <= high, bounds.bytes_per_task, total)
            limit = hi if count(hi) >= low else None
    elif found < low:
        # A limit of 0 gives the most ranges greedy can make (empty neighbours still merge).
        if count(0) < low:
            limit = None
        else:
            # count(0) >= low > count(bytes_per_task); the search ends with lo = hi - 1.
            hi = _first_limit(lambda limit: count(limit) < low, 0, bounds.bytes_per_task)
            lo = hi - 1
            if count(lo) > low:
                # The count jumps past min (near-equal subpartitions: 8 even ones give 4
                # ranges, then 8): the fewer, larger ranges, the largest split until min.
                return _split_largest(_cut(runs, run_prefixes, hi), prefix, low)
            limit = lo if count(lo) <= high else None

    if limit is not None:
        return tuple(_cut(runs, run_prefixes, limit))

    # No limit lands in the bounds: split by subpartition count instead, ignoring bytes.
    wanted = max(low, min(-(-total // bounds.bytes_per_task), high))
    return _split_runs_evenly(runs, max(len(runs), min(wanted, covered)))


def _first_limit(fits: Callable[[int], bool], lo: int, hi: int) -> int:
    """Bisection: the smallest limit in ``(lo, hi]`` at which ``fits`` holds, given that it
    fails at ``lo``, holds at ``hi`` and, the range count being non-increasing in the limit,
    never fails again once it holds."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return hi


def _split_runs_evenly(
    runs: Sequence[SubpartitionRange], wanted: int
) -> tuple[SubpartitionRange, ...]:
    """``wanted`` ranges (at least one per run) by subpartition count, shared among the runs
    by their length and each run split evenly."""
    ranges: list[SubpartitionRange] = []
    shares = _apportion([len(run) for run in runs], wanted)
    for run, share in zip(runs, shares, strict=True):
        for local in split_evenly(len(run), share):
            ranges.append(SubpartitionRange(run.start + local.start, run.start + local.end))
    return tuple(ranges)


def _cut(
    runs: Sequence[SubpartitionRange], run_prefixes: list[list[int]], limit: int
) -> list[SubpartitionRange]:
    """The greedy ranges of each run at ``limit``."""
    ranges: list[SubpartitionRange] = []
    for run, run_prefix in zip(runs, run_prefixes, strict=True):
        start = 0
        for end in _greedy_ends(run_prefix, limit):
            ranges.append(SubpartitionRange(run.start + start, run.start + end - 1))
            start = end
    return ranges


def _split_largest(
    ranges: list[SubpartitionRange], prefix: list[int], wanted: int
) -> tuple[SubpartitionRange, ...]:
    """``ranges`` with the one of the most bytes (of two subpartitions or more; the first of
    equals) split in two, at the first boundary with half its bytes or more before it, until
    there are ``wanted``: no range grows."""

    def entry(start: int, end: int) -> tuple[int, int, int]:
        return prefix[start] - prefix[end + 1], start, end  # the most bytes first

    single = [r for r in ranges if r.start == r.end]
    heap = [entry(r.start, r.end) for r in ranges if r.start < r.end]
    heapq.heapify(heap)
    while heap and len(single) + len(heap) < wanted:
        _, start, end = heapq.heappop(heap)
        middle = -(-(prefix[start] + prefix[end + 1]) // 2)  # the prefix sum there
        cut = min(bisect.bisect_left(prefix, middle, start + 1, end + 1), end)
        for half_start, half_end in ((start, cut - 1), (cut, end)):
            if half_start == half_end:
                single.append(SubpartitionRange(half_start, half_end))
            else:
                heapq.heappush(heap, entry(half_start, half_end))
    split = single + [SubpartitionRange(start, end) for _, start, end in heap]
    return tuple(sorted(split, key=lambda r: r.start))


def _checked_bytes(bytes_per_subpartition: Sequence[int]) -> list[int]:
    values = [int(value) for value in bytes_per_subpartition]
    if not values:
        raise InvalidOperationError("no subpartitions: need at least one to plan consumers")
    negative = next((i for i, value in enumerate(values) if value < 0), None)
    if negative is not None:
        raise InvalidOperationError(
            f"subpartition {negative} has negative bytes ({values[negative]})"
        )
    return values


def _check_runs(runs: Sequence[SubpartitionRange], subpartitions: int) -> None:
    previous_end = -1
    for run in runs:
        if run.start <= previous_end or run.end >= subpartitions:
            raise InvalidOperationError(
                f"runs must be disjoint, ascending and within {subpartitions} subpartitions; "
                f"got [{run.start}, {run.end}] after a run ending at {previous_end}"
            )
        previous_end = run.end


def _greedy_ends(prefix: list[int], limit: int) -> list[int]:
    """Exclusive ends of the greedy ranges over the values whose prefix sums are ``prefix``:
    a range grows while its bytes stay <= ``limit`` and always holds one value."""
    n = len(prefix) - 1
    ends: list[int] = []
    start = 0
    while start < n:
        cap = prefix[start] + limit
        # Gallop, then bisect: a range of length L costs O(log L), so a count costs O(S).
        lo, step = start + 1, 1
        hi = lo + 1
        while hi <= n and prefix[hi] <= cap:
            lo = hi
            step *= 2
            hi = lo + step
        end = max(lo, bisect.bisect_right(prefix, cap, lo, min(hi, n + 1)) - 1)
        ends.append(end)
        start = end
    return ends


def _apportion(lengths: list[int], pieces: int) -> list[int]:
    """``pieces`` shared among runs of ``lengths`` (each gets 1..its length), each next piece
    to the run whose pieces are currently the largest, so pieces come out about equal."""
    shares = [1] * len(lengths)
    heap = [(-Fraction(length, 1), index) for index, length in enumerate(lengths) if length > 1]
    heapq.heapify(heap)
    for _ in range(pieces - len(lengths)):
        _, index = heapq.heappop(heap)
        shares[index] += 1
        if shares[index] < lengths[index]:
            heapq.heappush(heap, (-Fraction(lengths[index], shares[index]), index))
    return shares
