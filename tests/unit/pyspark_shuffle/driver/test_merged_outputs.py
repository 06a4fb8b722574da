"""The rules of one exchange's merged partitions (``MergedOutputs``), without Spark: a merged
partition is read only while it holds the registered attempt of every map task in it, in the
place of those map outputs, and never once lost or released."""

from __future__ import annotations

import pytest

from pyspark_shuffle.driver.merged_outputs import MergedOutput, MergedOutputs, merge_groups
from shuffle_api import (
    IntermediateResultPartitionID,
    InvalidOperationError,
    ResultPartitionID,
    ShuffleDescriptor,
    UnknownShuffleDescriptor,
)

RESULT = "r1"
MAPS = 7


def _descriptor(index: int, attempt: str) -> ShuffleDescriptor:
    return UnknownShuffleDescriptor(
        ResultPartitionID(IntermediateResultPartitionID(RESULT, index), attempt)
    )


OUTPUTS = tuple(_descriptor(index, "first") for index in range(MAPS))
REGISTERED = dict.fromkeys(range(MAPS), "first")


def _merged(group: int, maps: range | tuple[int, ...], attempt: str = "first") -> MergedOutput:
    return MergedOutput(_descriptor(MAPS + group, "merge"), tuple(maps), (attempt,) * len(maps))


def _indexes(read: tuple[ShuffleDescriptor, ...]) -> list[int]:
    return [each.result_partition_id.partition_id.partition_index for each in read]


def test_merged_partitions_take_the_place_of_the_outputs_they_hold_in_map_order() -> None:
    merged = MergedOutputs()
    assert merged.add(_merged(0, range(0, 3)), REGISTERED)
    assert merged.add(_merged(1, range(4, 6)), REGISTERED)
    # Map 3 and 6 unmerged (their merge task did not merge them): read where they were.
    assert _indexes(merged.read_order(OUTPUTS)) == [MAPS, 3, MAPS + 1, 6]
    assert len(merged) == 2


def test_nothing_merged_reads_the_map_outputs() -> None:
    assert MergedOutputs().read_order(OUTPUTS) == OUTPUTS


def test_a_merge_of_attempts_no_longer_registered_is_refused() -> None:
    merged = MergedOutputs()
    rerun = {**REGISTERED, 1: "rerun"}
    assert not merged.add(_merged(0, range(0, 3)), rerun)
    assert merged.read_order(OUTPUTS) == OUTPUTS


def test_overlapping_merges_are_refused() -> None:
    merged = MergedOutputs()
    assert merged.add(_merged(0, range(0, 3)), REGISTERED)
    assert not merged.add(_merged(1, range(2, 5)), REGISTERED)
    assert _indexes(merged.read_order(OUTPUTS)) == [MAPS, 3, 4, 5, 6]


def test_a_rerun_map_task_sends_its_merged_partition_back_to_its_sources() -> None:
    """A rerun's rows are read from its own output, never twice (its old attempt in the
    merged partition, and the new one)."""
    merged = MergedOutputs()
    first, second = _merged(0, range(0, 3)), _merged(1, range(3, 7))
    assert merged.add(first, REGISTERED)
    assert merged.add(second, REGISTERED)
    assert merged.stale(REGISTERED) == []
    assert merged.stale({**REGISTERED, 4: "rerun"}) == [second]
    assert _indexes(merged.read_order(OUTPUTS)) == [MAPS, 3, 4, 5, 6]


def test_a_lost_merged_partition_is_forgotten_and_its_sources_read() -> None:
    merged = MergedOutputs()
    first, second = _merged(0, range(0, 3)), _merged(1, range(3, 7))
    assert merged.add(first, REGISTERED)
    assert merged.add(second, REGISTERED)
    lost = {first.descriptor.result_partition_id, OUTPUTS[5].result_partition_id}
    assert merged.lost(lost) == [first]
    assert _indexes(merged.read_order(OUTPUTS)) == [0, 1, 2, MAPS + 1]
    assert merged.release() == [second]
    assert merged.release() == []
    assert merged.read_order(OUTPUTS) == OUTPUTS


@pytest.mark.parametrize("maps", [(), (2, 0), (1, 1)])
def test_a_merged_partition_holds_map_tasks_in_map_order(maps: tuple[int, ...]) -> None:
    with pytest.raises(InvalidOperationError):
        MergedOutput(_descriptor(MAPS, "merge"), maps, ("first",) * len(maps))


def test_a_merged_partition_names_an_attempt_for_each_map_task() -> None:
    with pytest.raises(InvalidOperationError):
        MergedOutput(_descriptor(MAPS, "merge"), (0, 1, 2), ("first",))


def test_merged_partitions_of_map_tasks_apart_read_where_their_first_was() -> None:
    """Groups of one site each (map outputs placed on workers in turn): each merged partition
    stands where its first map output stood, and the outputs it holds are read nowhere else."""
    merged = MergedOutputs()
    assert merged.add(_merged(0, (0, 2, 4)), REGISTERED)
    assert merged.add(_merged(1, (1, 5)), REGISTERED)
    assert not merged.add(_merged(2, (3, 4)), REGISTERED)  # 4 is merged already
    assert _indexes(merged.read_order(OUTPUTS)) == [MAPS, MAPS + 1, 3, 6]


@pytest.mark.parametrize(
    ("sites", "tasks", "groups"),
    [
        ([None] * 7, 2, [(0, 1, 2, 3), (4, 5, 6)]),
        ([None] * 3, 8, [(0,), (1,), (2,)]),
        (["a", "b", "a", "b", "a"], 2, [(0, 2, 4), (1, 3)]),
        (["a", "b", "a", "b", "a", "a"], 3, [(0, 2), (4, 5), (1, 3)]),
        ([], 2, []),
    ],
)
def test_merge_groups_are_of_one_site_each_about_a_task_s_share(
    sites: list[str | None], tasks: int, groups: list[tuple[int, ...]]
) -> None:
    assert merge_groups(sites, tasks) == groups


def test_a_merged_partition_names_its_sources_in_merged_order() -> None:
    merged = MergedOutputs()
    first, second = _merged(0, (0, 2, 4)), _merged(1, (5, 6))
    assert merged.add(first, REGISTERED)
    assert merged.add(second, REGISTERED)
    assert merged.sources(OUTPUTS) == {
        first.descriptor.result_partition_id: (OUTPUTS[0], OUTPUTS[2], OUTPUTS[4]),
        second.descriptor.result_partition_id: (OUTPUTS[5], OUTPUTS[6]),
    }
    merged.release()
    assert merged.sources(OUTPUTS) == {}
