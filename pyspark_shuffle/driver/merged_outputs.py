"""What the driver knows of one exchange's merged partitions: which map tasks' outputs each
holds, and in which attempt, so that reducers read a merged partition only while it holds the
attempts registered now (a rerun's output replaces it with its sources), and never one the
service lost. Plain state behind a lock, tested without Spark."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass

from shuffle_api import InvalidOperationError, ResultPartitionID, ShuffleDescriptor

__all__ = ["MergedOutput", "MergedOutputs"]


@dataclass(frozen=True, slots=True)
class MergedOutput:
    """A merged partition: the outputs of map tasks ``maps`` (neighbours), in order, each in
    the attempt of the same place in ``attempts``."""

    descriptor: ShuffleDescriptor
    maps: range
    attempts: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.maps) != len(self.attempts) or not self.maps or self.maps.step != 1:
            raise InvalidOperationError(
                f"merged partition {self.descriptor.result_partition_id}: {self.maps} with"
                f" {len(self.attempts)} attempts"
            )

    def holds(self, attempts: Mapping[int, str]) -> bool:
        """Whether it holds the attempt ``attempts`` names for each of its map tasks."""
        return all(
            attempts.get(index) == attempt
            for index, attempt in zip(self.maps, self.attempts, strict=True)
        )


class MergedOutputs:
    """The merged partitions of one exchange that reducers may read; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._merged: dict[int, MergedOutput] = {}
        """By the first map task each holds."""

    def __len__(self) -> int:
        with self._lock:
            return len(self._merged)

    def add(self, merged: MergedOutput, registered: Mapping[int, str]) -> bool:
        """Take ``merged`` where it holds the ``registered`` attempts and overlaps none taken;
        False otherwise (the caller releases it)."""
        with self._lock:
            overlaps = any(
                set(merged.maps).intersection(each.maps) for each in self._merged.values()
            )
            if overlaps or not merged.holds(registered):
                return False
            self._merged[merged.maps.start] = merged
            return True

    def stale(self, registered: Mapping[int, str]) -> list[MergedOutput]:
        """Forget and return those that hold an attempt other than the ``registered`` one."""
        return self._forget(lambda each: not each.holds(registered))

    def lost(self, unavailable: Set[ResultPartitionID]) -> list[MergedOutput]:
        """Forget and return those among ``unavailable``."""
        return self._forget(lambda each: each.descriptor.result_partition_id in unavailable)

    def release(self) -> list[MergedOutput]:
        """Forget and return them all."""
        return self._forget(lambda each: True)

    def _forget(self, condition: Callable[[MergedOutput], bool]) -> list[MergedOutput]:
        with self._lock:
            gone = [each for each in self._merged.values() if condition(each)]
            for each in gone:
                del self._merged[each.maps.start]
        return gone

    def read_order(self, outputs: Sequence[ShuffleDescriptor]) -> tuple[ShuffleDescriptor, ...]:
        """What reducers read in place of the map outputs ``outputs`` (by map index): each
        merged partition where its first map task's output was, the outputs it holds left
        out, so that rows come in the order they would unmerged."""
        with self._lock:
            merged = dict(self._merged)
        read: list[ShuffleDescriptor] = []
        index = 0
        while index < len(outputs):
            found = merged.get(index)
            if found is None:
                read.append(outputs[index])
                index += 1
            else:
                read.append(found.descriptor)
                index = found.maps.stop
        return tuple(read)
