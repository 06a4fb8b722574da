"""A result of ``SparkShuffle`` (a DataFrame of reduce tasks) as the driver keeps it, and the
figures it gives in :class:`ShuffleStatistics`."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from pyspark_shuffle.driver.broadcast import BroadcastSide
from pyspark_shuffle.driver.exchange import Exchange
from pyspark_shuffle.driver.inputs import RowTasks
from pyspark_shuffle.driver.registry import RegisteredExchange, RegisteredResult
from pyspark_shuffle.kernels.operations import ReduceOperation
from pyspark_shuffle.spark.link import TaskAccumulator, TaskBroadcast
from pyspark_shuffle.tasks.map_reduce import MapOutputs, ReadCounts
from scheduling.groups import ConsumedPartitionGroup
from scheduling.skew import ConsumerPlan
from shuffle_api import new_id

__all__ = ["Result", "ShuffleStatistics", "new_stage"]


@dataclass(frozen=True, slots=True)
class ShuffleStatistics:
    """What the shuffles behind one result wrote, and what its reducers read so far.
    ``bytes_per_reducer``: what each reducer reads, as the plan weighs it (stored bytes,
    shared out by the rows' Arrow bytes: see ``planning.codec_neutral_bytes``);
    ``skewed_subpartitions``: split among reducers; ``unsplittable_subpartitions``: skewed
    but read whole by one reducer (the operation keeps a key in one reducer, or one map task
    wrote it all)."""

    map_tasks: int
    map_seconds: float
    reducers: int
    rows_written: int
    bytes_written: int
    rows_read: int
    bytes_read: int
    map_tasks_rerun: int
    bytes_per_reducer: tuple[int, ...]
    skewed_subpartitions: tuple[int, ...]
    unsplittable_subpartitions: tuple[int, ...]
    fused_inputs: int = 0
    """This result's exchanges whose map tasks read an earlier result straight from its
    reduce tasks (a fused stage), not through the JVM."""
    upstream_released: int = 0
    """Exchanges earlier in this result's chain already released (no live result reads
    them)."""
    broadcast_side: str | None = None
    """For a join: the side broadcast (``"left"`` or ``"right"``; the figures above are that
    side's, ``reducers`` the other side's tasks that joined with it), or ``None``."""
    kept: bool = False
    """Later operations read this result's rows from a copy its tasks wrote once (see
    ``pyspark-shuffle.keep-results``), not by running its tasks again."""
    spark_shuffle_bytes: int | None = None
    """Bytes of Spark's own shuffle that this result's exchanges keep, so that Spark reruns
    map tasks lost with an executor: one small row per map task, read by every reducer (0
    where the service's partitions outlive executors; ``None`` where Spark cannot say)."""
    merged_partitions: int = 0
    """Partitions its reducers read each in place of many map outputs, merged per reducer
    (see ``pyspark-shuffle.merge.min-blocks``)."""
    map_outputs_merged: int = 0
    """The map outputs those merged partitions hold (the rest were read one by one)."""


def new_stage() -> str:
    return f"reduce-{new_id()[:16]}"


@dataclass
class Result(RegisteredResult):
    exchanges: list[Exchange]
    operation: ReduceOperation
    schema: StructType
    plan: ConsumerPlan
    consumed_groups: list[ConsumedPartitionGroup]
    read: TaskAccumulator[ReadCounts]
    """Rows and bytes its reducers read."""
    reruns_read: TaskAccumulator[MapOutputs] | None
    """Map outputs Spark reran inside an action (where Spark holds a shuffle of them)."""
    broadcasts: tuple[TaskBroadcast[Any], ...]
    row_tasks: RowTasks
    """Its tasks (reducers, or a broadcast join's), and what each runs to make its rows."""
    broadcast: BroadcastSide | None = None
    """A broadcast join's: ``exchanges`` are then those its tasks read through a fused input."""
    stage: str = dataclasses.field(default_factory=new_stage)
    wraps: str | None = None
    tasks_run: TaskAccumulator[frozenset[int]] | None = None
    """A broadcast join whose tasks Spark could not count before they ran: those that ran."""
    merged: tuple[int, int] = (0, 0)
    """Merged partitions its reducers read, and the map outputs they hold."""
    kept: tuple[DataFrame, Result] | None = None
    """Its rows as kept for later readers (see ``pyspark-shuffle.keep-results``): the
    DataFrame that reads them back task by task, and its result; held here, for as long as
    this result is."""
    keeping: threading.Lock = dataclasses.field(
        default_factory=threading.Lock, init=False, repr=False, compare=False
    )
    """Held while its rows are kept: two operations reading it at once keep them once."""

    def take_dependents(self) -> list[object]:
        if self.kept is None:
            return []
        frame, self.kept = self.kept[0], None
        return [frame]

    @property
    def number_of_tasks(self) -> int:
        return self.row_tasks.number_of_tasks or 1

    def map_outputs_rerun(self) -> MapOutputs:
        return frozenset() if self.reruns_read is None else self.reruns_read.value

    def statistics(self) -> ShuffleStatistics:
        """Its figures so far (what its reducers read is counted as they run)."""
        if self.broadcast is not None:
            side = self.broadcast
            joining = side.joining_tasks if self.tasks_run is None else len(self.tasks_run.value)
            return ShuffleStatistics(
                map_tasks=side.map_tasks,
                map_seconds=side.map_seconds,
                reducers=joining,
                rows_written=side.rows,
                bytes_written=side.bytes,
                rows_read=side.rows,
                bytes_read=side.bytes,
                map_tasks_rerun=0,
                bytes_per_reducer=(),
                skewed_subpartitions=(),
                unsplittable_subpartitions=(),
                fused_inputs=int(bool(self.exchanges)),
                upstream_released=sum(
                    1 for exchange in (*self.exchanges, *self._upstream()) if exchange.released
                ),
                broadcast_side=side.side,
                kept=self.kept is not None,
            )
        read = self.read.value  # once: both figures from one listing
        exchanges = self.exchanges
        return ShuffleStatistics(
            map_tasks=sum(exchange.number_of_maps for exchange in exchanges),
            map_seconds=sum(exchange.runs.seconds for exchange in exchanges),
            reducers=len(self.plan.tasks),
            rows_written=sum(exchange.total_rows for exchange in exchanges),
            bytes_written=sum(exchange.total_bytes for exchange in exchanges),
            rows_read=read[0],
            bytes_read=read[1],
            map_tasks_rerun=sum(
                runs - 1 for exchange in exchanges for runs in exchange.runs.per_map.values()
            ),
            bytes_per_reducer=tuple(task.bytes for task in self.plan.tasks),
            skewed_subpartitions=self.plan.skewed,
            unsplittable_subpartitions=self.plan.unsplittable,
            fused_inputs=sum(1 for exchange in exchanges if exchange.upstream),
            upstream_released=sum(1 for exchange in self._upstream() if exchange.released),
            kept=self.kept is not None,
            spark_shuffle_bytes=_sum_known(
                exchange.spark_shuffle_bytes() for exchange in exchanges
            ),
            merged_partitions=self.merged[0],
            map_outputs_merged=self.merged[1],
        )

    def _upstream(self) -> list[RegisteredExchange]:
        """Every exchange the fused stages behind it read, transitively."""
        found: dict[int, RegisteredExchange] = {}
        stack = [upstream for exchange in self.exchanges for upstream in exchange.upstream]
        while stack:
            exchange = stack.pop()
            if id(exchange) not in found:
                found[id(exchange)] = exchange
                stack.extend(exchange.upstream)
        return list(found.values())


def _sum_known(values: Iterable[int | None]) -> int | None:
    """The sum, or ``None`` if any is unknown."""
    total = 0
    for value in values:
        if value is None:
            return None
        total += value
    return total
