"""Where work goes: placement strategies that spread requests (partitions, tasks) over targets
(workers, executors), after Flink's balanced scheduling (FLIP-370).

A strategy places a batch: requests sorted by weight, largest first, each given to the
target(s) least loaded at that moment, the loads updated as it goes (longest processing time
first). A batch of equal requests so ends with counts that differ by at most one, and a batch of
unequal ones with loads close to even.

    placed = TaskBalancedPlacement().place(requests, targets)  # request id -> target ids
"""

from __future__ import annotations

import abc
import heapq
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from shuffle_api import ConfigError, InvalidOperationError
from shuffle_api.errors import NoPlacementTargetError

__all__ = [
    "PLACEMENT_STRATEGIES",
    "LocalInputPreferredPlacement",
    "NoPlacementTargetError",
    "PlacementRequest",
    "PlacementStrategy",
    "PlacementTarget",
    "TaskBalancedPlacement",
    "new_placement_strategy",
]


@dataclass(frozen=True, slots=True)
class PlacementTarget:
    """Where requests can go (a worker, an executor) and what it already holds.

    ``load`` is the weight already assigned (bytes, or whatever unit the requests' weights
    use); ``count`` the number of items already assigned, which breaks ties on load.
    """

    target_id: str
    host: str = ""
    load: float = 0
    count: int = 0


@dataclass(frozen=True, slots=True)
class PlacementRequest:
    """One item to place on ``replicas`` distinct targets.

    ``host`` is where its input is produced (local-input-preferred placement reads it);
    ``weight`` its expected size in the targets' load unit: when unknown, pass the mean.
    """

    request_id: str
    host: str = ""
    weight: float = 1
    replicas: int = 1

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise InvalidOperationError(
                f"placement request {self.request_id!r}: replicas must be >= 1, got {self.replicas}"
            )
        if not (math.isfinite(self.weight) and self.weight >= 0):
            raise InvalidOperationError(
                f"placement request {self.request_id!r}: weight must be finite and >= 0,"
                f" got {self.weight}"
            )


class PlacementStrategy(abc.ABC):
    """Chooses targets for a batch of requests."""

    @abc.abstractmethod
    def place(
        self, requests: Sequence[PlacementRequest], targets: Sequence[PlacementTarget]
    ) -> dict[str, tuple[str, ...]]:
        """Target ids by request id: ``min(replicas, len(targets))`` distinct targets each,
        first replica first. Raises :class:`NoPlacementTargetError` when there is no target.
        """


# Heap entries order "least loaded first": load, then count, then id (deterministic ties).
_Entry = tuple[float, int, str]


class _Loads:
    """The targets' current loads in a heap over all targets and a heap per host.

    Heaps drop entries lazily: an entry is live only while it equals its target's current
    (load, count) and the target is not taken, so taking or charging a target needs no search.
    A heap is rebuilt when stale entries outnumber live ones, so a batch costs
    O((R + T) log T) for R requests on T targets (local-input-preferred adds, per remote
    replica, the local targets it passes over).
    """

    def __init__(self, targets: Sequence[PlacementTarget]) -> None:
        twice = sorted(tid for tid, n in Counter(t.target_id for t in targets).items() if n > 1)
        if twice:
            raise InvalidOperationError(f"placement targets named more than once: {twice}")
        self._current = {t.target_id: (t.load, t.count) for t in targets}
        self._host = {t.target_id: t.host for t in targets}
        self._members: dict[str, list[str]] = {}
        for target in targets:
            self._members.setdefault(target.host, []).append(target.target_id)
        self._taken: set[str] = set()
        self._all = self._heap_of(list(self._current))
        self._by_host = {host: self._heap_of(ids) for host, ids in self._members.items()}

    def _heap_of(self, target_ids: Sequence[str]) -> list[_Entry]:
        heap = [(*self._current[tid], tid) for tid in target_ids if tid not in self._taken]
        heapq.heapify(heap)
        return heap

    def _is_live(self, entry: _Entry) -> bool:
        load, count, target_id = entry
        return target_id not in self._taken and self._current[target_id] == (load, count)

    def has_host(self, host: str) -> bool:
        return host in self._members

    def take(
        self, count: int, *, on_host: str | None = None, avoid_host: str | None = None
    ) -> list[str]:
        """Up to ``count`` least-loaded targets not taken yet: on ``on_host`` if given, and
        not on ``avoid_host``. They stay taken (so distinct) until :meth:`charge`."""
        heap = self._all if on_host is None else self._by_host[on_host]
        taken: list[str] = []
        avoided: list[_Entry] = []
        while heap and len(taken) < count:
            entry = heapq.heappop(heap)
            if not self._is_live(entry):
                continue
            target_id = entry[2]
            if self._host[target_id] == avoid_host:
                avoided.append(entry)
                continue
            self._taken.add(target_id)
            taken.append(target_id)
        for entry in avoided:
            heapq.heappush(heap, entry)
        return taken

    def charge(self, target_ids: Sequence[str], weight: float) -> None:
        """Put taken targets back, each holding one more item of ``weight``."""
        for target_id in target_ids:
            self._taken.discard(target_id)
            load, count = self._current[target_id]
            self._current[target_id] = (load + weight, count + 1)
            entry = (load + weight, count + 1, target_id)
            host = self._host[target_id]
            heapq.heappush(self._all, entry)
            heapq.heappush(self._by_host[host], entry)
            if len(self._by_host[host]) > 2 * len(self._members[host]) + 8:
                self._by_host[host] = self._heap_of(self._members[host])
        if len(self._all) > 2 * len(self._current) + 8:
            self._all = self._heap_of(list(self._current))


class _GreedyPlacement(PlacementStrategy):
    """Largest request first, each to the targets :meth:`_choose` picks from current loads."""

    def place(
        self, requests: Sequence[PlacementRequest], targets: Sequence[PlacementTarget]
    ) -> dict[str, tuple[str, ...]]:
        if not targets:
            raise NoPlacementTargetError(
                f"no target to place {len(requests)} request(s) on: none is available"
            )
        twice = sorted(rid for rid, n in Counter(r.request_id for r in requests).items() if n > 1)
        if twice:
            raise InvalidOperationError(f"placement requests named more than once: {twice}")
        loads = _Loads(targets)
        placed: dict[str, tuple[str, ...]] = {}
        # sorted() is stable: equal weights keep the caller's order, so results are repeatable.
        for request in sorted(requests, key=lambda r: -r.weight):
            chosen = self._choose(request, loads)
            loads.charge(chosen, request.weight)
            placed[request.request_id] = tuple(chosen)
        return {request.request_id: placed[request.request_id] for request in requests}

    @abc.abstractmethod
    def _choose(self, request: PlacementRequest, loads: _Loads) -> list[str]:
        """Distinct target ids for ``request`` (taken from ``loads``), first replica first."""


class TaskBalancedPlacement(_GreedyPlacement):
    """Every replica on the least-loaded targets: least load, then fewest items, then id."""

    def _choose(self, request: PlacementRequest, loads: _Loads) -> list[str]:
        return loads.take(request.replicas)


class LocalInputPreferredPlacement(_GreedyPlacement):
    """The first replica on a target on the request's host when there is one (the least
    loaded of them), so the input is written without the network; other replicas on other
    hosts when there are enough, so a copy survives losing that host. With no target on the
    request's host, the same as :class:`TaskBalancedPlacement`."""

    def _choose(self, request: PlacementRequest, loads: _Loads) -> list[str]:
        if not loads.has_host(request.host):
            return loads.take(request.replicas)
        chosen = loads.take(1, on_host=request.host)
        chosen += loads.take(request.replicas - 1, avoid_host=request.host)
        # Not enough targets elsewhere: the rest on the request's own host.
        chosen += loads.take(request.replicas - len(chosen))
        return chosen


PLACEMENT_STRATEGIES: Final[dict[str, type[PlacementStrategy]]] = {
    "task-balanced": TaskBalancedPlacement,
    "local-input-preferred": LocalInputPreferredPlacement,
    # The names external-shuffle.coordinator.placement has always accepted.
    "balanced": TaskBalancedPlacement,
    "local-preferred": LocalInputPreferredPlacement,
}


def new_placement_strategy(name: str, *, config_key: str = "placement") -> PlacementStrategy:
    """The strategy called ``name`` (a key of :data:`PLACEMENT_STRATEGIES`); ``config_key``
    names the setting it came from, for the error when the name is unknown."""
    strategy = PLACEMENT_STRATEGIES.get(name.strip().lower())
    if strategy is None:
        raise ConfigError(
            f"{config_key} = {name!r}: unknown placement strategy; choose one of"
            f" {', '.join(PLACEMENT_STRATEGIES)}"
        )
    return strategy()
