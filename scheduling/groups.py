"""ConsumedPartitionGroup / ConsumerVertexGroup pairs, after Flink's EdgeManager: an
all-to-all exchange is exactly one pair (every consumer reads the same group of every
partition); a pointwise exchange is one pair per distinct range of the pointwise formulas.
Groups hold ``range``s, never per-edge lists, so building them is O(stages + groups) and
looking one up from a vertex or a partition is O(1).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from scheduling.graph import ExecutionVertexID, StageExchange, StageGraph
from scheduling.pointwise import consumers_of_partition, partitions_of_consumer
from shuffle_api import DistributionPattern, InvalidOperationError, ResultPartitionType

__all__ = [
    "ConsumedPartitionGroup",
    "ConsumerVertexGroup",
    "ExchangeGroups",
    "PartitionGroups",
    "build_groups",
]


@dataclass(eq=False, slots=True)
class ConsumedPartitionGroup:
    """Partitions of one result that the same consumers read together. ``unfinished`` counts
    the partitions not produced yet, so "is this input ready" is O(1)."""

    result_id: str
    partitions: range
    partition_type: ResultPartitionType
    number_of_consumers: int
    unfinished: int = field(init=False)

    def __post_init__(self) -> None:
        self.unfinished = len(self.partitions)

    @property
    def is_ready(self) -> bool:
        return self.unfinished == 0

    @property
    def key(self) -> str:
        """A name unique within the job (a cache or blob key is derived from it)."""
        return f"{self.result_id}-{self.partitions.start}-{self.partitions.stop - 1}"


@dataclass(frozen=True, slots=True)
class ConsumerVertexGroup:
    """The execution vertices of stage ``stage`` that read one consumed group."""

    stage: str
    consumers: range

    def vertices(self) -> Iterator[ExecutionVertexID]:
        return (ExecutionVertexID(self.stage, index) for index in self.consumers)


@dataclass(frozen=True, slots=True)
class ExchangeGroups:
    """The group pairs of one exchange: ``consumed[i]`` is read by ``consumer_groups[i]``;
    pairs in consumer order, each over a run of consumers."""

    exchange: StageExchange
    producers: int
    consumers: int
    consumed: tuple[ConsumedPartitionGroup, ...]
    consumer_groups: tuple[ConsumerVertexGroup, ...]

    def _pair_of_consumer(self, consumer: int) -> int:
        if self.exchange.pattern is DistributionPattern.ALL_TO_ALL:
            return 0
        if self.producers >= self.consumers:
            return consumer
        return partitions_of_consumer(consumer, self.producers, self.consumers).start

    def _pair_of_partition(self, partition: int) -> int:
        if self.exchange.pattern is DistributionPattern.ALL_TO_ALL:
            return 0
        if self.producers >= self.consumers:
            return consumers_of_partition(partition, self.producers, self.consumers).start
        return partition

    def consumed_by(self, consumer: int) -> ConsumedPartitionGroup:
        """The group consumer vertex ``consumer`` of the consumer stage reads."""
        if not 0 <= consumer < self.consumers:
            raise InvalidOperationError(f"consumer {consumer} outside [0, {self.consumers})")
        return self.consumed[self._pair_of_consumer(consumer)]

    def group_of_partition(self, partition: int) -> ConsumedPartitionGroup:
        if not 0 <= partition < self.producers:
            raise InvalidOperationError(f"partition {partition} outside [0, {self.producers})")
        return self.consumed[self._pair_of_partition(partition)]


def _exchange_groups(exchange: StageExchange, producers: int, consumers: int) -> ExchangeGroups:
    def pair(
        partitions: range, readers: range
    ) -> tuple[ConsumedPartitionGroup, ConsumerVertexGroup]:
        consumed = ConsumedPartitionGroup(
            exchange.result_id, partitions, exchange.partition_type, len(readers)
        )
        return consumed, ConsumerVertexGroup(exchange.consumer, readers)

    pairs: list[tuple[ConsumedPartitionGroup, ConsumerVertexGroup]]
    if exchange.pattern is DistributionPattern.ALL_TO_ALL:
        pairs = [pair(range(producers), range(consumers))]
    elif producers >= consumers:
        pairs = [
            pair(partitions_of_consumer(index, producers, consumers), range(index, index + 1))
            for index in range(consumers)
        ]
    else:
        pairs = [
            pair(range(index, index + 1), consumers_of_partition(index, producers, consumers))
            for index in range(producers)
        ]
    return ExchangeGroups(
        exchange,
        producers,
        consumers,
        tuple(consumed for consumed, _ in pairs),
        tuple(readers for _, readers in pairs),
    )


class PartitionGroups:
    """Every exchange's group pairs, and which partitions are finished."""

    def __init__(self, graph: StageGraph, exchanges: Sequence[ExchangeGroups]) -> None:
        self._graph = graph
        self._exchanges = tuple(exchanges)
        self._by_result: dict[str, list[ExchangeGroups]] = {}
        for groups in self._exchanges:
            self._by_result.setdefault(groups.exchange.result_id, []).append(groups)
        # One flag per partition, so a partition reported finished twice counts once.
        self._finished = {
            result_id: bytearray(found[0].producers) for result_id, found in self._by_result.items()
        }

    @property
    def graph(self) -> StageGraph:
        return self._graph

    @property
    def exchanges(self) -> tuple[ExchangeGroups, ...]:
        return self._exchanges

    def of_exchange(self, exchange: StageExchange) -> ExchangeGroups:
        for groups in self._by_result.get(exchange.result_id, ()):
            if groups.exchange == exchange:
                return groups
        raise InvalidOperationError(f"no exchange {exchange} in this graph")

    def of_result(self, result_id: str) -> Sequence[ExchangeGroups]:
        if result_id not in self._by_result:
            raise InvalidOperationError(f"no exchange consumes result {result_id!r}")
        return self._by_result[result_id]

    def consumed_by(self, vertex: ExecutionVertexID) -> list[ConsumedPartitionGroup]:
        """The groups ``vertex`` reads, one per input exchange of its stage."""
        return [
            self.of_exchange(exchange).consumed_by(vertex.index)
            for exchange in self._graph.inputs_of(vertex.stage)
        ]

    def groups_of_partition(self, result_id: str, partition: int) -> list[ConsumedPartitionGroup]:
        """Every group holding the partition: one per exchange that consumes its result."""
        return [groups.group_of_partition(partition) for groups in self.of_result(result_id)]

    def is_finished(self, result_id: str, partition: int) -> bool:
        self.of_result(result_id)[0].group_of_partition(partition)  # validates the index
        return bool(self._finished[result_id][partition])

    def partition_finished(self, result_id: str, partition: int) -> list[ConsumedPartitionGroup]:
        """Record that the partition's producer finished; return the groups now ready."""
        groups = self.groups_of_partition(result_id, partition)
        if self._finished[result_id][partition]:
            return []
        self._finished[result_id][partition] = 1
        for group in groups:
            group.unfinished -= 1
        return [group for group in groups if group.is_ready]

    def partition_unfinished(self, result_id: str, partition: int) -> None:
        """The partition must be produced again (its producer is rerun)."""
        groups = self.groups_of_partition(result_id, partition)
        if self._finished[result_id][partition]:
            self._finished[result_id][partition] = 0
            for group in groups:
                group.unfinished += 1


def build_groups(graph: StageGraph) -> PartitionGroups:
    """The group pairs of every exchange of ``graph``, in O(stages + groups)."""
    return PartitionGroups(
        graph,
        [
            _exchange_groups(
                exchange,
                graph.stage(exchange.producer).parallelism,
                graph.stage(exchange.consumer).parallelism,
            )
            for exchange in graph.exchanges
        ],
    )
