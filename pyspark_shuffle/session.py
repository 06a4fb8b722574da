"""``SparkShuffle``: DataFrame operations whose exchange goes through a pyshuffle service."""

from __future__ import annotations

import atexit
import dataclasses
import functools
import inspect
import logging
import operator
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 (Spark's own spelling)
from pyspark.sql.types import StructType

from blob import BLOB_CACHE_MAX_SIZE, BLOB_OPTIONS, BlobStore, blob_store_url
from pyspark_shuffle.broadcast import BroadcastSide, broadcast_join, broadcast_side
from pyspark_shuffle.chain import Chain, ChainExchange, ChainStage
from pyspark_shuffle.exchange import Exchange
from pyspark_shuffle.inputs import FrameInput, MapInput, TaskOutput
from pyspark_shuffle.ipc import to_ipc_stream
from pyspark_shuffle.operations import (
    BatchFunction,
    GroupApply,
    GroupFunction,
    Join,
    MapBatches,
    PassThrough,
    ReduceOperation,
    SortWithin,
)
from pyspark_shuffle.options import (
    JOIN_BROADCAST_THRESHOLD,
    MAX_SUBPARTITIONS,
    PYSPARK_SHUFFLE_OPTIONS,
    RANGE_SAMPLE_SIZE,
    SPARK_CONF_PREFIX,
)
from pyspark_shuffle.outputs import (
    FusedInput,
    collect_arrow,
    sample_rows,
    write_parquet,
)
from pyspark_shuffle.parquet import ParquetFilter, ParquetInput, ParquetSink, ParquetSource
from pyspark_shuffle.partitioners import (
    HashPartitioner,
    Partitioner,
    RangePartitioner,
    choose_boundaries,
)
from pyspark_shuffle.planning import adaptive_plan, one_reducer, one_reducer_per_subpartition
from pyspark_shuffle.progress import JobLabel
from pyspark_shuffle.schemas import (
    arrow_schema,
    check_carried,
    check_keys,
    declared_schema,
    join_schema,
)
from pyspark_shuffle.sorting import sort_keys_of
from pyspark_shuffle.spark_link import Shared, SparkLink, Tally, spark_link, spark_settings
from pyspark_shuffle.spark_outputs import SparkShuffleOutputs
from pyspark_shuffle.tasks import (
    MapOutputs,
    ReadCounts,
    ReduceStageSpec,
    add_counts,
    merge_map_outputs,
    run_reduce_task,
)
from scheduling.deployment import (
    DescriptorCache,
    consumer_deployments,
    planned_reads,
)
from scheduling.graph import Stage, StageExchange, StageGraph
from scheduling.groups import ConsumedPartitionGroup, build_groups
from scheduling.options import DESCRIPTOR_OFFLOAD_THRESHOLD
from scheduling.skew import ConsumerPlan
from shuffle_api import (
    ConfigError,
    Configuration,
    InvalidOperationError,
    RecordingJobContext,
    ShuffleDescriptor,
    ShuffleError,
    ShuffleMasterContext,
    ShuffleServiceClosedError,
    load_shuffle_service_factory,
    new_id,
)
from shuffle_api.batches import conform
from shuffle_api.options import CORE_OPTIONS, SHUFFLE_SERVICE_FACTORY_CLASS

__all__ = ["ShuffleStatistics", "SparkShuffle", "spark_configuration"]

_LOG = logging.getLogger(__name__)


def _spark_conf(spark: SparkSession) -> dict[str, str]:
    """The ``spark.pyshuffle.*`` settings, prefix removed (see ``spark_settings``)."""
    return {
        key.removeprefix(SPARK_CONF_PREFIX): value
        for key, value in spark_settings(spark).items()
        if key.startswith(SPARK_CONF_PREFIX)
    }


def spark_configuration(
    spark: SparkSession,
    overrides: Mapping[str, object] | None = None,
    *,
    config_file: str | Path | None = None,
) -> Configuration:
    """pyshuffle's configuration: defaults < ``config_file`` < ``PYSHUFFLE_*`` variables <
    ``spark.pyshuffle.<key>`` Spark conf (the context's, then the session's) < ``overrides``."""
    configuration = Configuration.load(toml_file=config_file)
    for key, value in _spark_conf(spark).items():
        configuration = configuration.with_values(
            {key: value}, source=f"Spark conf {SPARK_CONF_PREFIX}{key}"
        )
    return configuration.with_values(overrides or {})


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
    spark_shuffle_bytes: int | None = None
    """Bytes of Spark's own shuffle that this result's exchanges keep, so that Spark reruns
    map tasks lost with an executor: one small row per map task, read by every reducer (0
    where the service's partitions outlive executors; ``None`` where Spark cannot say)."""


def _new_stage() -> str:
    return f"reduce-{new_id()[:16]}"


@dataclass
class _Result:
    exchanges: list[Exchange]
    operation: ReduceOperation
    schema: StructType
    plan: ConsumerPlan
    consumed_groups: list[ConsumedPartitionGroup]
    read: Tally[ReadCounts]
    """Rows and bytes its reducers read."""
    reruns_read: Tally[MapOutputs] | None
    """Map outputs Spark reran inside an action (where Spark holds a shuffle of them)."""
    broadcasts: tuple[Shared[Any], ...]
    """What the executors keep to read it: the reducers' deployments, a broadcast side."""
    output: TaskOutput
    """The reduce tasks: their rows, and what each runs on them."""
    broadcast: BroadcastSide | None = None
    """A broadcast join's: ``exchanges`` are then those its tasks read through a fused input."""
    stage: str = dataclasses.field(default_factory=_new_stage)
    """Its reduce stage's name in the :class:`~pyspark_shuffle.chain.Chain`."""
    wraps: str | None = None
    """A broadcast join over a fused result: that result's stage, whose tasks its tasks run."""
    tasks_run: Tally[frozenset[int]] | None = None
    """A broadcast join whose tasks Spark could not count before they ran: those that ran."""


def _column_names(columns: str | Sequence[str]) -> tuple[str, ...]:
    names = (columns,) if isinstance(columns, str) else tuple(columns)
    if not names:
        raise InvalidOperationError("a shuffle needs at least one key column")
    return names


def _check_frame(frame: DataFrame, keys: Sequence[str], what: str) -> None:
    check_carried(frame.schema, what)
    check_keys(frame.schema, keys, what)


def _adopt_reruns(result: _Result) -> None:
    """Register the map outputs Spark reran while ``result`` was read (so they are released
    with the rest and counted as reruns)."""
    if result.reruns_read is None:
        return
    by_id = {exchange.result_id: exchange for exchange in result.exchanges}
    for result_id, map_index, producer in sorted(result.reruns_read.value):
        try:
            by_id[result_id].adopt(map_index, producer)
        except ShuffleError as error:  # the rest still go; its executor's end removes it
            _LOG.warning("map output %d of %s not registered: %s", map_index, result_id, error)


def _sum_known(values: Iterable[int | None]) -> int | None:
    """The sum, or ``None`` if any is unknown."""
    total = 0
    for value in values:
        if value is None:
            return None
        total += value
    return total


def _upstream_of(result: _Result) -> list[Exchange]:
    """Every exchange the fused stages behind ``result`` read, transitively."""
    found: dict[int, Exchange] = {}
    stack = [upstream for exchange in result.exchanges for upstream in exchange.upstream]
    while stack:
        exchange = stack.pop()
        if id(exchange) not in found:
            found[id(exchange)] = exchange
            stack.extend(exchange.upstream)
    return list(found.values())


class SparkShuffle:
    """Shuffles of Spark DataFrames through the service named by ``shuffle-service-factory.class``.

    One per Spark application (driver side). Results are Spark DataFrames read from the
    shuffle's partitions; their data stays until :meth:`release` or :meth:`close` (also at
    interpreter exit). Use as a context manager.
    """

    def __init__(
        self,
        spark: SparkSession,
        config: Mapping[str, object] | None = None,
        *,
        config_file: str | Path | None = None,
    ) -> None:
        self._spark = spark
        self._overrides = dict(config or {})
        self._config_file = config_file
        self._started_with = spark_configuration(spark, config, config_file=config_file)
        factory = load_shuffle_service_factory(
            self._started_with, extra_options=PYSPARK_SHUFFLE_OPTIONS
        )
        self._options = (*CORE_OPTIONS, *factory.config_options(), *PYSPARK_SHUFFLE_OPTIONS)
        # What an operation may set anew: keys read by this operation's planning and tasks.
        # The others configure the running master, descriptor cache or blob store.
        fixed = {SHUFFLE_SERVICE_FACTORY_CLASS.key, *(option.key for option in BLOB_OPTIONS)}
        self._per_operation = {
            option.key
            for option in (*CORE_OPTIONS, *PYSPARK_SHUFFLE_OPTIONS)
            if option.key not in fixed
        } | {option.key for option in factory.config_options() if option.host_local}
        master_context = ShuffleMasterContext(self._started_with)
        # The application's secret: shipped with the tasks, never in descriptors.
        self._secret = master_context.secret
        # Before the master starts: a session this cannot work with is refused with nothing
        # left running.
        self._link: SparkLink = spark_link(
            spark,
            blob_url=blob_store_url(self._started_with),
            blob_cache_bytes=self._started_with.get(BLOB_CACHE_MAX_SIZE),
            secret=self._secret,
        )
        self._master = factory.create_shuffle_master(master_context)
        self._descriptors = DescriptorCache(
            blob_store=BlobStore(blob_store_url(self._started_with)),
            offload_threshold=self._started_with.get(DESCRIPTOR_OFFLOAD_THRESHOLD),
        )
        self._master.start()
        self._job = RecordingJobContext(f"spark-{new_id()[:16]}")
        self._master.register_job(self._job)
        self._results: dict[int, tuple[weakref.ref[DataFrame], _Result]] = {}
        self._sources: dict[int, tuple[weakref.ref[DataFrame], ParquetSource]] = {}
        self._exchanges: dict[str, Exchange] = {}
        # Released exchanges whose map tasks Spark may still run (theirs are on executors):
        # what such a run writes is deleted after each operation.
        self._released: dict[str, Exchange] = {}
        self._chain = Chain()
        # Spark's map output tracker: classic sessions only (Connect has no Py4J).
        self._spark_outputs = None if self._link.connect else SparkShuffleOutputs(spark)
        # Results the user dropped whose reduce tasks a rerun may still run, by stage: they
        # keep what those tasks read (descriptor lists, the deployments' broadcast).
        self._dropped: dict[str, _Result] = {}
        self._lock = threading.Lock()
        self._closed = False
        atexit.register(self.close)

    @property
    def configuration(self) -> Configuration:
        """The configuration as an operation starting now reads it: ``spark.conf.set`` of a
        ``spark.pyshuffle.*`` key between operations takes effect (below the mapping given
        here). A key that configures the running service may not change:
        :class:`ConfigError` names it."""
        now = spark_configuration(self._spark, self._overrides, config_file=self._config_file)
        now.validate(self._options)
        for key in sorted(set(now.values) | set(self._started_with.values)):
            was, is_now = self._started_with.values.get(key), now.values.get(key)
            if key not in self._per_operation and was != is_now:
                raise ConfigError(
                    f"config key {key!r} was {was!r} when this SparkShuffle started and is now"
                    f" {is_now!r} (from {now.sources.get(key, 'its default')}): it configures"
                    " the running shuffle service, so set it before SparkShuffle starts"
                )
        return now

    # -- sources and sinks ----------------------------------------------------------------

    def read_parquet(
        self,
        path: str | Sequence[str],
        *,
        columns: Sequence[str] | None = None,
        filter: ParquetFilter | None = None,
    ) -> DataFrame:
        """Parquet files (a directory, Hive-style ``key=value`` subdirectories as columns, or
        files; any fsspec URL Spark can read too) as a DataFrame. Consumed by an operation of
        this object, it is read by pyarrow in the map tasks (``columns`` only, row groups
        pruned by ``filter``, pyarrow's ``filters`` form), so its rows never cross the JVM;
        used by Spark otherwise, it is ``spark.read.parquet(path)`` filtered and selected."""
        source = ParquetSource.of(path, columns, filter)
        frame = source.frame(self._spark)
        with self._lock:
            self._sources = {k: v for k, v in self._sources.items() if v[0]() is not None}
            self._sources[id(frame)] = (weakref.ref(frame), source)
        return frame

    def write_parquet(
        self,
        frame: DataFrame,
        path: str,
        *,
        partition_by: str | Sequence[str] = (),
        mode: str = "error",
        compression: str = "snappy",
    ) -> int:
        """``frame.write.mode(mode).partitionBy(...).parquet(path)``, written by pyarrow: by
        the reduce tasks themselves for a result of this object (its rows never cross the
        JVM), else by tasks over ``frame``'s partitions. ``path``: any fsspec URL that every
        executor and the driver reach. Each task attempt stages its files apart; the driver
        commits the one attempt Spark reports per task, so a retried or speculative task never
        leaves a duplicate, then writes ``_SUCCESS``. Returns the number of files written."""
        names = (partition_by,) if isinstance(partition_by, str) else tuple(partition_by)
        check_carried(frame.schema, "write_parquet")
        sink = ParquetSink(
            path,
            names,
            new_id()[:16],
            arrow_schema(self._spark, frame.schema),
            frame.schema,
            compression,
        )
        return write_parquet(self._task_output(frame), sink, mode)

    def to_arrow(self, frame: DataFrame) -> pa.Table:
        """``frame`` as a ``pyarrow.Table`` in the driver, in its order: a result of this
        object straight from its reduce tasks as Arrow IPC (the JVM sees opaque chunks, not
        rows)."""
        check_carried(frame.schema, "to_arrow")
        schema = arrow_schema(self._spark, frame.schema, timezone="UTC")  # as toArrow's
        return collect_arrow(self._task_output(frame), schema)

    # -- operations ---------------------------------------------------------------------

    def repartition(
        self, frame: DataFrame, keys: str | Sequence[str], *, num_partitions: int | None = None
    ) -> DataFrame:
        """Rows with equal keys in the same partition (by hash); ``num_partitions`` fixed, or
        automatic from the bytes the map stage wrote."""
        exchange = self._hash_exchange(frame, _column_names(keys), num_partitions, "repartition")
        return self.read(exchange)

    def repartition_map(
        self,
        frame: DataFrame,
        keys: str | Sequence[str],
        function: BatchFunction,
        schema: StructType | str,
        *,
        num_partitions: int | None = None,
    ) -> DataFrame:
        """``repartition(frame, keys).mapInArrow(function, schema)`` with ``function`` run in
        the reduce tasks themselves: the shuffled batches go straight from the input gate to
        it, never back to the JVM and out again."""
        declared = declared_schema(schema, "repartition_map")
        exchange = self._hash_exchange(frame, _column_names(keys), num_partitions, "repartition")
        return self._reduce([exchange], MapBatches(function), declared)

    def rebalance(
        self, frame: DataFrame, keys: str | Sequence[str], *, num_partitions: int | None = None
    ) -> DataFrame:
        """Spark's ``REBALANCE`` hint: rows hash-partitioned by ``keys`` into partitions of
        about ``pyspark-shuffle.reducer.target-size`` bytes; with ``num_partitions`` automatic,
        a skewed key's rows are split among several partitions (so, unlike
        :meth:`repartition`, equal keys may land in different partitions)."""
        exchange = self._hash_exchange(frame, _column_names(keys), num_partitions, "rebalance")
        return self._reduce([exchange], PassThrough(rebalance=True), exchange.frame_schema)

    def hash_exchange(
        self, frame: DataFrame, keys: str | Sequence[str], *, num_partitions: int | None = None
    ) -> Exchange:
        """The map stage of :meth:`repartition` alone: ``frame`` written, partitioned by the
        hash of ``keys``; :meth:`read` is the reduce stage. It stays until :meth:`close`
        (or :meth:`release` of a result that reads it), whatever results of it are dropped."""
        exchange = self._hash_exchange(
            frame, _column_names(keys), num_partitions, "repartition", pinned=True
        )
        return exchange

    def read(self, exchange: Exchange) -> DataFrame:
        """The reduce stage: a DataFrame of the exchange's rows, partitioned as written (first
        rerunning the producers of any partition the service lost)."""
        return self._reduce([exchange], PassThrough(), exchange.frame_schema)

    def recover(self, result: DataFrame) -> DataFrame:
        """``result`` again, after rerunning the producers of partitions lost since it was made
        (an action on it failed with :class:`PartitionNotFoundError`). ``result`` itself keeps
        naming the lost attempts; run the action on the returned DataFrame."""
        found = self._result(result)
        if found.broadcast is None:
            return self._reduce(found.exchanges, found.operation, found.schema)
        # A broadcast join: the broadcast side lives in Spark's broadcast; only what its
        # tasks read through a fused input can have been lost.
        for exchange in found.exchanges:
            exchange.recover()
        again = found.output.tasks.mapInArrow(found.output.produce, found.schema)
        self._remember(again, dataclasses.replace(found, stage=_new_stage()))
        return again

    def group_apply(
        self,
        frame: DataFrame,
        keys: str | Sequence[str],
        function: GroupFunction,
        schema: StructType | str,
        *,
        num_partitions: int | None = None,
    ) -> DataFrame:
        """``function(table)`` or ``function(key, table)`` per key group, as Spark's
        ``groupBy(keys).applyInArrow(function, schema)``."""
        names = _column_names(keys)
        pass_key = len(inspect.signature(function).parameters) == 2
        declared = declared_schema(schema, "group_apply")
        exchange = self._hash_exchange(frame, names, num_partitions, "group_apply")
        return self._reduce([exchange], GroupApply(names, function, pass_key=pass_key), declared)

    def group_apply_sorted(
        self,
        frame: DataFrame,
        keys: str | Sequence[str],
        function: GroupFunction,
        schema: StructType | str,
        *,
        num_partitions: int | None = None,
    ) -> DataFrame:
        """``function(table)`` once per reducer, on all of its rows sorted by ``keys`` (every
        group whole, in one table): for per-group work vectorized across groups."""
        names = _column_names(keys)
        declared = declared_schema(schema, "group_apply_sorted")
        exchange = self._hash_exchange(frame, names, num_partitions, "group_apply_sorted")
        operation = GroupApply(names, function, whole_partition=True)
        return self._reduce([exchange], operation, declared)

    def sort(
        self,
        frame: DataFrame,
        keys: str | Sequence[str],
        *,
        ascending: bool | Sequence[bool] = True,
        num_partitions: int | None = None,
    ) -> DataFrame:
        """Globally ordered as Spark's ``orderBy`` (nulls first ascending, last descending):
        range partitioning from a sample of the keys, then a sort within each reducer."""
        names = _column_names(keys)
        _check_frame(frame, names, "sort")
        sort_keys = sort_keys_of(names, ascending)
        subpartitions = num_partitions or self.configuration.get(MAX_SUBPARTITIONS)
        partitioner = RangePartitioner(
            sort_keys,
            choose_boundaries(self._sample(frame, names), sort_keys, subpartitions),
            subpartitions,
        )
        exchange = self._exchange(
            self._map_input(frame), partitioner, f"sort{names}", automatic=num_partitions is None
        )
        return self._reduce([exchange], SortWithin(sort_keys), frame.schema)

    def join(
        self,
        left: DataFrame,
        right: DataFrame,
        on: str | Sequence[str],
        how: str = "inner",
        *,
        num_partitions: int | None = None,
        broadcast: str = "auto",
    ) -> DataFrame:
        """Spark's ``left.join(right, on=keys, how=how)`` for ``how`` in inner, left, right,
        full, semi, anti, joined in Arrow: both sides hash-partitioned alike and joined per
        reducer, or one side broadcast - read whole by every task of the other side, which is
        then not shuffled at all.

        ``broadcast``: ``"auto"`` broadcasts the side Spark may broadcast for ``how`` (the
        right for inner, left, semi and anti; the left for right) when its map stage wrote at
        most ``pyspark-shuffle.join.broadcast-threshold`` bytes, else shuffles both (reusing
        what that side wrote); ``"left"`` or ``"right"`` broadcast that side whatever its size,
        where ``how`` allows it; ``"none"`` always shuffles both."""
        names = _column_names(on)
        operation = Join(names, how)  # refuses an unknown join type before any Spark job
        _check_frame(left, names, "join (left side)")
        _check_frame(right, names, "join (right side)")
        for key in names:
            left_type, right_type = left.schema[key].dataType, right.schema[key].dataType
            if left_type != right_type:
                raise InvalidOperationError(
                    f"join key {key!r} is {left_type.simpleString()} on the left but"
                    f" {right_type.simpleString()} on the right; cast one side first"
                )
        # Before any Spark job: it refuses columns on both sides.
        schema = join_schema(left.schema, right.schema, names, how)
        threshold = self.configuration.get(JOIN_BROADCAST_THRESHOLD)
        side = broadcast_side(how, broadcast, threshold)
        partitioner = self._hash(names, num_partitions)
        automatic = num_partitions is None
        frames = {"left": left, "right": right}
        written: dict[str, Exchange] = {}
        if side is not None:
            other = "left" if side == "right" else "right"
            forced = broadcast == side
            source = self._map_input(frames[side])  # built once: a Parquet one lists its files
            small = self._small_parquet_side(source, side, None if forced else threshold)
            if small is not None:
                return self._broadcast_join(small, frames[other], operation, schema)
            written[side] = self._exchange(
                source, partitioner, f"join-{side}{names}", automatic=automatic
            )
            if forced or sum(written[side].bytes_per_subpartition) <= threshold:
                small = self._collect_broadcast_side(written[side], side)
                return self._broadcast_join(small, frames[other], operation, schema)
        exchanges = [
            written.get(name)
            or self._exchange(
                self._map_input(frames[name]),
                partitioner,
                f"join-{name}{names}",
                automatic=automatic,
            )
            for name in ("left", "right")
        ]
        return self._reduce(exchanges, operation, schema)

    def _small_parquet_side(
        self, source: MapInput, side: str, threshold: int | None
    ) -> tuple[pa.Table, BroadcastSide] | None:
        """A side that is a Parquet source of this object, read whole in the driver when
        Parquet's own sizes (then the table's) are within ``threshold`` (None: forced): no
        Spark job for it at all. None for any other side, or a larger one."""
        if not isinstance(source, ParquetInput):
            return None
        if threshold is not None and source.uncompressed_bytes > threshold:
            return None
        started = time.perf_counter()
        table = source.read_table()
        if threshold is not None and table.nbytes > threshold:
            _LOG.info("a Parquet join side decoded to %d bytes: shuffled instead", table.nbytes)
            return None
        seconds = time.perf_counter() - started
        return table, BroadcastSide(side, 0, seconds, table.num_rows, table.nbytes, 0)

    def _collect_broadcast_side(self, small: Exchange, side: str) -> tuple[pa.Table, BroadcastSide]:
        """What ``small`` wrote, read by one reducer into the driver; ``small`` is released
        once read."""
        reader = self._reduce(
            [small], PassThrough(), small.frame_schema, plan=one_reducer([small.bytes_matrix()])
        )
        table = collect_arrow(
            self._result(reader).output, arrow_schema(self._spark, small.frame_schema)
        )
        rows, size = sum(small.rows_per_subpartition), sum(small.bytes_per_subpartition)
        self.release(reader)
        return table, BroadcastSide(side, small.number_of_maps, small.runs.seconds, rows, size, 0)

    def _broadcast_join(
        self,
        small: tuple[pa.Table, BroadcastSide],
        streamed_frame: DataFrame,
        operation: Join,
        schema: StructType,
    ) -> DataFrame:
        """Join ``streamed_frame`` task by task with the whole ``small`` side, shared with
        Spark's broadcast (as Spark's own broadcast joins are)."""
        table, written = small
        shared = self._link.share(to_ipc_stream(table))
        streamed = self._map_input(streamed_frame)
        # Counted as they run where Spark cannot say before (a DataFrame under Spark Connect).
        tasks_run = None
        if streamed.number_of_maps is None:
            tasks_run = self._link.tally(frozenset[int](), operator.or_)
        output = broadcast_join(
            dataclasses.replace(streamed.task_output(), number_of_tasks=streamed.number_of_maps),
            arrow_schema(self._spark, streamed.schema),
            table,
            side=written.side,
            shared=shared,
            operation=operation,
            output_schema=arrow_schema(self._spark, schema),
            tasks_run=tasks_run,
        )
        result = output.tasks.mapInArrow(output.produce, schema)
        figures = dataclasses.replace(written, joining_tasks=streamed.number_of_maps or 0)
        self._remember(
            result,
            _Result(
                list(streamed.upstream),
                operation,
                schema,
                ConsumerPlan((), (), ()),
                [],
                self._link.tally((0, 0), add_counts),
                None,
                (shared,),
                output,
                figures,
                wraps=streamed.producer_stage,
                tasks_run=tasks_run,
            ),
        )
        return result

    def _remember(self, frame: DataFrame, result: _Result) -> None:
        """Keep what reads ``frame``, a result of this object, while the user holds it."""
        stage = ChainStage(
            result.stage,
            result.output.number_of_tasks or 1,
            tuple(exchange.result_id for exchange in result.exchanges),
            result.wraps,
        )
        with self._lock:
            self._chain.add_stage(stage)
            self._results[id(frame)] = (weakref.ref(frame), result)

    # -- lifecycle ------------------------------------------------------------------------

    def exchanges(self, result: DataFrame) -> list[Exchange]:
        """The shuffles behind a DataFrame this object returned."""
        return list(self._result(result).exchanges)

    def statistics(self, result: DataFrame) -> ShuffleStatistics:
        found = self._result(result)
        self._release_unreachable()
        _adopt_reruns(found)
        if found.broadcast is not None:
            side = found.broadcast
            runs = found.tasks_run
            joining = side.joining_tasks if runs is None else len(runs.value)
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
                fused_inputs=int(bool(found.exchanges)),
                upstream_released=sum(
                    1 for exchange in (*found.exchanges, *_upstream_of(found)) if exchange.released
                ),
                broadcast_side=side.side,
            )
        read = found.read.value  # once: both figures from one listing
        return ShuffleStatistics(
            map_tasks=sum(exchange.number_of_maps for exchange in found.exchanges),
            map_seconds=sum(exchange.runs.seconds for exchange in found.exchanges),
            reducers=len(found.plan.tasks),
            rows_written=sum(sum(exchange.rows_per_subpartition) for exchange in found.exchanges),
            bytes_written=sum(sum(exchange.bytes_per_subpartition) for exchange in found.exchanges),
            rows_read=read[0],
            bytes_read=read[1],
            map_tasks_rerun=sum(
                runs - 1 for exchange in found.exchanges for runs in exchange.runs.per_map.values()
            ),
            bytes_per_reducer=tuple(task.bytes for task in found.plan.tasks),
            skewed_subpartitions=found.plan.skewed,
            unsplittable_subpartitions=found.plan.unsplittable,
            fused_inputs=sum(1 for exchange in found.exchanges if exchange.upstream),
            upstream_released=sum(1 for exchange in _upstream_of(found) if exchange.released),
            spark_shuffle_bytes=_sum_known(
                exchange.spark_shuffle_bytes() for exchange in found.exchanges
            ),
        )

    def release(self, result: DataFrame) -> None:
        """Delete the shuffle data behind ``result``; reading it again then fails (unless a
        later stage's rerun may need it: see ``docs/pyspark.md``). Data that another live
        result reads too (one made by :meth:`recover`, or a second :meth:`read` of the same
        exchange) stays until that one is released as well."""
        with self._lock:
            entry = self._results.pop(id(result), None)
            if entry is None:
                return
            self._chain.drop(entry[1].stage)
            self._dropped[entry[1].stage] = entry[1]
            still_read = self._chain.read_by_live()
            asked = [
                self._exchanges[exchange.result_id]
                for exchange in entry[1].exchanges
                if exchange.result_id in self._exchanges and exchange.result_id not in still_read
            ]
        self._release(asked)
        self._release_unreachable()

    def _forget(self, result: _Result) -> None:
        """Drop what the driver and executors keep to read ``result``."""
        _adopt_reruns(result)
        # Unpersisted, not destroyed: the executors' copies go now, and the driver's when
        # Spark's cleaner sees the result gone. Reading a released result again still reaches
        # the reduce tasks, which name the partitions they no longer find.
        if self._spark_running():
            for shared in result.broadcasts:
                shared.unpersist()
        for group in result.consumed_groups:
            self._descriptors.invalidate(group)

    def _release(self, exchanges: Sequence[Exchange]) -> None:
        """Release ``exchanges``; Spark forgets those a rerun may read, so that it remakes
        them (a released result read again fails instead of remaking its exchange). One
        Spark could not be told about stays, and is tried again at the next operation."""
        with self._lock:
            rerun_inputs = self._chain.rerun_inputs()
        for exchange in exchanges:
            if not exchange.release(forget_in_spark=exchange.result_id in rerun_inputs):
                _LOG.warning("%s stays: Spark could not be told it is gone", exchange.name)
                continue
            with self._lock:
                self._exchanges.pop(exchange.result_id, None)
                self._chain.released(exchange.result_id)
                if exchange.held_map_outputs() is not None:
                    self._released[exchange.result_id] = exchange

    def _release_unreachable(self) -> None:
        """Release the exchanges whose every consumer has finished (see
        :mod:`pyspark_shuffle.chain`): no live result reads them, as the user dropped every
        result that does (they were garbage collected). So a chain's store holds its widest
        step, not every step. An exchange on the executors that a later stage's rerun may read
        goes too where Spark can be told to remake it (else it stays); the dropped results
        such a rerun runs keep what their tasks read until no rerun can need them."""
        with self._lock:
            dead = [key for key, (frame, _) in self._results.items() if frame() is None]
            for key in dead:
                result = self._results.pop(key)[1]
                self._chain.drop(result.stage)
                self._dropped[result.stage] = result
            unreachable = [
                self._exchanges[result_id]
                for result_id in self._chain.releasable(
                    recomputable=self._spark_outputs is not None and self._spark_outputs.available
                )
                if result_id in self._exchanges
            ]
        for exchange in unreachable:
            _LOG.info("released %s: no live result reads it", exchange.name)
        self._release(unreachable)
        with self._lock:
            rerunnable = self._chain.rerunnable()
            done = [self._dropped.pop(stage) for stage in set(self._dropped) - rerunnable]
            waiting = list(self._dropped.values())
            self._chain.prune()
        for result in done:
            self._forget(result)
        for result in waiting:
            _adopt_reruns(result)
        with self._lock:
            released = list(self._released.values())
        for exchange in released:
            exchange.release_copies()

    def close(self) -> None:
        """Release every shuffle this object made and stop its master. Results it made can no
        longer be read."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            exchanges = [*self._exchanges.values(), *self._released.values()]
            self._exchanges, self._released = {}, {}
            results = [result for _, result in self._results.values()]
            results += self._dropped.values()
            self._results.clear()
            self._dropped.clear()
        self._descriptors.clear()
        for result in results:
            _adopt_reruns(result)
        for exchange in exchanges:
            exchange.release()
        self._master.unregister_job(self._job.job_id)
        self._master.close()
        atexit.unregister(self.close)
        # Last: the data is gone already whatever Spark answers here.
        if self._spark_running():
            # Once each: a recovered broadcast join shares its broadcast side.
            shared = {id(each): each for result in results for each in result.broadcasts}
            for each in shared.values():
                each.destroy()
        self._link.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # -- internals ------------------------------------------------------------------------

    def _result(self, frame: DataFrame) -> _Result:
        with self._lock:
            entry = self._results.get(id(frame))
        if entry is None or entry[0]() is not frame:
            raise InvalidOperationError(
                "this DataFrame was not made by this SparkShuffle, or it was released"
            )
        return entry[1]

    def _spark_running(self) -> bool:
        """False once the SparkContext is stopped (say, ``close`` at interpreter exit after
        ``spark.stop()``): its broadcasts went with it."""
        return self._link.running()

    def _hash(self, keys: tuple[str, ...], num_partitions: int | None) -> HashPartitioner:
        return HashPartitioner(keys, num_partitions or self.configuration.get(MAX_SUBPARTITIONS))

    def _hash_exchange(
        self,
        frame: DataFrame,
        keys: tuple[str, ...],
        num_partitions: int | None,
        what: str,
        *,
        pinned: bool = False,
    ) -> Exchange:
        _check_frame(frame, keys, what)
        return self._exchange(
            self._map_input(frame),
            self._hash(keys, num_partitions),
            f"{what}{keys}",
            automatic=num_partitions is None,
            pinned=pinned,
        )

    def _exchange(
        self,
        source: MapInput,
        partitioner: Partitioner,
        name: str,
        *,
        automatic: bool,
        pinned: bool = False,
    ) -> Exchange:
        """Write ``source``; a ``pinned`` exchange stays until released with a result that
        reads it, or closed."""
        if self._closed:
            raise ShuffleServiceClosedError("this SparkShuffle is closed")
        self._release_unreachable()
        exchange = Exchange(
            self._link,
            master=self._master,
            job=self._job,
            configuration=self.configuration,
            secret=self._secret,
            spark_outputs=self._spark_outputs,
            map_input=source,
            partitioner=partitioner,
            name=name,
            automatic_reducers=automatic,
        )
        with self._lock:
            self._exchanges[exchange.result_id] = exchange
        exchange.write()
        written = ChainExchange(
            exchange.result_id,
            exchange.producer_stage or f"map-{exchange.result_id}",
            exchange.number_of_maps,
            on_executors=exchange.held_map_outputs() is not None,
        )
        with self._lock:
            self._chain.add_exchange(written, pinned=pinned)
        return exchange

    def _live_result(self, frame: DataFrame) -> _Result | None:
        """The result of this object that ``frame`` is, untouched by Spark since; ``None`` for
        any other DataFrame, and for one the user cached (Spark's cache then holds its rows,
        and reading them beats rerunning the reduce)."""
        with self._lock:
            entry = self._results.get(id(frame))
        if entry is None or entry[0]() is not frame or frame.is_cached:
            return None
        return entry[1]

    def _task_output(self, frame: DataFrame) -> TaskOutput:
        """The tasks that make ``frame``: its reduce tasks when it is a result of this object,
        else its own partitions."""
        result = self._live_result(frame)
        if result is not None:
            return result.output
        return FrameInput(frame).task_output()

    def _map_input(self, frame: DataFrame) -> MapInput:
        """What the map tasks read: when ``frame`` is a result or a source this object made
        and Spark did not change since, its reduce tasks (fused) or the source's files; else
        the rows Spark hands over."""
        result = self._live_result(frame)
        if result is not None:
            return FusedInput(result.output, frame.schema, result.exchanges, result.stage)
        with self._lock:
            entry = self._sources.get(id(frame))
        if entry is not None and entry[0]() is frame and not frame.is_cached:
            return ParquetInput(
                self._link, entry[1], frame.schema, arrow_schema(self._spark, frame.schema)
            )
        return FrameInput(frame)

    def _sample(self, frame: DataFrame, keys: Sequence[str]) -> pa.Table:
        """A uniform sample of the key columns: from the reduce tasks of a result of this
        object (fused: no rows through the JVM), else taken in the JVM and collected as
        Arrow by Python tasks (not by Spark's ``toArrow``, which in PySpark 4.3 refuses a
        null struct with a non-null field)."""
        result = self._live_result(frame)
        if result is not None:
            keys_schema = pa.schema(
                [arrow_schema(self._spark, frame.schema).field(key) for key in keys]
            )
            wanted = self.configuration.get(RANGE_SAMPLE_SIZE)
            return sample_rows(result.output, keys_schema, wanted)
        keys_only = frame.select(*keys)
        step = f"sample of {', '.join(keys)} for range bounds"
        with JobLabel(self._spark, step):
            rows = keys_only.count()
        wanted = self.configuration.get(RANGE_SAMPLE_SIZE)
        if rows > wanted:
            keys_only = keys_only.sample(fraction=min(1.0, 1.2 * wanted / rows), seed=rows)
        tasks = dataclasses.replace(FrameInput(keys_only).task_output(), description=step)
        return collect_arrow(tasks, arrow_schema(self._spark, keys_only.schema))

    def _reduce(
        self,
        exchanges: Sequence[Exchange],
        operation: ReduceOperation,
        schema: StructType,
        *,
        plan: ConsumerPlan | None = None,
    ) -> DataFrame:
        for exchange in exchanges:
            exchange.recover()
        plan = plan or self._plan(exchanges, operation)
        graph = StageGraph(
            [
                *(Stage(f"map-{i}", e.number_of_maps) for i, e in enumerate(exchanges)),
                Stage("reduce", len(plan.tasks)),
            ],
            [StageExchange(e.result_id, f"map-{i}", "reduce") for i, e in enumerate(exchanges)],
        )
        groups = build_groups(graph)
        by_result = {exchange.result_id: exchange for exchange in exchanges}

        def descriptors_of(group: ConsumedPartitionGroup) -> Sequence[ShuffleDescriptor]:
            return by_result[group.result_id].descriptors()

        # Shared, not part of the task closure: every reduce task would otherwise carry (and
        # unpickle) the deployments of all reducers.
        deployments = self._link.share(
            tuple(
                consumer_deployments(
                    groups, "reduce", self._descriptors, descriptors_of, planned_reads(plan)
                )
            )
        )
        read = self._link.tally((0, 0), add_counts)
        reruns_read: Tally[MapOutputs] | None = None
        if self._spark_outputs is not None:  # Spark reruns map tasks in an action (classic)
            reruns_read = self._link.tally(MapOutputs(), merge_map_outputs)
        spec = ReduceStageSpec(
            self.configuration,
            self._secret,
            deployments,
            tuple(
                exchange.schema(arrow_schema(self._spark, exchange.frame_schema))
                for exchange in exchanges
            ),
            operation,
            read,
            reruns_read,
        )

        output_schema = arrow_schema(self._spark, schema)

        def reduce_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            reruns: dict[tuple[str, int], bytes] = {}
            for batch in batches:
                for result_id, map_index, producer in zip(
                    *batch.select(["result_id", "map_index", "producer"]).to_pydict().values(),
                    strict=True,
                ):
                    if result_id is not None:
                        reruns[result_id, map_index] = producer
            task = TaskContext.get()
            assert task is not None
            # The declared types (an operation's function may return int32 for a long, say),
            # so that Spark, a fused stage and a sink all get the same.
            for batch in run_reduce_task(spec, task.partitionId(), reruns):
                yield conform(batch, output_schema)

        reducers = self._reducer_rows(exchanges, len(plan.tasks))
        result = reducers.mapInArrow(reduce_partition, schema)
        names = ", ".join(exchange.name for exchange in exchanges)
        output = TaskOutput(reducers, reduce_partition, f"reduce stage of {names}", len(plan.tasks))
        consumed = [group for each in groups.exchanges for group in each.consumed]
        self._remember(
            result,
            _Result(
                list(exchanges),
                operation,
                schema,
                plan,
                consumed,
                read,
                reruns_read,
                (deployments,),
                output,
            ),
        )
        return result

    def _reducer_rows(self, exchanges: Sequence[Exchange], count: int) -> DataFrame:
        """The reduce stage's tasks: partition ``i`` is reducer ``i``, with a row for each map
        output of its inputs that Spark reran inside the action (none, mostly).

        Made in the JVM, so a reduce task costs what a ``mapInArrow`` task over Spark's
        cheapest source does. Where map outputs live on executors, each task reads Spark's
        shuffle of the map tasks' rows (see ``Exchange.held_map_outputs``): a lost executor
        makes Spark rerun its map tasks inside the action, and the rows of attempts the driver
        does not know (reruns) reach every reducer; the rest are dropped in the JVM."""
        reducers = self._spark.range(0, count, 1, max(count, 1))
        held = [frame for exchange in exchanges if (frame := exchange.held_map_outputs())]
        if not held:
            return reducers.selectExpr(
                "cast(null as string) as result_id",
                "cast(null as long) as map_index",
                "cast(null as binary) as producer",
            )
        known = self._spark.createDataFrame(
            [
                (exchange.result_id, map_index, attempt)
                for exchange in exchanges
                for map_index, attempt in exchange.known_attempts()
            ],
            "result_id string, map_index long, attempt string",
        )
        rows = functools.reduce(DataFrame.unionByName, held).coalesce(1)
        reruns = rows.join(F.broadcast(known), ["result_id", "map_index", "attempt"], "left_anti")
        # A cartesian product, never a broadcast of either side: each reduce task must read
        # the shuffle itself, for Spark to rerun what it lost.
        return (
            reducers.hint("shuffle_replicate_nl")
            .crossJoin(reruns.select("result_id", "map_index", "producer"))
            .select("result_id", "map_index", "producer")
        )

    def _plan(self, exchanges: Sequence[Exchange], operation: ReduceOperation) -> ConsumerPlan:
        inputs = [exchange.bytes_matrix() for exchange in exchanges]
        if not exchanges[0].automatic_reducers:
            return one_reducer_per_subpartition(inputs)
        plan = adaptive_plan(
            self.configuration,
            inputs,
            operation.splittable_inputs(len(exchanges)),
            self._link.default_parallelism(),
        )
        if plan.unsplittable:
            names = ", ".join(exchange.name for exchange in exchanges)
            _LOG.warning(
                "%s: skewed subpartitions %s are each read whole by one reducer (the operation"
                " keeps a key in one reducer, or one map task wrote the subpartition); reducers"
                " read %s bytes at most",
                names,
                list(plan.unsplittable),
                f"{max(task.bytes for task in plan.tasks):,}",
            )
        return plan
