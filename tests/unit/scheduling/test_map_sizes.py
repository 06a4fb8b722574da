"""A map output's sizes as the driver keeps them: totals exact, large blocks exact, the rest
estimated, in O(1) numbers and a bit per block."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from scheduling.map_sizes import ACCURATE_BLOCKS, MapSizes
from shuffle_api import PartitionStatistics


def _statistics(stored: list[int], arrow: list[int] | None = None) -> PartitionStatistics:
    arrow = arrow if arrow is not None else [2 * size for size in stored]
    return PartitionStatistics(tuple(1 if s else 0 for s in stored), tuple(stored), tuple(arrow))


def test_totals_are_exact_and_the_estimate_adds_up_to_them() -> None:
    rng = np.random.default_rng(7)
    stored = rng.integers(0, 1_000, 3_000).tolist()
    arrow = [size * 3 + 1 if size else 0 for size in stored]
    statistics = _statistics(stored, arrow)
    sizes = MapSizes.of(statistics)
    assert (sizes.rows, sizes.stored_bytes, sizes.arrow_bytes) == (
        statistics.total_rows,
        sum(stored),
        sum(arrow),
    )
    estimated_stored, estimated_arrow = sizes.estimate()
    assert int(estimated_stored.sum()) == sum(stored)
    assert int(estimated_arrow.sum()) == sum(arrow)


def test_empty_blocks_stay_empty_and_written_ones_weigh_something() -> None:
    stored = [0, 5, 0, 7, 6, 0, 0, 5]
    estimated, _ = MapSizes.of(_statistics(stored)).estimate()
    assert [bool(size) for size in estimated] == [bool(size) for size in stored]


def test_the_blocks_that_skew_a_subpartition_are_exact() -> None:
    stored = [100] * 1_000
    stored[17], stored[600] = 90_000, 5_000
    estimated, arrow = MapSizes.of(_statistics(stored)).estimate()
    assert (estimated[17], estimated[600]) == (90_000, 5_000)
    assert (arrow[17], arrow[600]) == (180_000, 10_000)
    assert set(estimated[np.r_[0:17, 18:600, 601:1_000]].tolist()) == {100}


def test_at_most_the_largest_blocks_are_kept_exactly() -> None:
    stored = [1] * 10_000
    for index in range(0, 10_000, 20):  # 500 large blocks, of rising sizes
        stored[index] = 1_000 + index
    sizes = MapSizes.of(_statistics(stored))
    assert len(sizes.accurate) == 24 * ACCURATE_BLOCKS
    estimated, _ = sizes.estimate()
    kept = sorted(range(0, 10_000, 20), key=lambda index: stored[index])[-ACCURATE_BLOCKS:]
    assert all(estimated[index] == stored[index] for index in kept)
    assert int(estimated.sum()) == sum(stored)


@pytest.mark.parametrize("subpartitions", [0, 1, 9, 4_000])
def test_encoding_gives_back_the_same_sizes(subpartitions: int) -> None:
    rng = np.random.default_rng(subpartitions)
    stored = (rng.integers(0, 3, subpartitions) * rng.integers(1, 2**40, subpartitions)).tolist()
    sizes = MapSizes.of(_statistics(stored))
    assert MapSizes.decode(sizes.encode()) == sizes


def test_what_the_driver_keeps_does_not_grow_with_written_subpartitions() -> None:
    small, large = (
        MapSizes.of(_statistics([3] * subpartitions)).encode() for subpartitions in (100, 100_000)
    )
    assert len(large) - len(small) < 64


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[:10],
        lambda data: data[:-1],
        lambda data: data + b"x",
        lambda data: (1 << 30).to_bytes(4, "little") + data[4:],  # too many subpartitions
        lambda data: data[:28] + (ACCURATE_BLOCKS + 1).to_bytes(4, "little") + data[32:],
        lambda data: data[:36] + (10**6).to_bytes(8, "little") + data[44:],  # index past R
        lambda data: data[:36] + (-1).to_bytes(8, "little", signed=True) + data[44:],
        lambda data: data[:44] + (10**12).to_bytes(8, "little") + data[52:],  # above the total
        lambda data: data[:60] + b"\x00\x00\x00\x00" + data[64:],  # a mask not in zstd
    ],
)
def test_damaged_sizes_are_refused(damage: Callable[[bytes], bytes]) -> None:
    stored = [10] * 50
    stored[3] = 10_000
    data = MapSizes.of(_statistics(stored)).encode()
    with pytest.raises(ValueError):
        MapSizes.decode(damage(data))
