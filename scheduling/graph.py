"""The stage graph: stages (vertices with a parallelism) joined by exchanges (edges with a
distribution pattern and a result partition type).

Only stages and exchanges are objects; an execution vertex is a ``(stage, index)`` pair and a
partition a ``(result, index)`` pair, so a graph of 10,000 x 10,000 all-to-all costs two
stages and one exchange, not 10^8 edges.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from shuffle_api import (
    DistributionPattern,
    InvalidOperationError,
    ResultPartitionType,
)
from shuffle_api.ids import validate_id

__all__ = ["ExecutionVertexID", "Stage", "StageExchange", "StageGraph"]


@dataclass(frozen=True, slots=True)
class Stage:
    """A vertex of the job: ``parallelism`` execution vertices run its work."""

    name: str
    parallelism: int

    def __post_init__(self) -> None:
        validate_id(self.name, "stage name")
        if self.parallelism < 1:
            raise InvalidOperationError(
                f"stage {self.name!r}: parallelism must be >= 1, got {self.parallelism}"
            )


@dataclass(frozen=True, slots=True)
class StageExchange:
    """An edge: ``producer``'s result ``result_id`` (one partition per producer vertex) read
    by ``consumer``. A result may feed several consumer stages, one exchange each."""

    result_id: str
    producer: str
    consumer: str
    pattern: DistributionPattern = DistributionPattern.ALL_TO_ALL
    partition_type: ResultPartitionType = ResultPartitionType.BLOCKING

    def __post_init__(self) -> None:
        validate_id(self.result_id, "result id")


@dataclass(frozen=True, slots=True, order=True)
class ExecutionVertexID:
    """Execution vertex ``index`` of stage ``stage``."""

    stage: str
    index: int


class StageGraph:
    """Stages in topological order and the exchanges between them (a DAG)."""

    def __init__(self, stages: Iterable[Stage], exchanges: Iterable[StageExchange]) -> None:
        by_name: dict[str, Stage] = {}
        for stage in stages:
            if stage.name in by_name:
                raise InvalidOperationError(f"two stages are named {stage.name!r}")
            by_name[stage.name] = stage
        self._exchanges = tuple(exchanges)
        self._inputs: dict[str, list[StageExchange]] = {name: [] for name in by_name}
        self._outputs: dict[str, list[StageExchange]] = {name: [] for name in by_name}
        producer_of_result: dict[str, str] = {}
        for exchange in self._exchanges:
            for end in (exchange.producer, exchange.consumer):
                if end not in by_name:
                    raise InvalidOperationError(
                        f"exchange of result {exchange.result_id!r} names unknown stage {end!r}"
                    )
            known = producer_of_result.setdefault(exchange.result_id, exchange.producer)
            if known != exchange.producer:
                raise InvalidOperationError(
                    f"result {exchange.result_id!r} is produced by both {known!r} and"
                    f" {exchange.producer!r}"
                )
            self._inputs[exchange.consumer].append(exchange)
            self._outputs[exchange.producer].append(exchange)
        self._by_name = by_name
        self._stages = self._topological(by_name)

    def _topological(self, by_name: dict[str, Stage]) -> tuple[Stage, ...]:
        """Kahn's order (stable: ties keep the order stages were given in)."""
        waiting = {name: len(inputs) for name, inputs in self._inputs.items()}
        ready = [name for name, count in waiting.items() if count == 0]
        order: list[Stage] = []
        while ready:
            name = ready.pop(0)
            order.append(by_name[name])
            for exchange in self._outputs[name]:
                waiting[exchange.consumer] -= 1
                if waiting[exchange.consumer] == 0:
                    ready.append(exchange.consumer)
        if len(order) != len(by_name):
            cyclic = sorted(name for name, count in waiting.items() if count > 0)
            raise InvalidOperationError(f"the stage graph has a cycle through {cyclic}")
        return tuple(order)

    @property
    def stages(self) -> tuple[Stage, ...]:
        """Every stage, producers before their consumers."""
        return self._stages

    @property
    def exchanges(self) -> tuple[StageExchange, ...]:
        return self._exchanges

    def stage(self, name: str) -> Stage:
        if name not in self._by_name:
            raise InvalidOperationError(f"no stage named {name!r}")
        return self._by_name[name]

    def inputs_of(self, stage: str) -> Sequence[StageExchange]:
        return tuple(self._inputs[stage])
