"""What the driver knows of one exchange's map outputs, apart from Spark: the attempt of each
map task that reducers read, every attempt it ever registered, which of them the service lost,
and what is left to delete once the exchange is released. Plain state behind a lock (reruns
are adopted while another thread may release), tested without Spark."""

from __future__ import annotations

import enum
import threading
from collections.abc import Set
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shuffle_api import (
    InvalidOperationError,
    ProducerDescriptor,
    ResultPartitionID,
    SerializationError,
    ShuffleDescriptor,
    deserialize,
)

if TYPE_CHECKING:  # a type only: the registry never looks into what a map output wrote
    from scheduling.map_sizes import MapSizes

__all__ = [
    "ExchangeState",
    "MapOutput",
    "MapOutputRegistry",
    "Stray",
    "WrittenCopy",
    "decode_producer",
]

WrittenCopy = tuple[str, int, bytes]
"""A copy one map task attempt wrote: (result id, map index, serialized producer)."""


def decode_producer(encoded: bytes, sender: str) -> ProducerDescriptor:
    """The producer a task reported (``sender``: which kind of task, for the error)."""
    producer = deserialize(encoded)
    if not isinstance(producer, ProducerDescriptor):
        raise SerializationError(f"{sender} reported a {type(producer).__name__}")
    return producer


class ExchangeState(enum.Enum):
    """Where an exchange's map outputs are in their life; nothing leads back to ``OPEN``."""

    OPEN = "open"
    """Map outputs are registered (a rerun's replaces its map task's), and reducers read them."""
    RELEASED = "released"
    """Its map outputs are deleted, and so is every copy a map task attempt writes after."""
    FORGOTTEN = "forgotten"
    """Released, and Spark told to forget its map outputs (so that a rerun remakes them rather
    than reading deleted ones): it is told again whenever a rerun wrote copies."""

    def after_release(self, *, forget: bool) -> ExchangeState:
        """The state a release leaves (``forget``: Spark told to forget): forgotten once,
        forgotten for good, as Spark never learns the deleted outputs back."""
        if forget or self is ExchangeState.FORGOTTEN:
            return ExchangeState.FORGOTTEN
        return ExchangeState.RELEASED


@dataclass(frozen=True, slots=True)
class MapOutput:
    """The registered attempt of one map task and what it wrote."""

    map_index: int
    descriptor: ShuffleDescriptor
    sizes: MapSizes

    @property
    def attempt(self) -> str:
        return self.descriptor.result_partition_id.producer_attempt_id


@dataclass(frozen=True, slots=True)
class Stray:
    """A copy a map task attempt wrote that the exchange never registered (a rerun Spark made
    on its own), found once the exchange was released."""

    copy: WrittenCopy
    producer: ProducerDescriptor

    @property
    def map_index(self) -> int:
        return self.copy[1]


class _MapTask:
    """One map task: its registered output (``None`` once released), every attempt of it ever
    registered, and how many times one was."""

    __slots__ = ("attempts", "output", "registrations")

    def __init__(self) -> None:
        self.output: MapOutput | None = None
        self.attempts: set[str] = set()
        self.registrations = 0


class MapOutputRegistry:
    """The map outputs of the exchange ``name`` (for errors); thread-safe."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._state = ExchangeState.OPEN
        self._tasks: dict[int, _MapTask] = {}
        self._seen: set[WrittenCopy] = set()
        """The copies :meth:`strays` went through: a registered attempt's, or swept."""

    @property
    def state(self) -> ExchangeState:
        return self._state

    @property
    def outputs(self) -> dict[int, MapOutput]:
        """The registered output of each map task (none once released)."""
        with self._lock:
            return {i: task.output for i, task in self._tasks.items() if task.output is not None}

    def registrations(self) -> dict[int, int]:
        """How many times an attempt of each map task was registered (its first run, then
        each rerun), released or not."""
        with self._lock:
            return {index: task.registrations for index, task in self._tasks.items()}

    def known_attempts(self) -> list[tuple[int, str]]:
        """Every attempt of each map task ever registered, released or not."""
        with self._lock:
            return [
                (index, attempt) for index, task in self._tasks.items() for attempt in task.attempts
            ]

    def register(self, output: MapOutput) -> MapOutput | None:
        """Make ``output`` the registered attempt of its map task; the one it replaces, for the
        caller to delete. Refused once released, as nothing would delete it then."""
        with self._lock:
            if self._state is not ExchangeState.OPEN:
                raise InvalidOperationError(
                    f"{self._name} is released: map output {output.map_index}"
                    f" attempt {output.attempt} not registered"
                )
            task = self._tasks.setdefault(output.map_index, _MapTask())
            previous, task.output = task.output, output
            task.registrations += 1
            task.attempts.add(output.attempt)
        return previous

    def replaced_by(self, map_index: int, attempt: str) -> MapOutput | None:
        """The registered output that ``attempt`` of map task ``map_index`` (a rerun reducers
        read) takes the place of: ``None`` where that attempt was registered before, or none
        is registered (released)."""
        with self._lock:
            task = self._tasks.get(map_index)
            if task is None or attempt in task.attempts:
                return None
            return task.output

    def lost(self, unavailable: Set[ResultPartitionID]) -> list[int]:
        """The map tasks whose registered attempt is among ``unavailable``, in order."""
        return sorted(
            index
            for index, output in self.outputs.items()
            if output.descriptor.result_partition_id in unavailable
        )

    def release(self, *, forget: bool) -> list[MapOutput]:
        """Release the exchange (``forget``: Spark is told to forget its map outputs); the
        registered outputs, for the caller to delete: none on a second release."""
        with self._lock:
            self._state = self._state.after_release(forget=forget)
            outputs = [task.output for task in self._tasks.values() if task.output is not None]
            for task in self._tasks.values():
                task.output = None
        return outputs

    def strays(self, written: Set[WrittenCopy]) -> list[Stray]:
        """The copies in ``written`` that no attempt registered made and that are not swept
        yet, in order; none while open, as reducers may still adopt a rerun's copy."""
        with self._lock:
            if self._state is ExchangeState.OPEN:
                return []
            registered = {attempt for task in self._tasks.values() for attempt in task.attempts}
            unseen = sorted(written - self._seen)
        strays: list[Stray] = []
        for copy in unseen:
            producer = decode_producer(copy[2], "a map task")
            if producer.producer_execution_id in registered:
                with self._lock:
                    self._seen.add(copy)
            else:
                strays.append(Stray(copy, producer))
        return strays

    def swept(self, stray: Stray) -> None:
        """``stray`` is deleted: :meth:`strays` never names it again."""
        with self._lock:
            self._seen.add(stray.copy)
