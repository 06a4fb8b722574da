"""The map and reduce stages that the operations of one ``SparkShuffle`` are made of: an
exchange written from a DataFrame, a source or an earlier result (fused), and a result read
from exchanges, each kept in the registry."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from pyspark_shuffle.driver.exchange import Exchange
from pyspark_shuffle.driver.fused import FusedInput, collect_arrow, sample_rows
from pyspark_shuffle.driver.inputs import FrameInput, MapInput, RowTasks
from pyspark_shuffle.driver.parquet import ParquetInput, ParquetSource
from pyspark_shuffle.driver.progress import JobLabel
from pyspark_shuffle.driver.reduce_stage import (
    DriverContext,
    plan_reducers,
    reads_every_map_output,
    reduce_stage,
)
from pyspark_shuffle.driver.registry import ResultRegistry
from pyspark_shuffle.driver.result_frames import as_result_frame
from pyspark_shuffle.driver.results import Result
from pyspark_shuffle.driver.schemas import arrow_schema, check_carried, check_keys, declared_schema
from pyspark_shuffle.kernels.operations import (
    BatchFunction,
    MapBatches,
    PassThrough,
    ReduceOperation,
)
from pyspark_shuffle.kernels.partitioners import HashPartitioner, Partitioner, WholePartitioner
from pyspark_shuffle.kernels.planning import map_task_count, one_reducer_per_map_task
from pyspark_shuffle.options import (
    KEEP_RESULTS,
    MAP_TARGET_SIZE,
    MAX_SUBPARTITIONS,
    RANGE_SAMPLE_SIZE,
)
from pyspark_shuffle.spark.internals import SparkShuffleOutputs, estimated_bytes
from scheduling.skew import ConsumerPlan
from shuffle_api import (
    Configuration,
    InvalidOperationError,
    RecordingJobContext,
    ShuffleMaster,
)

__all__ = ["Stages", "check_frame", "check_sides", "column_names"]

_LOG = logging.getLogger(__name__)


def column_names(columns: str | Sequence[str]) -> tuple[str, ...]:
    names = (columns,) if isinstance(columns, str) else tuple(columns)
    if not names:
        raise InvalidOperationError("a shuffle needs at least one key column")
    return names


def check_frame(frame: DataFrame, keys: Sequence[str], what: str) -> None:
    check_carried(frame.schema, what)
    check_keys(frame.schema, keys, what)


def check_sides(left: DataFrame, right: DataFrame, keys: Sequence[str], what: str) -> None:
    """Refuse, before any Spark job, two inputs to be shuffled alike by ``keys`` where a side
    lacks a key or has a type Spark cannot hand to Python, or where a key's types differ on
    the two sides (equal values would hash apart)."""
    for frame, side in ((left, "left"), (right, "right")):
        check_frame(frame, keys, f"{what} ({side} side)")
    for key in keys:
        left_type, right_type = left.schema[key].dataType, right.schema[key].dataType
        if left_type != right_type:
            raise InvalidOperationError(
                f"{what}: key {key!r} is {left_type.simpleString()} on the left but"
                f" {right_type.simpleString()} on the right; cast one side first"
            )


class Stages:
    """Map stages (exchanges) and reduce stages (results) of one ``SparkShuffle``: each
    operation reads its ``configuration`` once and hands it to them."""

    def __init__(
        self,
        driver: DriverContext,
        master: ShuffleMaster,
        job: RecordingJobContext,
        spark_outputs: SparkShuffleOutputs | None,
        registry: ResultRegistry[Result, ParquetSource],
        *,
        configuration: Callable[[], Configuration],
    ) -> None:
        """``configuration``: as an operation starting now reads it (a result's
        ``mapInArrow`` is one)."""
        self.driver = driver
        self.registry = registry
        self._configuration = configuration
        self._master = master
        self._job = job
        # Spark's map output tracker: classic sessions only (Connect has no Py4J).
        self._spark_outputs = spark_outputs

    def hash_partitioner(
        self, configuration: Configuration, keys: tuple[str, ...], num_partitions: int | None
    ) -> HashPartitioner:
        return HashPartitioner(keys, num_partitions or configuration.get(MAX_SUBPARTITIONS))

    def hash_exchange(
        self,
        configuration: Configuration,
        frame: DataFrame,
        keys: str | Sequence[str],
        num_partitions: int | None,
        what: str,
        *,
        pinned: bool = False,
    ) -> Exchange:
        names = column_names(keys)
        check_frame(frame, names, what)
        return self.exchange(
            configuration,
            self.map_input(configuration, frame),
            self.hash_partitioner(configuration, names, num_partitions),
            f"{what}{names}",
            automatic=num_partitions is None,
            pinned=pinned,
        )

    def exchange(
        self,
        configuration: Configuration,
        source: MapInput,
        partitioner: Partitioner,
        name: str,
        *,
        automatic: bool,
        pinned: bool = False,
    ) -> Exchange:
        """Write ``source``; a ``pinned`` exchange stays until released with a result that
        reads it, or closed."""
        self.registry.check_open()
        self.registry.release_unreachable()
        exchange = Exchange(
            self.driver.link,
            master=self._master,
            job=self._job,
            configuration=configuration,
            secret=self.driver.secret,
            spark_outputs=self._spark_outputs,
            map_input=source,
            partitioner=partitioner,
            name=name,
            automatic_reducers=automatic,
        )
        self.registry.writing(exchange)
        exchange.write()
        self.registry.written(exchange, pinned=pinned)
        return exchange

    def live_result(self, frame: DataFrame) -> Result | None:
        """The result of this object that ``frame`` is, untouched by Spark since; ``None`` for
        any other DataFrame, and for one the user cached (Spark's cache then holds its rows,
        and reading them beats rerunning the reduce)."""
        return None if frame.is_cached else self.registry.result(frame)

    def row_tasks(self, configuration: Configuration, frame: DataFrame) -> RowTasks:
        """The tasks that make ``frame``: when it is a result of this object, those that read
        its kept rows back, or its reduce tasks; else its own partitions."""
        result = self.live_result(frame)
        if result is None:
            return FrameInput(frame).row_tasks()
        return self._reading(result, configuration, keep=False).row_tasks

    def map_input(
        self, configuration: Configuration, frame: DataFrame, *, keep: bool = True
    ) -> MapInput:
        """What the map tasks read: when ``frame`` is a result or a source this object made
        and Spark did not change since, the result's tasks (fused; its kept rows, kept now
        unless ``keep`` is false) or the source's files; else the rows Spark hands over."""
        result = self.live_result(frame)
        if result is not None:
            read = self._reading(result, configuration, keep=keep)
            return FusedInput(read.row_tasks, frame.schema, read.exchanges, read.stage)
        source = None if frame.is_cached else self.registry.source(frame)
        if source is not None:
            schema = arrow_schema(self.driver.spark, frame.schema)
            return ParquetInput(self.driver.link, source, frame.schema, schema)
        return FrameInput(self._in_map_tasks(configuration, frame))

    def _in_map_tasks(self, configuration: Configuration, frame: DataFrame) -> DataFrame:
        """``frame``, its partitions coalesced into map tasks of about the target size (see
        ``map_task_count``): a Python task costs the JVM several milliseconds whatever it
        reads, so many small partitions cost more in tasks than in rows."""
        target = configuration.get(MAP_TARGET_SIZE)
        size = estimated_bytes(frame) if target else None
        if size is None:  # off, or no estimate: the partitions as they are
            return frame
        # A Spark Connect DataFrame does not say how many it has.
        partitions = None if self.driver.link.connect else int(frame.rdd.getNumPartitions())
        tasks = map_task_count(partitions, size, target, self.driver.link.default_parallelism())
        if tasks is None or (partitions is not None and tasks >= partitions):
            return frame
        _LOG.info(
            "%s partitions of about %d bytes in all are read by at most %d map tasks",
            "some" if partitions is None else partitions,
            size,
            tasks,
        )
        return frame.coalesce(tasks)

    def sample(
        self, configuration: Configuration, frame: DataFrame, keys: Sequence[str]
    ) -> pa.Table:
        """A uniform sample of the key columns: from the tasks of a result of this object
        (its rows kept first, so that the sort's map stage does not run its tasks again; no
        rows through the JVM), else taken in the JVM and collected as Arrow by Python tasks
        (not by Spark's ``toArrow``, which in PySpark 4.3 refuses a null struct with a
        non-null field)."""
        wanted = configuration.get(RANGE_SAMPLE_SIZE)
        result = self.live_result(frame)
        if result is not None:
            schema = arrow_schema(self.driver.spark, frame.schema)
            keys_schema = pa.schema([schema.field(key) for key in keys])
            return sample_rows(
                self._reading(result, configuration, keep=True).row_tasks, keys_schema, wanted
            )
        keys_only = frame.select(*keys)
        step = f"sample of {', '.join(keys)} for range bounds"
        with JobLabel(self.driver.spark, step):
            rows = keys_only.count()
        if rows > wanted:
            keys_only = keys_only.sample(fraction=min(1.0, 1.2 * wanted / rows), seed=rows)
        tasks = dataclasses.replace(FrameInput(keys_only).row_tasks(), description=step)
        return collect_arrow(tasks, arrow_schema(self.driver.spark, keys_only.schema))

    def _reading(self, result: Result, configuration: Configuration, *, keep: bool) -> Result:
        """What a later operation reads for ``result``: its kept rows (kept now, the first
        time, where ``keep`` and ``configuration`` say so and its tasks are worth keeping;
        first remade where some were lost), else its own tasks."""
        with result.keeping:
            kept = result.kept
            if (
                kept is None
                and keep
                and configuration.get(KEEP_RESULTS)
                and result.operation.worth_keeping()
            ):
                source = FusedInput(result.row_tasks, result.schema, result.exchanges, result.stage)
                name = f"kept-{result.stage}"
                exchange = self.exchange(
                    configuration, source, WholePartitioner(), name, automatic=False
                )
                kept = result.kept = self._kept_reader(configuration, result, exchange)
                _LOG.info("kept the rows of %s for later operations", result.row_tasks.description)
            elif kept is not None and kept[1].exchanges[0].recover():
                # The reader names the attempts that were lost: one that reads their reruns.
                exchange = kept[1].exchanges[0]
                kept = result.kept = self._kept_reader(configuration, result, exchange)
            return result if kept is None else kept[1]

    def _kept_reader(
        self, configuration: Configuration, result: Result, exchange: Exchange
    ) -> tuple[DataFrame, Result]:
        """The result that reads ``result``'s kept rows back: task ``i`` what its task ``i``
        wrote to ``exchange``."""
        plan = one_reducer_per_map_task(exchange.written_bytes())
        frame = self.reduce(configuration, [exchange], PassThrough(), result.schema, plan=plan)
        return frame, self.registry.known_result(frame)

    def reduce(
        self,
        configuration: Configuration,
        exchanges: Sequence[Exchange],
        operation: ReduceOperation,
        schema: StructType,
        *,
        plan: ConsumerPlan | None = None,
    ) -> DataFrame:
        for exchange in exchanges:
            exchange.recover()
        if plan is None:
            cores = self.driver.link.default_parallelism()
            plan = plan_reducers(configuration, exchanges, operation, cores)
        for index, exchange in enumerate(exchanges):
            if reads_every_map_output(plan, index, exchange.number_of_maps):
                exchange.merge(len(plan.tasks))
        frame, result = reduce_stage(
            self.driver, configuration, exchanges, operation, schema, plan=plan
        )
        frame = as_result_frame(frame, self.map_in_arrow)
        self.registry.remember(frame, result)
        return frame

    def map_in_arrow(
        self, frame: DataFrame, function: BatchFunction, schema: StructType | str
    ) -> DataFrame | None:
        """``frame.mapInArrow(function, schema)`` with ``function`` in the reduce tasks of the
        result ``frame`` is, where that result hands on its rows as they were shuffled (a
        repartition, a rebalance, a read), as ``repartition_map`` would: the same reducers,
        the same batches' types. ``None`` for any other DataFrame (Spark's own then)."""
        result = self.live_result(frame)
        if result is None or result.broadcast is not None:
            return None
        if not isinstance(result.operation, PassThrough):
            return None
        try:
            declared = declared_schema(schema, "mapInArrow")
        except InvalidOperationError:  # a type pyshuffle does not carry: Spark's, as asked
            return None
        operation = MapBatches(function, arrow_schema(self.driver.spark, result.schema))
        return self.reduce(
            self._configuration(), result.exchanges, operation, declared, plan=result.plan
        )
