"""What the driver knows of one exchange's merged partitions: which map tasks' outputs each
holds, and in which attempt, so that reducers read a merged partition only while it holds the
attempts registered now (a rerun's output replaces it with its sources), and never one the
service lost. Plain state behind a lock, tested without Spark."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass

from shuffle_api import InvalidOperationError, ResultPartitionID, ShuffleDescriptor

__all__ = ["MergedOutput", "MergedOutputs", "merge_groups"]


def merge_groups(sites: Sequence[str | None], tasks: int) -> list[tuple[int, ...]]:
    """The map outputs (by index; ``sites[i]`` is where output ``i`` merges, see
    ``ShuffleDescriptor.merge_site``) that ``tasks`` merge tasks merge together: of one site
    each, in map order, neighbours where the sites allow, about ``len(sites) / tasks`` a
    group."""
    per_task = max(1, -(-len(sites) // max(tasks, 1)))
    by_site: dict[str | None, list[int]] = {}
    for index, site in enumerate(sites):
        by_site.setdefault(site, []).append(index)
    return [
        tuple(indexes[start : start + per_task])
        for indexes in by_site.values()
        for start in range(0, len(indexes), per_task)
    ]


@dataclass(frozen=True, slots=True)
class MergedOutput:
    """A merged partition: the outputs of map tasks ``maps``, in map order, each in the
    attempt of the same place in ``attempts``."""

    descriptor: ShuffleDescriptor
    maps: tuple[int, ...]
    attempts: tuple[str, ...]

    def __post_init__(self) -> None:
        ordered = all(a < b for a, b in zip(self.maps, self.maps[1:], strict=False))
        if len(self.maps) != len(self.attempts) or not self.maps or not ordered:
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
            self._merged[merged.maps[0]] = merged
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
                del self._merged[each.maps[0]]
        return gone

    def sources(
        self, outputs: Sequence[ShuffleDescriptor]
    ) -> dict[ResultPartitionID, tuple[ShuffleDescriptor, ...]]:
        """Each merged partition's sources among the map outputs ``outputs`` (by map index),
        in the order their rows were merged."""
        with self._lock:
            merged = list(self._merged.values())
        return {
            each.descriptor.result_partition_id: tuple(outputs[index] for index in each.maps)
            for each in merged
        }

    def read_order(self, outputs: Sequence[ShuffleDescriptor]) -> tuple[ShuffleDescriptor, ...]:
        """What reducers read in place of the map outputs ``outputs`` (by map index): each
        merged partition where its first map task's output was, the outputs it holds left
        out, so that rows of neighbouring map tasks merged together come in the order they
        would unmerged."""
        with self._lock:
            merged = dict(self._merged)
        held = {index for each in merged.values() for index in each.maps}
        read: list[ShuffleDescriptor] = []
        for index, output in enumerate(outputs):
            found = merged.get(index)
            if found is not None:
                read.append(found.descriptor)
            elif index not in held:
                read.append(output)
        return tuple(read)
