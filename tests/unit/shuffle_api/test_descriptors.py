"""``shuffle_api.descriptors``: descriptor invariants, subpartition ranges, and Flink's
partition type table."""

from __future__ import annotations

import dataclasses

import pytest

from shuffle_api import (
    DistributionPattern,
    InputGateDeploymentDescriptor,
    IntermediateResultPartitionID,
    InvalidIdentifierError,
    PartitionDescriptor,
    ProducerDescriptor,
    ResultPartitionDeploymentDescriptor,
    ResultPartitionID,
    ResultPartitionType,
    SubpartitionRange,
    UnknownShuffleDescriptor,
)
from shuffle_api.descriptors import ConsumingConstraint, ReleaseBy

# --- PartitionDescriptor -------------------------------------------------------------------


def make_partition_descriptor(
    *,
    result_id: str = "result",
    partition_id: IntermediateResultPartitionID | None = None,
    total: int = 4,
    subpartitions: int = 3,
) -> PartitionDescriptor:
    return PartitionDescriptor(
        result_id=result_id,
        total_number_of_partitions=total,
        partition_id=partition_id or IntermediateResultPartitionID(result_id, 0),
        partition_type=ResultPartitionType.BLOCKING,
        number_of_subpartitions=subpartitions,
    )


def test_partition_descriptor_accepts_a_partition_of_its_result() -> None:
    descriptor = make_partition_descriptor(
        partition_id=IntermediateResultPartitionID("result", 3), total=4
    )

    assert descriptor.partition_id.partition_index == 3
    assert descriptor.is_all_to_all_distribution
    assert descriptor.distribution_pattern is DistributionPattern.ALL_TO_ALL


def test_partition_descriptor_rejects_a_partition_of_another_result() -> None:
    with pytest.raises(InvalidIdentifierError, match="other"):
        make_partition_descriptor(partition_id=IntermediateResultPartitionID("other", 0))


@pytest.mark.parametrize("subpartitions", [0, -1])
def test_partition_descriptor_rejects_fewer_than_one_subpartition(subpartitions: int) -> None:
    with pytest.raises(InvalidIdentifierError, match="number_of_subpartitions"):
        make_partition_descriptor(subpartitions=subpartitions)


@pytest.mark.parametrize(("index", "total"), [(4, 4), (5, 4), (0, 0)])
def test_partition_descriptor_rejects_an_index_at_or_past_the_total(index: int, total: int) -> None:
    with pytest.raises(InvalidIdentifierError, match=f"partition index {index}"):
        make_partition_descriptor(
            partition_id=IntermediateResultPartitionID("result", index), total=total
        )


def test_partition_descriptor_rejects_an_unsafe_result_id() -> None:
    with pytest.raises(InvalidIdentifierError):
        PartitionDescriptor(
            result_id="a/b",
            total_number_of_partitions=1,
            partition_id=IntermediateResultPartitionID("result", 0),
            partition_type=ResultPartitionType.BLOCKING,
            number_of_subpartitions=1,
        )


def test_producer_descriptor_rejects_unsafe_ids() -> None:
    with pytest.raises(InvalidIdentifierError):
        ProducerDescriptor("../executor", "execution", "host", 1)
    with pytest.raises(InvalidIdentifierError):
        ProducerDescriptor("executor", "exe/cution", "host", 1)


def test_deployment_descriptor_rejects_a_shuffle_descriptor_of_another_partition() -> None:
    descriptor = make_partition_descriptor()
    other = UnknownShuffleDescriptor(
        ResultPartitionID(IntermediateResultPartitionID("result", 1), "attempt")
    )

    with pytest.raises(InvalidIdentifierError):
        ResultPartitionDeploymentDescriptor(descriptor, other)


def test_deployment_descriptor_exposes_its_partition() -> None:
    rpid = ResultPartitionID(IntermediateResultPartitionID("result", 0), "attempt")
    deployment = ResultPartitionDeploymentDescriptor(
        make_partition_descriptor(subpartitions=5), UnknownShuffleDescriptor(rpid)
    )

    assert deployment.result_partition_id == rpid
    assert deployment.number_of_subpartitions == 5
    assert deployment.partition_type is ResultPartitionType.BLOCKING


def test_input_gate_rejects_a_descriptor_of_another_result() -> None:
    foreign = UnknownShuffleDescriptor(
        ResultPartitionID(IntermediateResultPartitionID("other", 0), "attempt")
    )

    with pytest.raises(InvalidIdentifierError, match="other"):
        InputGateDeploymentDescriptor(
            "result", ResultPartitionType.BLOCKING, SubpartitionRange(0, 0), (foreign,)
        )


# --- SubpartitionRange ---------------------------------------------------------------------


def test_subpartition_range_is_inclusive_with_length_iteration_and_containment() -> None:
    subpartitions = SubpartitionRange(2, 5)

    assert len(subpartitions) == 4
    assert list(subpartitions) == [2, 3, 4, 5]
    assert 2 in subpartitions
    assert 5 in subpartitions
    assert 1 not in subpartitions
    assert 6 not in subpartitions
    assert "3" not in subpartitions


def test_single_subpartition_range_holds_one_index() -> None:
    subpartitions = SubpartitionRange.single(7)

    assert subpartitions == SubpartitionRange(7, 7)
    assert len(subpartitions) == 1
    assert list(subpartitions) == [7]


@pytest.mark.parametrize(("start", "end"), [(-1, 0), (3, 2), (-2, -1), (1, 0)])
def test_subpartition_range_rejects_negative_or_reversed_bounds(start: int, end: int) -> None:
    with pytest.raises(InvalidIdentifierError, match="invalid subpartition range"):
        SubpartitionRange(start, end)


# --- immutability --------------------------------------------------------------------------


def test_descriptors_are_frozen() -> None:
    descriptor = make_partition_descriptor()
    subpartitions = SubpartitionRange(0, 1)
    unknown = UnknownShuffleDescriptor(
        ResultPartitionID(IntermediateResultPartitionID("result", 0), "attempt")
    )

    with pytest.raises(dataclasses.FrozenInstanceError):
        descriptor.number_of_subpartitions = 0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        subpartitions.end = 9  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        unknown.partition = unknown.partition  # type: ignore[misc]
    assert descriptor.number_of_subpartitions == 3
    assert subpartitions.end == 1


# --- Flink's partition type table ----------------------------------------------------------


def test_blocking_is_reconsumable_unbounded_transient_blocking_and_released_by_scheduler() -> None:
    kind = ResultPartitionType.BLOCKING

    assert kind.is_reconsumable
    assert not kind.is_bounded
    assert not kind.is_persistent
    assert kind.consuming_constraint is ConsumingConstraint.BLOCKING
    assert not kind.can_be_pipelined
    assert not kind.must_be_pipelined
    assert kind.is_blocking_or_blocking_persistent
    assert kind.released_by is ReleaseBy.SCHEDULER
    assert kind.is_released_by_scheduler


def test_blocking_persistent_is_blocking_and_persistent() -> None:
    kind = ResultPartitionType.BLOCKING_PERSISTENT

    assert kind.is_persistent
    assert kind.is_reconsumable
    assert not kind.is_bounded
    assert kind.consuming_constraint is ConsumingConstraint.BLOCKING
    assert kind.is_blocking_or_blocking_persistent
    assert kind.is_released_by_scheduler


def test_pipelined_must_be_pipelined_is_released_by_upstream_and_consumed_once() -> None:
    kind = ResultPartitionType.PIPELINED

    assert kind.must_be_pipelined
    assert kind.can_be_pipelined
    assert kind.released_by is ReleaseBy.UPSTREAM
    assert not kind.is_released_by_scheduler
    assert not kind.is_reconsumable
    assert not kind.is_bounded
    assert not kind.is_persistent
    assert not kind.is_blocking_or_blocking_persistent


def test_pipelined_bounded_is_pipelined_with_bounded_memory() -> None:
    kind = ResultPartitionType.PIPELINED_BOUNDED

    assert kind.is_bounded
    assert kind.must_be_pipelined
    assert not kind.is_reconsumable
    assert not kind.is_persistent
    assert kind.released_by is ReleaseBy.UPSTREAM


def test_hybrid_full_is_reconsumable_can_be_pipelined_and_released_by_scheduler() -> None:
    kind = ResultPartitionType.HYBRID_FULL

    assert kind.is_reconsumable
    assert kind.can_be_pipelined
    assert not kind.must_be_pipelined
    assert kind.consuming_constraint is ConsumingConstraint.CAN_BE_PIPELINED
    assert kind.is_released_by_scheduler
    assert not kind.is_bounded
    assert not kind.is_persistent
    assert not kind.is_blocking_or_blocking_persistent
