"""What one ``SparkShuffle`` keeps: its results while the user holds them, the exchanges they
read, and when each may go (see :mod:`pyspark_shuffle.driver.chain` for the rules). Plain state over
two small interfaces, so that it is tested without Spark."""

from __future__ import annotations

import abc
import logging
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from pyspark_shuffle.driver.chain import Chain, ChainExchange, ChainStage
from pyspark_shuffle.spark.link import TaskBroadcast
from scheduling.deployment import DescriptorCache
from scheduling.groups import ConsumedPartitionGroup
from shuffle_api import InvalidOperationError, ShuffleError, ShuffleServiceClosedError

__all__ = ["RegisteredExchange", "RegisteredResult", "ResultRegistry"]

_LOG = logging.getLogger(__name__)


class RegisteredExchange(abc.ABC):
    """An exchange as the registry sees it (:class:`~pyspark_shuffle.driver.exchange.Exchange`)."""

    result_id: str
    name: str
    upstream: tuple[RegisteredExchange, ...]
    """The exchanges its map tasks read (a fused stage's), which must outlive them."""
    producer_stage: str | None
    """The reduce stage whose tasks are its map tasks (a fused stage's), else ``None``."""

    @property
    @abc.abstractmethod
    def released(self) -> bool:
        """Its partitions were deleted (by :meth:`release`)."""

    @property
    @abc.abstractmethod
    def number_of_maps(self) -> int:
        """Its map tasks (known once written)."""

    @property
    @abc.abstractmethod
    def on_executors(self) -> bool:
        """Its map outputs go with the executors that wrote them, and Spark may run its map
        tasks again (so copies may appear after it is released)."""

    @abc.abstractmethod
    def release(self, *, forget_in_spark: bool = False) -> bool:
        """Delete its partitions; with ``forget_in_spark``, Spark forgets them too. False if
        Spark could not be told (it then stays)."""

    @abc.abstractmethod
    def release_copies(self) -> None:
        """Delete what map task attempts wrote since it was released."""

    @abc.abstractmethod
    def adopt(self, map_index: int, producer: bytes) -> None:
        """Register a map output that Spark reran inside an action."""


class RegisteredResult(abc.ABC):
    """A result (a DataFrame of reduce tasks) as the registry sees it."""

    stage: str
    """Its reduce stage's name in the chain."""
    exchanges: Sequence[RegisteredExchange]
    """What its tasks read."""
    wraps: str | None
    """A broadcast join over a fused result: that result's stage, whose tasks its tasks run."""
    broadcasts: tuple[TaskBroadcast[Any], ...]
    """What the executors keep to read it: the reducers' deployments, a broadcast side."""
    consumed_groups: Sequence[ConsumedPartitionGroup]
    """Its reducers' partition groups (their descriptors are cached)."""

    @property
    @abc.abstractmethod
    def number_of_tasks(self) -> int:
        """Its reduce tasks."""

    @abc.abstractmethod
    def take_dependents(self) -> list[object]:
        """The frames of results that live only for it (its kept rows' reader), handed over
        once: they are dropped with it."""

    @abc.abstractmethod
    def map_outputs_rerun(self) -> frozenset[tuple[str, int, bytes]]:
        """Map outputs Spark reran while it was read: (result id, map index, producer)."""


R = TypeVar("R", bound=RegisteredResult)
S = TypeVar("S")


def adopt_reruns(result: RegisteredResult) -> None:
    """Register the map outputs Spark reran while ``result`` was read (so they are released
    with the rest and counted as reruns)."""
    by_id = {exchange.result_id: exchange for exchange in result.exchanges}
    for result_id, map_index, producer in sorted(result.map_outputs_rerun()):
        try:
            by_id[result_id].adopt(map_index, producer)
        except ShuffleError as error:  # the rest still go; its executor's end removes it
            _LOG.warning("map output %d of %s not registered: %s", map_index, result_id, error)


class ResultRegistry(Generic[R, S]):
    """The results ``R`` (by the DataFrame object the user holds), sources ``S`` and exchanges
    of one ``SparkShuffle``; thread-safe.

    ``recomputable``: whether Spark can be told to remake a released exchange on executors
    (see :meth:`Chain.releasable`); ``spark_running``: whether Spark still holds the shared
    values (they went with a stopped SparkContext)."""

    def __init__(
        self,
        descriptors: DescriptorCache,
        *,
        recomputable: Callable[[], bool],
        spark_running: Callable[[], bool],
    ) -> None:
        self._descriptors = descriptors
        self._recomputable = recomputable
        self._spark_running = spark_running
        self._lock = threading.Lock()
        self._results: dict[int, tuple[weakref.ref[object], R]] = {}
        self._sources: dict[int, tuple[weakref.ref[object], S]] = {}
        self._exchanges: dict[str, RegisteredExchange] = {}
        # Released exchanges whose map tasks Spark may still run (theirs are on executors):
        # what such a run writes is deleted after each operation.
        self._released: dict[str, RegisteredExchange] = {}
        # Results the user dropped whose reduce tasks a rerun may still run, by stage: they
        # keep what those tasks read (descriptor lists, the deployments' broadcast).
        self._dropped: dict[str, R] = {}
        self._chain = Chain()
        self._closed = False

    def check_open(self) -> None:
        if self._closed:
            raise ShuffleServiceClosedError("this SparkShuffle is closed")

    # -- what is kept ---------------------------------------------------------------------

    def add_source(self, frame: object, source: S) -> None:
        with self._lock:
            self._sources = {k: v for k, v in self._sources.items() if v[0]() is not None}
            self._sources[id(frame)] = (weakref.ref(frame), source)

    def source(self, frame: object) -> S | None:
        with self._lock:
            entry = self._sources.get(id(frame))
        return entry[1] if entry is not None and entry[0]() is frame else None

    def writing(self, exchange: RegisteredExchange) -> None:
        """``exchange`` is about to be written: released with the rest at close from now."""
        with self._lock:
            self._exchanges[exchange.result_id] = exchange

    def written(self, exchange: RegisteredExchange, *, pinned: bool) -> None:
        """``exchange`` was written; a ``pinned`` one stays until released with a result that
        reads it, or closed."""
        chained = ChainExchange(
            exchange.result_id,
            exchange.producer_stage or f"map-{exchange.result_id}",
            exchange.number_of_maps,
            on_executors=exchange.on_executors,
        )
        with self._lock:
            self._chain.add_exchange(chained, pinned=pinned)

    def remember(self, frame: object, result: R) -> None:
        """Keep what reads ``frame`` while the user holds it."""
        stage = ChainStage(
            result.stage,
            result.number_of_tasks or 1,
            tuple(exchange.result_id for exchange in result.exchanges),
            result.wraps,
        )
        with self._lock:
            self._chain.add_stage(stage)
            self._results[id(frame)] = (weakref.ref(frame), result)

    def result(self, frame: object) -> R | None:
        """The result ``frame`` is, or ``None``."""
        with self._lock:
            entry = self._results.get(id(frame))
        return entry[1] if entry is not None and entry[0]() is frame else None

    def known_result(self, frame: object) -> R:
        found = self.result(frame)
        if found is None:
            raise InvalidOperationError(
                "this DataFrame was not made by this SparkShuffle, or it was released"
            )
        return found

    # -- what goes ------------------------------------------------------------------------

    def release(self, frame: object) -> None:
        """Drop the result ``frame`` is and release the exchanges no other live result
        reads."""
        with self._lock:
            entry = self._results.get(id(frame))
            if entry is None or entry[0]() is not frame:
                return
            result = self._drop(id(frame))
            still_read = self._chain.read_by_live()
            asked = [
                self._exchanges[exchange.result_id]
                for exchange in result.exchanges
                if exchange.result_id in self._exchanges and exchange.result_id not in still_read
            ]
        self._release(asked)
        self.release_unreachable()

    def release_unreachable(self) -> None:
        """Release the exchanges whose every consumer has finished: no live result reads
        them, as the user dropped every result that does (Python collected them). So a
        chain's store holds its widest step, not every step. An exchange on the executors
        that a later stage's rerun may read goes too where Spark can be told to remake it
        (else it stays); the dropped results such a rerun runs keep what their tasks read
        until no rerun can need them."""
        with self._lock:
            dead = [key for key, (frame, _) in self._results.items() if frame() is None]
            for key in dead:
                if key in self._results:  # not dropped with the result it lived for
                    self._drop(key)
            unreachable = [
                self._exchanges[result_id]
                for result_id in self._chain.releasable(recomputable=self._recomputable())
                if result_id in self._exchanges
            ]
        for exchange in unreachable:
            _LOG.info("released %s: no live result reads it", exchange.name)
        self._release(unreachable)
        with self._lock:
            rerunnable = self._chain.rerunnable()
            done = [self._dropped.pop(stage) for stage in set(self._dropped) - rerunnable]
            waiting = list(self._dropped.values())
            self._chain.prune()
        for result in done:
            self._forget(result)
        for result in waiting:
            adopt_reruns(result)
        with self._lock:
            released = list(self._released.values())
        for exchange in released:
            exchange.release_copies()

    def close(self) -> list[TaskBroadcast[Any]] | None:
        """Release every exchange; what the results shared with the executors, once each, for
        the caller to destroy (last, once the service is closed). ``None`` when closed
        before."""
        with self._lock:
            if self._closed:
                return None
            self._closed = True
            exchanges = [*self._exchanges.values(), *self._released.values()]
            self._exchanges, self._released = {}, {}
            results = [result for _, result in self._results.values()]
            results += self._dropped.values()
            self._results.clear()
            self._dropped.clear()
        self._descriptors.clear()
        for result in results:
            adopt_reruns(result)
        for exchange in exchanges:
            exchange.release()
        # Once each: a recovered broadcast join shares its broadcast side.
        return list({id(each): each for result in results for each in result.broadcasts}.values())

    def _drop(self, key: int) -> R:
        """The user dropped the result under ``key``, and with it those that lived only for it
        (lock held)."""
        result = self._results.pop(key)[1]
        self._chain.drop(result.stage)
        self._dropped[result.stage] = result
        for frame in result.take_dependents():
            entry = self._results.get(id(frame))
            if entry is not None and entry[0]() is frame:
                self._drop(id(frame))
        return result

    def _forget(self, result: R) -> None:
        """Drop what the driver and executors keep to read ``result``."""
        adopt_reruns(result)
        # Unpersisted, not destroyed: the executors' copies go now, and the driver's when
        # Spark's cleaner sees the result gone. Reading a released result again still reaches
        # the reduce tasks, which name the partitions they no longer find.
        if self._spark_running():
            for shared in result.broadcasts:
                shared.unpersist()
        for group in result.consumed_groups:
            self._descriptors.invalidate(group)

    def _release(self, exchanges: Sequence[RegisteredExchange]) -> None:
        """Release ``exchanges``; Spark forgets those a rerun may read, so that it remakes
        them (a released result read again fails instead of remaking its exchange). One
        Spark could not be told about stays, and is tried again at the next operation."""
        with self._lock:
            rerun_inputs = self._chain.rerun_inputs()
        for exchange in exchanges:
            if not exchange.release(forget_in_spark=exchange.result_id in rerun_inputs):
                _LOG.warning("%s stays: Spark could not be told it is gone", exchange.name)
                continue
            with self._lock:
                self._exchanges.pop(exchange.result_id, None)
                self._chain.released(exchange.result_id)
                if exchange.on_executors:
                    self._released[exchange.result_id] = exchange
