"""``scheduling.pointwise``: the partitions each consumer of a pointwise exchange reads,
and the consumers each partition feeds."""

from __future__ import annotations

import pytest

from scheduling.pointwise import consumers_of_partition, partitions_of_consumer
from shuffle_api import InvalidOperationError


def test_pointwise_formulas_with_more_producers_than_consumers() -> None:
    # S=10, T=3: consumer i reads [floor(10i/3), floor(10(i+1)/3) - 1].
    assert [list(partitions_of_consumer(i, 10, 3)) for i in range(3)] == [
        [0, 1, 2],
        [3, 4, 5],
        [6, 7, 8, 9],
    ]
    assert [consumers_of_partition(p, 10, 3).start for p in range(10)] == [
        0, 0, 0, 1, 1, 1, 2, 2, 2, 2,
    ]  # fmt: skip


def test_pointwise_formulas_with_fewer_producers_than_consumers() -> None:
    # S=3, T=10: partition p feeds [ceil(10p/3), ceil(10(p+1)/3) - 1].
    assert [list(consumers_of_partition(p, 3, 10)) for p in range(3)] == [
        [0, 1, 2, 3],
        [4, 5, 6],
        [7, 8, 9],
    ]
    assert [partitions_of_consumer(i, 3, 10).start for i in range(10)] == [
        0, 0, 0, 0, 1, 1, 1, 2, 2, 2,
    ]  # fmt: skip


def test_pointwise_formulas_reject_an_index_outside_the_stage() -> None:
    with pytest.raises(InvalidOperationError, match="consumer 3 outside"):
        partitions_of_consumer(3, 10, 3)
    with pytest.raises(InvalidOperationError, match="partition 5 outside"):
        consumers_of_partition(5, 3, 10)
