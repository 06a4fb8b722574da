"""ConsumedPartitionGroup / ConsumerVertexGroup pairs: one per all-to-all exchange, one per
distinct range of a pointwise exchange, and O(1) readiness."""

from __future__ import annotations

from scheduling.graph import ExecutionVertexID, Stage, StageExchange, StageGraph
from scheduling.groups import build_groups
from shuffle_api import DistributionPattern

POINTWISE = DistributionPattern.POINTWISE


def _two_stages(producers: int, consumers: int, pattern: DistributionPattern) -> StageGraph:
    return StageGraph(
        [Stage("map", producers), Stage("reduce", consumers)],
        [StageExchange("shuffled", "map", "reduce", pattern)],
    )


def _pairs(producers: int, consumers: int) -> list[tuple[list[int], list[int]]]:
    [groups] = build_groups(_two_stages(producers, consumers, POINTWISE)).exchanges
    return [
        (list(consumed.partitions), list(readers.consumers))
        for consumed, readers in zip(groups.consumed, groups.consumer_groups, strict=True)
    ]


def test_an_all_to_all_exchange_is_exactly_one_group_pair() -> None:
    partition_groups = build_groups(_two_stages(10_000, 10_000, DistributionPattern.ALL_TO_ALL))
    [groups] = partition_groups.exchanges
    assert len(groups.consumed) == len(groups.consumer_groups) == 1
    assert groups.consumed[0].partitions == range(10_000)
    assert groups.consumer_groups[0].consumers == range(10_000)
    assert groups.consumed[0].number_of_consumers == 10_000
    # Every consumer shares the one object.
    assert groups.consumed_by(0) is groups.consumed_by(9_999) is groups.group_of_partition(42)


def test_pointwise_groups_with_more_producers_pair_each_consumer_with_its_range() -> None:
    assert _pairs(10, 3) == [([0, 1, 2], [0]), ([3, 4, 5], [1]), ([6, 7, 8, 9], [2])]


def test_pointwise_groups_with_fewer_producers_pair_each_partition_with_its_consumers() -> None:
    assert _pairs(3, 10) == [([0], [0, 1, 2, 3]), ([1], [4, 5, 6]), ([2], [7, 8, 9])]


def test_pointwise_groups_with_equal_sides_are_one_to_one() -> None:
    assert _pairs(3, 3) == [([0], [0]), ([1], [1]), ([2], [2])]


def test_lookups_agree_with_the_pairs() -> None:
    for producers, consumers in [(10, 3), (3, 10), (7, 7), (1, 5), (5, 1)]:
        [groups] = build_groups(_two_stages(producers, consumers, POINTWISE)).exchanges
        for consumer in range(consumers):
            group = groups.consumed_by(consumer)
            readers = groups.consumer_groups[groups.consumed.index(group)]
            assert consumer in readers.consumers
            for partition in group.partitions:
                assert groups.group_of_partition(partition) is group


def test_a_group_is_ready_when_its_last_partition_finishes_and_counts_each_once() -> None:
    partition_groups = build_groups(_two_stages(3, 2, DistributionPattern.ALL_TO_ALL))
    [group] = partition_groups.exchanges[0].consumed
    assert partition_groups.partition_finished("shuffled", 0) == []
    assert partition_groups.partition_finished("shuffled", 0) == []  # a duplicate report
    assert group.unfinished == 2
    assert partition_groups.partition_finished("shuffled", 2) == []
    assert partition_groups.partition_finished("shuffled", 1) == [group]
    assert group.is_ready
    partition_groups.partition_unfinished("shuffled", 1)  # its producer is rerun
    assert not group.is_ready
    assert group.unfinished == 1
    assert not partition_groups.is_finished("shuffled", 1)


def test_a_result_read_by_two_stages_has_a_group_in_each_exchange() -> None:
    graph = StageGraph(
        [Stage("map", 4), Stage("left", 2), Stage("right", 4)],
        [
            StageExchange("shuffled", "map", "left", POINTWISE),
            StageExchange("shuffled", "map", "right", DistributionPattern.ALL_TO_ALL),
        ],
    )
    partition_groups = build_groups(graph)
    holders = partition_groups.groups_of_partition("shuffled", 3)
    assert [list(group.partitions) for group in holders] == [[2, 3], [0, 1, 2, 3]]
    ready = [partition_groups.partition_finished("shuffled", p) for p in (2, 3)]
    assert ready[0] == [] and ready[1] == [holders[0]]
    assert partition_groups.consumed_by(ExecutionVertexID("right", 0)) == [holders[1]]
