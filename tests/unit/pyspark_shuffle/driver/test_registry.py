"""What one SparkShuffle keeps, in-process and without Spark: results while the user holds
them, the exchanges they read, and when each goes."""

from __future__ import annotations

import gc
from collections.abc import Sequence
from typing import Any

import pytest

from pyspark_shuffle.driver.registry import RegisteredExchange, RegisteredResult, ResultRegistry
from pyspark_shuffle.spark.link import TaskBroadcast
from scheduling.deployment import DescriptorCache
from scheduling.groups import ConsumedPartitionGroup
from shuffle_api import InvalidOperationError, ShuffleServiceClosedError


class _Exchange(RegisteredExchange):
    def __init__(
        self,
        result_id: str,
        *,
        fused_from: str | None = None,
        on_executors: bool = False,
        spark_told: bool = True,
    ) -> None:
        self.result_id = result_id
        self.name = result_id
        self._released = False
        self.upstream = ()
        self.producer_stage = fused_from
        self._on_executors = on_executors
        self._spark_told = spark_told
        self.copies_swept = 0
        self.adopted: list[tuple[int, bytes]] = []

    @property
    def released(self) -> bool:
        return self._released

    @property
    def number_of_maps(self) -> int:
        return 2

    @property
    def on_executors(self) -> bool:
        return self._on_executors

    def release(self, *, forget_in_spark: bool = False) -> bool:
        if forget_in_spark and not self._spark_told:
            return False
        self._released = True
        return True

    def release_copies(self) -> None:
        self.copies_swept += 1

    def adopt(self, map_index: int, producer: bytes) -> None:
        self.adopted.append((map_index, producer))


class _Broadcast(TaskBroadcast[int]):
    def __init__(self) -> None:
        self.state = "kept"

    @property
    def value(self) -> int:
        return 0

    def unpersist(self) -> None:
        self.state = "unpersisted"

    def destroy(self) -> None:
        self.state = "destroyed"


class _Result(RegisteredResult):
    def __init__(
        self,
        stage: str,
        exchanges: Sequence[_Exchange],
        reruns: frozenset[tuple[str, int, bytes]] = frozenset(),
    ) -> None:
        self.stage = stage
        self.exchanges = exchanges
        self.wraps = None
        self.shared = _Broadcast()
        self.broadcasts: tuple[TaskBroadcast[Any], ...] = (self.shared,)
        self.consumed_groups: Sequence[ConsumedPartitionGroup] = ()
        self._reruns = reruns
        self.dependents: list[object] = []

    @property
    def number_of_tasks(self) -> int:
        return 3

    def map_outputs_rerun(self) -> frozenset[tuple[str, int, bytes]]:
        return self._reruns

    def take_dependents(self) -> list[object]:
        dependents, self.dependents = self.dependents, []
        return dependents


class _Frame:
    """Stands for the DataFrame the user holds (the registry keys results by identity)."""


def _registry(*, recomputable: bool = True) -> ResultRegistry[_Result, str]:
    return ResultRegistry(
        DescriptorCache(blob_store=None, offload_threshold=1 << 20),
        recomputable=lambda: recomputable,
        spark_running=lambda: True,
    )


def _write(
    registry: ResultRegistry[_Result, str], exchange: _Exchange, *, pinned: bool = False
) -> _Exchange:
    registry.writing(exchange)
    registry.written(exchange, pinned=pinned)
    return exchange


def test_a_result_is_found_by_the_very_object_and_no_other() -> None:
    registry = _registry()
    frame, other = _Frame(), _Frame()
    result = _Result("r1", [_write(registry, _Exchange("x1"))])
    registry.remember(frame, result)
    assert registry.known_result(frame) is result
    assert registry.result(other) is None
    with pytest.raises(InvalidOperationError, match="not made by this SparkShuffle"):
        registry.known_result(other)


def test_a_fused_chain_releases_each_exchange_once_its_reader_is_collected() -> None:
    registry = _registry()
    x1 = _write(registry, _Exchange("x1"))
    first = _Frame()
    registry.remember(first, _Result("r1", [x1]))
    x2 = _write(registry, _Exchange("x2", fused_from="r1"))
    second = _Frame()
    registry.remember(second, _Result("r2", [x2]))
    del first
    gc.collect()
    registry.release_unreachable()
    # x1 is read by r1 only, which now runs solely as x2's producer: x2 outlives executors.
    assert (x1.released, x2.released) == (True, False)
    registry.release(second)
    assert x2.released


def test_an_exchange_another_live_result_reads_stays_until_both_are_released() -> None:
    registry = _registry()
    x1 = _write(registry, _Exchange("x1"))
    first, again = _Frame(), _Frame()
    registry.remember(first, _Result("r1", [x1]))
    registry.remember(again, _Result("r1-again", [x1]))
    registry.release(first)
    assert not x1.released
    registry.release(again)
    assert x1.released


def test_a_pinned_exchange_stays_with_no_result_and_goes_with_its_reader() -> None:
    registry = _registry()
    x1 = _write(registry, _Exchange("x1"), pinned=True)
    registry.release_unreachable()
    assert not x1.released
    frame = _Frame()
    registry.remember(frame, _Result("r1", [x1]))
    registry.release(frame)
    assert x1.released


def test_on_executors_an_exchange_spark_cannot_remake_stays_for_a_rerun() -> None:
    registry = _registry(recomputable=False)
    x1 = _write(registry, _Exchange("x1", on_executors=True))
    first = _Frame()
    first_result = _Result("r1", [x1])
    registry.remember(first, first_result)
    x2 = _write(registry, _Exchange("x2", fused_from="r1", on_executors=True))
    registry.remember(_Frame(), _Result("r2", [x2]))  # held by nobody: collected at once
    second = _Frame()
    registry.remember(second, _Result("r3", [x2]))
    del first
    gc.collect()
    registry.release_unreachable()
    # A lost map output of x2 reruns r1's tasks, which read x1: both stay, and r1 keeps what
    # its tasks read.
    assert not x1.released
    assert first_result.shared.state == "kept"


def test_released_exchanges_on_executors_have_their_late_copies_swept() -> None:
    registry = _registry()
    x1 = _write(registry, _Exchange("x1", on_executors=True))
    frame = _Frame()
    result = _Result("r1", [x1])
    registry.remember(frame, result)
    registry.release(frame)
    assert x1.released
    assert result.shared.state == "unpersisted"
    swept = x1.copies_swept
    registry.release_unreachable()
    assert x1.copies_swept == swept + 1


def test_an_exchange_spark_could_not_be_told_about_stays_and_is_tried_again() -> None:
    registry = _registry()
    x1 = _write(registry, _Exchange("x1", on_executors=True, spark_told=False))
    r1 = _Frame()
    registry.remember(r1, _Result("r1", [x1]))
    x2 = _write(registry, _Exchange("x2", fused_from="r1", on_executors=True))
    r2 = _Frame()
    registry.remember(r2, _Result("r2", [x2]))
    del r1
    gc.collect()
    registry.release_unreachable()
    assert not x1.released  # a rerun of r1 may read it, and Spark could not be told


def test_reruns_are_adopted_by_the_exchange_they_belong_to() -> None:
    registry = _registry()
    x1 = _write(registry, _Exchange("x1"))
    frame = _Frame()
    registry.remember(frame, _Result("r1", [x1], frozenset({("x1", 1, b"p")})))
    registry.release(frame)
    assert x1.adopted == [(1, b"p")]


def test_close_releases_everything_once_and_hands_back_each_shared_value_once() -> None:
    registry = _registry()
    x1 = _write(registry, _Exchange("x1"))
    frame, again = _Frame(), _Frame()
    result = _Result("r1", [x1])
    registry.remember(frame, result)
    registry.remember(again, result)
    shared = registry.close()
    assert x1.released
    assert shared is not None and [id(each) for each in shared] == [id(result.shared)]
    assert registry.close() is None
    with pytest.raises(ShuffleServiceClosedError):
        registry.check_open()


def test_a_source_is_found_by_its_frame_while_it_lives() -> None:
    registry = _registry()
    frame = _Frame()
    registry.add_source(frame, "s3://bucket/table")
    assert registry.source(frame) == "s3://bucket/table"
    assert registry.source(_Frame()) is None


def _kept_chain(
    registry: ResultRegistry[_Result, str],
) -> tuple[_Frame, _Result, _Exchange, _Exchange]:
    """r1 over x1, and the rows r1 kept: an exchange its tasks wrote, whose reader only r1
    holds (as ``Result.kept`` does)."""
    x1 = _write(registry, _Exchange("x1"))
    frame = _Frame()
    result = _Result("r1", [x1])
    registry.remember(frame, result)
    kept = _write(registry, _Exchange("kept", fused_from="r1"))
    reader = _Frame()
    registry.remember(reader, _Result("read-kept", [kept]))
    result.dependents = [reader]
    return frame, result, x1, kept


def test_a_result_s_kept_rows_go_with_it() -> None:
    registry = _registry()
    frame, _, x1, kept = _kept_chain(registry)
    registry.release_unreachable()
    assert not kept.released  # read by a live result, for as long as r1 is held
    registry.release(frame)
    assert (x1.released, kept.released) == (True, True)


def test_a_collected_result_s_kept_rows_go_with_it() -> None:
    registry = _registry()
    frame, result, x1, kept = _kept_chain(registry)
    del result, frame
    gc.collect()
    registry.release_unreachable()
    assert (x1.released, kept.released) == (True, True)
