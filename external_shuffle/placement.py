"""Where the coordinator puts a partition: a strategy chosen by
``external-shuffle.coordinator.placement``."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass

from shuffle_api import ConfigError

__all__ = [
    "BalancedPlacement",
    "Candidate",
    "LocalPreferredPlacement",
    "PlacementStrategy",
    "placement_strategy",
]


@dataclass(frozen=True, slots=True)
class Candidate:
    """A live worker that takes partitions, and its load as the coordinator estimates it."""

    worker_id: str
    host: str
    estimated_bytes: int
    partitions: int


class PlacementStrategy(abc.ABC):
    @abc.abstractmethod
    def choose(self, candidates: Sequence[Candidate], producer_host: str, count: int) -> list[str]:
        """Ids of ``min(count, len(candidates))`` distinct workers, first replica first."""


def _least_loaded(candidates: Sequence[Candidate], count: int) -> list[str]:
    ranked = sorted(candidates, key=lambda c: (c.estimated_bytes, c.partitions, c.worker_id))
    return [candidate.worker_id for candidate in ranked[:count]]


class BalancedPlacement(PlacementStrategy):
    """The least-loaded workers: fewest estimated bytes, then fewest partitions."""

    def choose(self, candidates: Sequence[Candidate], producer_host: str, count: int) -> list[str]:
        return _least_loaded(candidates, count)


class LocalPreferredPlacement(PlacementStrategy):
    """The first replica on the producer's host when a worker runs there (least loaded of
    them); other replicas, and the first when none is local, balanced across the rest."""

    def choose(self, candidates: Sequence[Candidate], producer_host: str, count: int) -> list[str]:
        local = [c for c in candidates if c.host == producer_host]
        if not local:
            return _least_loaded(candidates, count)
        [first] = _least_loaded(local, 1)
        others = [c for c in candidates if c.worker_id != first]
        remote = [c for c in others if c.host != producer_host]
        # Replicas on other hosts survive the loss of this one; local ones only if none remote.
        rest = _least_loaded(remote, count - 1)
        rest += _least_loaded([c for c in others if c.worker_id not in rest], count - 1 - len(rest))
        return [first, *rest]


def placement_strategy(name: str) -> PlacementStrategy:
    strategies: dict[str, type[PlacementStrategy]] = {
        "balanced": BalancedPlacement,
        "local-preferred": LocalPreferredPlacement,
    }
    if name not in strategies:
        raise ConfigError(f"unknown placement {name!r}; choose one of {', '.join(strategies)}")
    return strategies[name]()
