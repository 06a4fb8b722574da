"""``shuffle_api.ids``: identifiers (which become store path components): validated, fresh,
ordered and frozen."""

from __future__ import annotations

import dataclasses
from typing import cast

import pytest

from shuffle_api import (
    IntermediateResultPartitionID,
    InvalidIdentifierError,
    ResultPartitionID,
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
