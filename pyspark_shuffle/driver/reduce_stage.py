"""The reduce stage of a result: how many reducers read what (the plan), and the Spark
DataFrame whose tasks are the reducers."""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 (Spark's own spelling)
from pyspark.sql.types import StructType

from pyspark_shuffle.driver.exchange import Exchange
from pyspark_shuffle.driver.inputs import Produce, RowTasks
from pyspark_shuffle.driver.results import Result
from pyspark_shuffle.driver.schemas import arrow_schema
from pyspark_shuffle.kernels.operations import ReduceOperation
from pyspark_shuffle.kernels.planning import adaptive_plan, one_reducer_per_subpartition
from pyspark_shuffle.spark.link import SparkLink, TaskAccumulator, TaskBroadcast
from pyspark_shuffle.tasks.map_reduce import (
    MapOutputs,
    ReduceStageSpec,
    add_counts,
    merge_map_outputs,
    run_reduce_task,
)
from pyspark_shuffle.tasks.merged_reads import MergedSources
from pyspark_shuffle.tasks.python_worker import task_starts
from scheduling.deployment import (
    ConsumerDeploymentDescriptor,
    DescriptorCache,
    consumer_deployments,
    planned_reads,
)
from scheduling.graph import Stage, StageExchange, StageGraph
from scheduling.groups import (
    ConsumedPartitionGroup,
    ExchangeGroups,
    PartitionGroups,
    build_groups,
)
from scheduling.skew import ConsumerPlan, InputSlice, ProducerRange
from shuffle_api import Configuration, ShuffleDescriptor, StageFailedError
from shuffle_runtime.batches import conform

__all__ = ["DriverContext", "plan_reducers", "reads_every_map_output", "reduce_stage"]

_LOG = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DriverContext:
    """What the stages of one ``SparkShuffle`` share on the driver."""

    spark: SparkSession
    link: SparkLink
    secret: bytes
    """The application's secret: shipped with the tasks, never in descriptors."""
    descriptors: DescriptorCache
    reruns_in_actions: bool
    """Spark reruns lost map tasks inside an action (it holds a shuffle of their rows)."""


def plan_reducers(
    configuration: Configuration,
    exchanges: Sequence[Exchange],
    operation: ReduceOperation,
    default_parallelism: int,
) -> ConsumerPlan:
    """One reducer per subpartition, or as many as the bytes written ask for (skewed
    subpartitions split where ``operation`` allows)."""
    inputs = [exchange.written_bytes() for exchange in exchanges]
    if not exchanges[0].automatic_reducers:
        return one_reducer_per_subpartition(inputs)
    plan = adaptive_plan(
        configuration,
        inputs,
        operation.splittable_inputs(len(exchanges)),
        default_parallelism,
    )
    if plan.unsplittable:
        _LOG.warning(
            "%s: skewed subpartitions %s are each read whole by one reducer (the operation"
            " keeps a key in one reducer, or one map task wrote the subpartition); reducers"
            " read %s bytes at most",
            ", ".join(exchange.name for exchange in exchanges),
            list(plan.unsplittable),
            f"{max(task.bytes for task in plan.tasks):,}",
        )
    return plan


def reads_every_map_output(plan: ConsumerPlan, input_index: int, maps: int) -> bool:
    """Whether every task of ``plan`` reads input ``input_index`` from all its ``maps`` map
    tasks (none split a skewed subpartition by map tasks): then merged partitions may stand
    in for them."""
    whole = ProducerRange(0, maps - 1)
    return all(task.inputs[input_index].producers == whole for task in plan.tasks)


def reduce_stage(
    driver: DriverContext,
    configuration: Configuration,
    exchanges: Sequence[Exchange],
    operation: ReduceOperation,
    schema: StructType,
    *,
    plan: ConsumerPlan,
) -> tuple[DataFrame, Result]:
    """The reducers of ``plan`` over ``exchanges`` running ``operation``: their DataFrame (of
    ``schema``), and what the driver keeps to read it."""
    # Merged partitions in place of the map outputs they hold, where each reducer reads
    # every map output.
    read = [
        exchange.read_descriptors()
        if reads_every_map_output(plan, index, exchange.number_of_maps)
        else exchange.descriptors()
        for index, exchange in enumerate(exchanges)
    ]
    merged_sources: MergedSources = {
        merged: sources
        for exchange, descriptors in zip(exchanges, read, strict=True)
        for merged, sources in exchange.merged_sources(descriptors).items()
    }
    # Only where reducers read merged partitions: most stages read none.
    shared_sources = driver.link.share(merged_sources) if merged_sources else None
    groups = _consumed_groups(exchanges, [len(each) for each in read], len(plan.tasks))
    deployments = _shared_deployments(driver, groups, exchanges, read, plan)
    counts = driver.link.tally((0, 0), add_counts)
    reruns_read: TaskAccumulator[MapOutputs] | None = None
    if driver.reruns_in_actions:
        reruns_read = driver.link.tally(MapOutputs(), merge_map_outputs)
    spec = ReduceStageSpec(
        configuration,
        driver.secret,
        deployments,
        tuple(
            exchange.schema(arrow_schema(driver.spark, exchange.frame_schema))
            for exchange in exchanges
        ),
        operation,
        counts,
        reruns_read,
        shared_sources,
    )
    reduce_partition = _reduce_partition(spec, arrow_schema(driver.spark, schema))
    reducers = _reducer_rows(driver.spark, exchanges, len(plan.tasks))
    names = ", ".join(exchange.name for exchange in exchanges)
    tasks = RowTasks(reducers, reduce_partition, f"reduce stage of {names}", len(plan.tasks))
    consumed = [group for each in groups.exchanges for group in each.consumed]
    result = Result(
        list(exchanges),
        operation,
        schema,
        plan,
        consumed,
        counts,
        reruns_read,
        (deployments,) if shared_sources is None else (deployments, shared_sources),
        tasks,
        merged=_merged_counts(exchanges, read),
    )
    return reducers.mapInArrow(reduce_partition, schema), result


def _merged_counts(
    exchanges: Sequence[Exchange], read: Sequence[Sequence[ShuffleDescriptor]]
) -> tuple[int, int]:
    """Merged partitions among what reducers read (numbered after the map tasks), and the
    map outputs they stand in for."""
    partitions = outputs = 0
    for exchange, descriptors in zip(exchanges, read, strict=True):
        merged = sum(
            1
            for descriptor in descriptors
            if descriptor.result_partition_id.partition_id.partition_index
            >= exchange.number_of_maps
        )
        partitions += merged
        outputs += exchange.number_of_maps - (len(descriptors) - merged)
    return partitions, outputs


def _consumed_groups(
    exchanges: Sequence[Exchange], partitions: Sequence[int], reducers: int
) -> PartitionGroups:
    """The partition groups ``reducers`` reduce tasks consume, one stage of ``partitions[i]``
    partitions (map outputs, or merged partitions and the rest) per exchange."""
    graph = StageGraph(
        [
            *(Stage(f"map-{i}", count) for i, count in enumerate(partitions)),
            Stage("reduce", reducers),
        ],
        [StageExchange(e.result_id, f"map-{i}", "reduce") for i, e in enumerate(exchanges)],
    )
    return build_groups(graph)


def _shared_deployments(
    driver: DriverContext,
    groups: PartitionGroups,
    exchanges: Sequence[Exchange],
    read: Sequence[Sequence[ShuffleDescriptor]],
    plan: ConsumerPlan,
) -> TaskBroadcast[tuple[ConsumerDeploymentDescriptor, ...]]:
    """What each reducer of ``plan`` reads (of exchange ``i``, the partitions ``read[i]``),
    shared with the tasks."""
    by_result = {exchange.result_id: each for exchange, each in zip(exchanges, read, strict=True)}

    def descriptors_of(group: ConsumedPartitionGroup) -> Sequence[ShuffleDescriptor]:
        return by_result[group.result_id]

    def reads(input_index: int, groups: ExchangeGroups) -> Sequence[InputSlice]:
        slices = planned_reads(plan)(input_index, groups)
        exchange = exchanges[input_index]
        if len(read[input_index]) == exchange.number_of_maps:
            return slices
        # Every reducer reads every map output (see reads_every_map_output): all of them.
        whole = ProducerRange(0, len(read[input_index]) - 1)
        return [dataclasses.replace(each, producers=whole) for each in slices]

    # Broadcast, not part of the task closure: every reduce task would otherwise carry (and
    # unpickle) the deployments of all reducers.
    return driver.link.share(
        tuple(consumer_deployments(groups, "reduce", driver.descriptors, descriptors_of, reads))
    )


_REDUCER_COLUMNS: Final = ["reducer", "result_id", "map_index", "producer"]
# The row of a reducer that names no map output: no column null or empty, for PySpark cannot
# read an LZ4-compressed batch (spark.sql.execution.arrow.compression.codec) with an empty
# buffer, as a column of nulls has.
_NO_MAP_INDEX: Final = -1
_NO_OUTPUT: Final = (
    "'-' as result_id",
    f"cast({_NO_MAP_INDEX} as long) as map_index",
    "cast('-' as binary) as producer",
)


def _reduce_partition(spec: ReduceStageSpec, output_schema: pa.Schema) -> Produce:
    """A reduce task: its partition's rows name its reducer and the map outputs Spark reran
    (see ``_reducer_rows``); it yields its reducer's output, as ``output_schema``."""

    def reduce_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task_starts()
        reducers: set[int] = set()
        reruns: dict[tuple[str, int], bytes] = {}
        for batch in batches:
            for reducer, result_id, map_index, producer in zip(
                *batch.select(_REDUCER_COLUMNS).to_pydict().values(), strict=True
            ):
                reducers.add(reducer)
                if map_index != _NO_MAP_INDEX:
                    reruns[result_id, map_index] = producer
        # By its rows, not the task's partition id: a user's plan may run this partition in a
        # task of another number (a union, a cartesian product with another result).
        if len(reducers) != 1:
            raise StageFailedError(f"a reduce task's rows name reducers {sorted(reducers)}")
        # The declared types (an operation's function may return int32 for a long, say), so
        # that Spark, a fused stage and a sink all get the same.
        for batch in run_reduce_task(spec, reducers.pop(), reruns):
            yield conform(batch, output_schema)

    return reduce_partition


def _reducer_rows(spark: SparkSession, exchanges: Sequence[Exchange], count: int) -> DataFrame:
    """The reduce stage's tasks: partition ``i`` is reducer ``i``, its rows (``reducer`` is
    ``i``) one with no map output and one for each map output of its inputs that Spark reran
    inside the action (none, mostly).

    Made in the JVM, so a reduce task costs what a ``mapInArrow`` task over Spark's cheapest
    source does. Where map outputs live on executors, each task reads Spark's shuffle of the
    map tasks' rows (see ``Exchange.held_map_outputs``): a lost executor makes Spark rerun its
    map tasks inside the action, and the rows of attempts the driver does not know (reruns)
    reach every reducer; the rest are dropped in the JVM."""
    reducers = spark.range(0, count, 1, max(count, 1)).withColumnRenamed("id", "reducer")
    held = [frame for exchange in exchanges if (frame := exchange.held_map_outputs())]
    if not held:
        return reducers.selectExpr("reducer", *_NO_OUTPUT)
    known = spark.createDataFrame(
        [
            (exchange.result_id, map_index, attempt)
            for exchange in exchanges
            for map_index, attempt in exchange.known_attempts()
        ],
        "result_id string, map_index long, attempt string",
    )
    rows = functools.reduce(DataFrame.unionByName, held).coalesce(1)
    reruns = rows.join(F.broadcast(known), ["result_id", "map_index", "attempt"], "left_anti")
    # With a row of no map output, so that every reducer has a row that names it.
    outputs = reruns.select("result_id", "map_index", "producer")
    outputs = outputs.unionByName(spark.range(0, 1, 1, 1).selectExpr(*_NO_OUTPUT)).coalesce(1)
    # A cartesian product, never a broadcast of either side: each reduce task must read the
    # shuffle itself, for Spark to rerun what it lost.
    return reducers.hint("shuffle_replicate_nl").crossJoin(outputs).select(*_REDUCER_COLUMNS)
