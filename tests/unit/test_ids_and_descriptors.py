"""Identifiers (which become store path components) and descriptor invariants."""

from __future__ import annotations

import dataclasses
from typing import cast

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
    new_id,
)
from shuffle_api.ids import validate_id

# --- validate_id ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "",
        ".",
        "..",
        "a/b",
        "../x",
        "a..b",
        "x" * 129,
        ".hidden",
        "-flag",
        "_under",
        "a b",
        "a\\b",
        "a\nb",
        "abc\n",
        "a:b",
        "a*",
        "ä",
        "/abs",
    ],
)
def test_validate_id_rejects_names_that_could_escape_or_break_a_path(value: str) -> None:
    with pytest.raises(InvalidIdentifierError):
        validate_id(value, "test id")


@pytest.mark.parametrize("value", [None, 5, b"abc", ["a"], 1.5])
def test_validate_id_rejects_non_strings(value: object) -> None:
    with pytest.raises(InvalidIdentifierError):
        validate_id(cast(str, value), "test id")


@pytest.mark.parametrize(
    "value",
    [
        "3f2a9c0d1e4b4f7a8c6d5e4f3a2b1c0d",
        "3f2a9c0d-1e4b-4f7a-8c6d-5e4f3a2b1c0d",
        "map-0_1.a",
        "0",
        "A",
        "x" * 128,
        "a.b.c",
        "a-b_c",
    ],
)
def test_validate_id_accepts_and_returns_safe_names(value: str) -> None:
    assert validate_id(value, "test id") == value


def test_invalid_id_error_names_what_and_the_value() -> None:
    with pytest.raises(InvalidIdentifierError) as caught:
        validate_id("../etc", "producer attempt id")

    assert "producer attempt id" in str(caught.value)
    assert "'../etc'" in str(caught.value)


def test_new_id_is_valid_and_fresh() -> None:
    first, second = new_id(), new_id()

    assert validate_id(first, "id") == first
    assert first != second
    assert len(first) == 32


# --- partition ids -------------------------------------------------------------------------


def test_negative_partition_index_is_rejected() -> None:
    with pytest.raises(InvalidIdentifierError, match="-1"):
        IntermediateResultPartitionID("result", -1)


def test_non_int_partition_index_is_rejected() -> None:
    with pytest.raises(InvalidIdentifierError):
        IntermediateResultPartitionID("result", cast(int, "3"))


def test_partition_id_rejects_an_unsafe_result_id() -> None:
    with pytest.raises(InvalidIdentifierError):
        IntermediateResultPartitionID("../result", 0)


def test_result_partition_id_rejects_an_unsafe_attempt_id() -> None:
    with pytest.raises(InvalidIdentifierError):
        ResultPartitionID(IntermediateResultPartitionID("result", 0), "a/b")


def test_ids_are_values_ordered_by_result_then_index_then_attempt() -> None:
    a0 = ResultPartitionID(IntermediateResultPartitionID("a", 0), "x")
    a1 = ResultPartitionID(IntermediateResultPartitionID("a", 1), "x")
    a1y = ResultPartitionID(IntermediateResultPartitionID("a", 1), "y")
    b0 = ResultPartitionID(IntermediateResultPartitionID("b", 0), "x")

    assert sorted([b0, a1y, a1, a0]) == [a0, a1, a1y, b0]
    assert ResultPartitionID(IntermediateResultPartitionID("a", 0), "x") == a0
    assert len({a0, ResultPartitionID(IntermediateResultPartitionID("a", 0), "x")}) == 1
    assert str(a1y) == "a#1@y"


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


def test_ids_are_frozen() -> None:
    partition_id = IntermediateResultPartitionID("result", 0)
    rpid = ResultPartitionID(partition_id, "attempt")

    with pytest.raises(dataclasses.FrozenInstanceError):
        partition_id.partition_index = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        rpid.producer_attempt_id = "../x"  # type: ignore[misc]
    assert partition_id.partition_index == 0
    assert rpid.producer_attempt_id == "attempt"


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
