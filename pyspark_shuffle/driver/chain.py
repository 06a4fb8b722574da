"""The operations of one ``SparkShuffle`` as one job graph, and what of it may be released.

After Flink's job master: each exchange is an edge of a :class:`~scheduling.StageGraph` from the
stage whose tasks write it (its source's map stage, or the reduce stage of the result it was
fused from) to each stage that reads it (the reduce stage of every result over it). An exchange
is released once every region consuming it has finished, as Flink's
RegionPartitionGroupReleaseStrategy releases a consumed partition group. A reduce stage is
finished for good only when the user drops its result (Python collected it, or ``release``):
until then any action on the result runs it again.

A finished stage may still run again to remake a partition lost with an executor. On the
default service a later stage's map outputs live on the executors that wrote them; one lost
reruns its producer, which reads the producer's inputs again. Flink then restarts the regions
upstream of a released partition too. The Spark driver does the same once Spark is told a
released exchange's map outputs are gone (``spark_internals``), so an exchange only such a rerun
could read is released (``recomputable``); where Spark cannot be told, it is kept. Either way
the results whose reduce stages a rerun may run keep what their tasks need
(:meth:`Chain.rerunnable`).
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.graph import ExecutionVertexID, Stage, StageExchange, StageGraph
from scheduling.groups import build_groups
from scheduling.regions import build_regions

__all__ = ["Chain", "ChainExchange", "ChainStage"]


@dataclass(frozen=True, slots=True)
class ChainExchange:
    """One exchange, written by ``maps`` tasks of stage ``producer``."""

    result_id: str
    producer: str
    maps: int
    on_executors: bool
    """Its partitions go with the executor that wrote them (the default service's), so a lost
    one is remade by rerunning its producer."""


@dataclass(frozen=True, slots=True)
class ChainStage:
    """The reduce stage of one result: ``tasks`` tasks reading the exchanges ``inputs``."""

    name: str
    tasks: int
    inputs: tuple[str, ...]
    wraps: str | None = None
    """The stage whose tasks its tasks run, then add to (a broadcast join over a fused
    result): that stage's result keeps what its tasks read while this one may run."""


class Chain:
    """The exchanges of one ``SparkShuffle`` and the reduce stages that read them."""

    def __init__(self) -> None:
        self._exchanges: dict[str, ChainExchange] = {}
        self._stages: dict[str, ChainStage] = {}
        self._live: set[str] = set()
        self._pinned: set[str] = set()
        self._released: set[str] = set()

    def add_exchange(self, exchange: ChainExchange, *, pinned: bool = False) -> None:
        """A written exchange; a ``pinned`` one is never :meth:`releasable`."""
        self._exchanges[exchange.result_id] = exchange
        if pinned:
            self._pinned.add(exchange.result_id)

    def add_stage(self, stage: ChainStage) -> None:
        """The reduce stage of a result the user now holds."""
        self._stages[stage.name] = stage
        self._live.add(stage.name)

    def drop(self, stage: str) -> None:
        """The user dropped the stage's result: it no longer runs but for a rerun."""
        self._live.discard(stage)

    def released(self, result_id: str) -> None:
        self._released.add(result_id)

    def read_by_live(self) -> set[str]:
        """The exchanges that results the user holds read."""
        return {result_id for name in self._live for result_id in self._stages[name].inputs}

    def graph(self) -> StageGraph:
        """Every stage and exchange not released, as one stage graph."""
        # An empty input makes a stage of no task; as one vertex it changes nothing here.
        stages = {
            exchange.producer: Stage(exchange.producer, max(exchange.maps, 1))
            for exchange in self._exchanges.values()
            if exchange.producer not in self._stages
        }
        for stage in self._stages.values():
            stages[stage.name] = Stage(stage.name, max(stage.tasks, 1))
        edges = [
            StageExchange(result_id, self._exchanges[result_id].producer, stage.name)
            for stage in self._stages.values()
            for result_id in stage.inputs
            if result_id in self._exchanges and result_id not in self._released
        ]
        return StageGraph(stages.values(), edges)

    def releasable(self, *, recomputable: bool) -> list[str]:
        """Exchanges not released nor pinned, read by at least one stage, every region of
        whose consumers has finished; unless ``recomputable``, none that a rerun may read."""
        graph = self.graph()
        regions = build_regions(graph)
        groups = build_groups(graph)
        unfinished = {
            regions.region_of(ExecutionVertexID(name, index)).region_id
            for name in self._live
            for index in range(max(self._stages[name].tasks, 1))
        }
        kept = self._pinned | self._released
        if not recomputable:
            kept |= self.rerun_inputs()
        read = {edge.result_id for edge in graph.exchanges}
        return [
            result_id
            for result_id in self._exchanges
            if result_id in read
            and result_id not in kept
            and all(
                regions.region_of(vertex).region_id not in unfinished
                for exchange in groups.of_result(result_id)
                for group in exchange.consumer_groups
                for vertex in group.vertices()
            )
        ]

    def rerunnable(self) -> set[str]:
        """Stages no result the user holds runs whose tasks may run again: in a rerun that
        remakes a partition a live stage, a pinned or a not yet read exchange needs, or as
        the tasks of a stage that may run (see ``ChainStage.wraps``)."""
        running = self._rerun_walk()[0] | self._live
        waiting = list(running)
        while waiting:
            wrapped = self._stages[waiting.pop()].wraps
            if wrapped is not None and wrapped in self._stages and wrapped not in running:
                running.add(wrapped)
                waiting.append(wrapped)
        return running - self._live

    def rerun_inputs(self) -> set[str]:
        """The exchanges that the stages a rerun may run read."""
        return self._rerun_walk()[1]

    def _rerun_walk(self) -> tuple[set[str], set[str]]:
        """The stages a rerun may run, and the exchanges they read. From the exchanges live
        stages read, pinned ones and those no stage read yet, up through every exchange on
        executors to the stage that wrote it: a lost partition of it reruns that stage."""
        stages: set[str] = set()
        inputs: set[str] = set()
        read = {result_id for stage in self._stages.values() for result_id in stage.inputs}
        waiting = [
            *self.read_by_live(),
            *(self._pinned - self._released),
            *(set(self._exchanges) - read - self._released),
        ]
        seen: set[str] = set()
        while waiting:
            result_id = waiting.pop()
            exchange = self._exchanges.get(result_id)
            if result_id in seen or exchange is None:
                continue
            seen.add(result_id)
            producer = self._stages.get(exchange.producer)  # None: a source's map stage
            if exchange.on_executors and producer is not None and producer.name not in stages:
                stages.add(producer.name)
                inputs.update(producer.inputs)
                waiting.extend(producer.inputs)
        return stages, inputs

    def prune(self) -> None:
        """Forget released exchanges no rerun reads, and dropped stages that neither read an
        exchange still held nor write one a rerun may remake."""
        rerun_exchanges = self._rerun_walk()[1]
        rerun_stages = self.rerunnable()
        for result_id in self._released - rerun_exchanges:
            del self._exchanges[result_id]
            self._pinned.discard(result_id)
        self._released &= rerun_exchanges
        producers = {exchange.producer for exchange in self._exchanges.values()}
        for name in list(self._stages):
            if (
                name not in self._live
                and name not in rerun_stages
                and name not in producers
                and all(
                    result_id not in self._exchanges or result_id in self._released
                    for result_id in self._stages[name].inputs
                )
            ):
                del self._stages[name]
