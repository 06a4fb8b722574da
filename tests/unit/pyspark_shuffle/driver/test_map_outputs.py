"""The rules of one exchange's map outputs (``MapOutputRegistry``), without Spark: reruns,
loss and recovery, release, and the copies a rerun leaves after it."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from pyspark_shuffle.driver import map_outputs
from pyspark_shuffle.driver.map_outputs import (
    ExchangeState,
    MapOutput,
    MapOutputRegistry,
    WrittenCopy,
    decode_producer,
)
from scheduling.map_sizes import MapSizes
from shuffle_api import (
    IntermediateResultPartitionID,
    InvalidOperationError,
    ProducerDescriptor,
    ResultPartitionID,
    SerializationError,
    UnknownShuffleDescriptor,
    serialize,
)
from shuffle_api.io import PartitionStatistics

RESULT = "r1"
SIZES = MapSizes.of(PartitionStatistics((1, 2), (10, 20)))


def _partition(map_index: int, attempt: str) -> ResultPartitionID:
    return ResultPartitionID(IntermediateResultPartitionID(RESULT, map_index), attempt)


def _output(map_index: int, attempt: str) -> MapOutput:
    return MapOutput(map_index, UnknownShuffleDescriptor(_partition(map_index, attempt)), SIZES)


def _copy(map_index: int, attempt: str) -> WrittenCopy:
    producer = ProducerDescriptor("executor-1", attempt, "host-1", 7000)
    return (RESULT, map_index, serialize(producer))


def _registry(*outputs: MapOutput) -> MapOutputRegistry:
    registry = MapOutputRegistry("exchange x")
    for output in outputs:
        registry.register(output)
    return registry


def _attempts(registry: MapOutputRegistry) -> dict[int, str]:
    return {index: output.attempt for index, output in registry.outputs.items()}


def test_a_reruns_newer_attempt_replaces_the_older_one() -> None:
    registry = _registry(_output(0, "a0"), _output(1, "a1"))

    replaced = registry.register(_output(1, "b1"))

    assert replaced == _output(1, "a1")  # for the caller to delete
    assert _attempts(registry) == {0: "a0", 1: "b1"}
    assert registry.registrations() == {0: 1, 1: 2}


def test_a_first_attempt_replaces_nothing() -> None:
    assert MapOutputRegistry("exchange x").register(_output(0, "a0")) is None


def test_only_the_registered_attempt_of_each_map_task_is_read() -> None:
    registry = _registry(_output(0, "a0"), _output(0, "b0"), _output(0, "c0"))

    assert _attempts(registry) == {0: "c0"}


def test_every_attempt_ever_registered_is_known() -> None:
    registry = _registry(_output(0, "a0"), _output(0, "b0"), _output(1, "a1"))

    assert sorted(registry.known_attempts()) == [(0, "a0"), (0, "b0"), (1, "a1")]


def test_a_rerun_reducers_read_takes_the_registered_outputs_place() -> None:
    registry = _registry(_output(0, "a0"))

    assert registry.replaced_by(0, "b0") == _output(0, "a0")


def test_an_attempt_registered_before_is_not_taken_again() -> None:
    registry = _registry(_output(0, "a0"), _output(0, "b0"))

    assert registry.replaced_by(0, "b0") is None  # the registered one
    assert registry.replaced_by(0, "a0") is None  # the one it replaced


def test_a_map_task_never_registered_takes_no_rerun() -> None:
    assert _registry(_output(0, "a0")).replaced_by(1, "a1") is None


def test_lost_names_the_map_tasks_whose_registered_attempt_is_unavailable() -> None:
    registry = _registry(_output(0, "a0"), _output(1, "a1"), _output(2, "a2"), _output(2, "b2"))

    unavailable = {_partition(2, "a2"), _partition(1, "a1"), _partition(0, "a0")}

    assert registry.lost(unavailable) == [0, 1]  # map 2's replaced attempt is not read


def test_recovery_registers_a_new_attempt_in_place_of_the_lost_one() -> None:
    registry = _registry(_output(0, "a0"), _output(1, "a1"))
    unavailable = {_partition(1, "a1")}
    assert registry.lost(unavailable) == [1]

    replaced = registry.register(_output(1, "b1"))

    assert replaced == _output(1, "a1")
    assert registry.lost(unavailable) == []
    assert registry.registrations() == {0: 1, 1: 2}


def test_release_hands_over_every_registered_output_once() -> None:
    registry = _registry(_output(0, "a0"), _output(1, "a1"), _output(1, "b1"))

    assert registry.release(forget=False) == [_output(0, "a0"), _output(1, "b1")]
    assert registry.release(forget=False) == []
    assert registry.outputs == {}


def test_release_keeps_the_runs_and_the_known_attempts() -> None:
    registry = _registry(_output(0, "a0"), _output(0, "b0"))

    registry.release(forget=False)

    assert registry.registrations() == {0: 2}
    assert sorted(registry.known_attempts()) == [(0, "a0"), (0, "b0")]


def test_registering_after_release_is_refused() -> None:
    registry = _registry(_output(0, "a0"))
    registry.release(forget=False)

    with pytest.raises(InvalidOperationError, match="exchange x is released: map output 0"):
        registry.register(_output(0, "b0"))

    assert registry.outputs == {}
    assert registry.registrations() == {0: 1}
    assert (0, "b0") not in registry.known_attempts()


def test_a_released_exchange_takes_no_rerun_and_loses_nothing() -> None:
    registry = _registry(_output(0, "a0"))
    registry.release(forget=False)

    assert registry.replaced_by(0, "b0") is None
    assert registry.lost({_partition(0, "a0")}) == []


def test_no_copy_is_a_stray_while_the_exchange_is_open() -> None:
    registry = _registry(_output(0, "a0"))

    assert registry.strays(frozenset({_copy(0, "b0")})) == []


def test_a_copy_no_registered_attempt_made_is_a_stray_once_released() -> None:
    registry = _registry(_output(0, "a0"), _output(1, "a1"))
    registry.release(forget=False)

    strays = registry.strays(frozenset({_copy(1, "b1"), _copy(0, "b0")}))

    assert [(stray.map_index, stray.producer.producer_execution_id) for stray in strays] == [
        (0, "b0"),
        (1, "b1"),
    ]


def test_copies_of_registered_attempts_are_never_strays() -> None:
    registry = _registry(_output(0, "a0"), _output(0, "b0"))
    registry.release(forget=False)  # b0 deleted by the release, a0 when b0 replaced it

    assert registry.strays(frozenset({_copy(0, "a0"), _copy(0, "b0")})) == []


def test_a_stray_is_named_until_swept_and_never_after() -> None:
    registry = _registry(_output(0, "a0"))
    registry.release(forget=False)
    written = frozenset({_copy(0, "b0"), _copy(0, "c0")})
    first, second = registry.strays(written)

    registry.swept(first)  # deleted; the second failed to be

    assert registry.strays(written) == [second]
    registry.swept(second)
    assert registry.strays(written) == []
    assert registry.strays(written | {_copy(0, "d0")})[0].copy == _copy(0, "d0")


def test_a_copy_whose_producer_is_something_else_is_refused() -> None:
    descriptor = UnknownShuffleDescriptor(_partition(0, "a0"))

    with pytest.raises(SerializationError, match="a map task reported a UnknownShuffleDescriptor"):
        decode_producer(serialize(descriptor), "a map task")


def test_the_registry_follows_its_releases() -> None:
    registry = _registry(_output(0, "a0"))
    states = [registry.state]
    for forget in (False, True, False):
        registry.release(forget=forget)
        states.append(registry.state)

    assert states == [
        ExchangeState.OPEN,
        ExchangeState.RELEASED,
        ExchangeState.FORGOTTEN,
        ExchangeState.FORGOTTEN,
    ]


@pytest.mark.parametrize(
    ("forget", "state"), [(False, ExchangeState.RELEASED), (True, ExchangeState.FORGOTTEN)]
)
def test_a_release_of_an_open_exchange_releases_it(forget: bool, state: ExchangeState) -> None:
    assert ExchangeState.OPEN.after_release(forget=forget) is state


@pytest.mark.parametrize(
    ("forget", "state"), [(False, ExchangeState.RELEASED), (True, ExchangeState.FORGOTTEN)]
)
def test_a_released_exchange_is_forgotten_only_when_asked(
    forget: bool, state: ExchangeState
) -> None:
    assert ExchangeState.RELEASED.after_release(forget=forget) is state


@pytest.mark.parametrize("forget", [False, True])
def test_a_forgotten_exchange_stays_forgotten(forget: bool) -> None:
    assert ExchangeState.FORGOTTEN.after_release(forget=forget) is ExchangeState.FORGOTTEN


@pytest.mark.parametrize("state", list(ExchangeState))
@pytest.mark.parametrize("forget", [False, True])
def test_no_release_leads_back_to_open(state: ExchangeState, forget: bool) -> None:
    assert state.after_release(forget=forget) is not ExchangeState.OPEN


def test_the_registry_imports_nothing_spark_bound() -> None:
    tree = ast.parse(Path(map_outputs.__file__).read_text(encoding="utf-8"))
    type_hints = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
        for inner in ast.walk(node)
    }
    roots = {
        name.split(".")[0]
        for node in ast.walk(tree)
        if id(node) not in type_hints
        for name in (
            [alias.name for alias in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
    }
    assert roots - set(sys.stdlib_module_names) <= {"shuffle_api", "pyarrow"}
