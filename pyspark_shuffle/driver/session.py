"""``SparkShuffle``: DataFrame operations whose exchange goes through a pyshuffle service.

A thin front: what it keeps is in :mod:`~pyspark_shuffle.driver.registry`, its configuration
in :mod:`~pyspark_shuffle.driver.session_config`, reduce stages in
:mod:`~pyspark_shuffle.driver.reduce_stage`, joins in :mod:`~pyspark_shuffle.driver.joins`,
and how it talks to Spark in :mod:`~pyspark_shuffle.spark.link`."""

from __future__ import annotations

import atexit
import dataclasses
import inspect
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from blob import BLOB_CACHE_MAX_SIZE, BlobStore, blob_store_url
from pyspark_shuffle.driver.exchange import Exchange
from pyspark_shuffle.driver.fused import collect_arrow, write_parquet
from pyspark_shuffle.driver.joins import join
from pyspark_shuffle.driver.parquet import ParquetFilter, ParquetSink, ParquetSource
from pyspark_shuffle.driver.reduce_stage import DriverContext
from pyspark_shuffle.driver.registry import ResultRegistry, adopt_reruns
from pyspark_shuffle.driver.results import Result, ShuffleStatistics, new_stage
from pyspark_shuffle.driver.schemas import arrow_schema, check_carried, declared_schema
from pyspark_shuffle.driver.session_config import SessionConfig, spark_configuration
from pyspark_shuffle.driver.stages import Stages, check_frame, check_sides, column_names
from pyspark_shuffle.kernels.operations import (
    BatchFunction,
    CogroupApply,
    CogroupFunction,
    GroupApply,
    GroupFunction,
    MapBatches,
    PassThrough,
    SortWithin,
)
from pyspark_shuffle.kernels.partitioners import RangePartitioner, choose_boundaries
from pyspark_shuffle.kernels.sorting import sort_keys_of
from pyspark_shuffle.options import MAX_SUBPARTITIONS
from pyspark_shuffle.spark.internals import SparkShuffleOutputs
from pyspark_shuffle.spark.link import application_identity, spark_link
from pyspark_shuffle.tasks.pandas_functions import (
    PandasCogroupFunction,
    PandasCogroupsFunction,
    PandasFunction,
    PandasGroupFunction,
    PandasGroupsFunction,
    PandasSettings,
)
from scheduling.deployment import DescriptorCache
from scheduling.options import DESCRIPTOR_OFFLOAD_THRESHOLD
from shuffle_api import Configuration, RecordingJobContext, ShuffleMasterContext, new_id

__all__ = ["ShuffleStatistics", "SparkShuffle", "spark_configuration"]


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
        self._config = SessionConfig(spark, config, config_file)
        started_with = self._config.started_with
        master_context = ShuffleMasterContext(started_with, application=application_identity(spark))
        # Before the master starts: a session this cannot work with is refused with nothing
        # left running.
        link = spark_link(
            spark,
            blob_url=blob_store_url(started_with),
            blob_cache_bytes=started_with.get(BLOB_CACHE_MAX_SIZE),
            secret=master_context.secret,
        )
        self._master = self._config.factory.create_shuffle_master(master_context)
        descriptors = DescriptorCache(
            blob_store=BlobStore(blob_store_url(started_with)),
            offload_threshold=started_with.get(DESCRIPTOR_OFFLOAD_THRESHOLD),
        )
        # Spark's map output tracker: classic sessions only (Connect has no Py4J).
        spark_outputs = None if link.connect else SparkShuffleOutputs(spark)
        driver = DriverContext(
            spark, link, master_context.secret, descriptors, spark_outputs is not None
        )
        self._master.start()
        # Once started: what the master tells its executors may come from registering (an
        # application's credential).
        self._config.from_master = self._master.environment_configuration()
        self._job = RecordingJobContext(f"spark-{new_id()[:16]}")
        self._master.register_job(self._job)
        self._registry: ResultRegistry[Result, ParquetSource] = ResultRegistry(
            descriptors,
            recomputable=lambda: spark_outputs is not None and spark_outputs.available,
            spark_running=link.running,
        )
        self._stages = Stages(
            driver,
            self._master,
            self._job,
            spark_outputs,
            self._registry,
            configuration=self._config.now,
        )
        atexit.register(self.close)

    @property
    def configuration(self) -> Configuration:
        """The configuration as an operation starting now reads it: ``spark.conf.set`` of a
        ``spark.pyshuffle.*`` key between operations takes effect (below the mapping given
        here). A key that configures the running service may not change:
        :class:`ConfigError` names it."""
        return self._config.now()

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
        self._registry.add_source(frame, source)
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
        spark_schema = frame.schema
        schema = arrow_schema(self._spark, spark_schema)
        sink = ParquetSink(path, names, new_id()[:16], schema, spark_schema, compression)
        return write_parquet(self._stages.row_tasks(self.configuration, frame), sink, mode)

    def to_arrow(self, frame: DataFrame) -> pa.Table:
        """``frame`` as a ``pyarrow.Table`` in the driver, in its order: a result of this
        object straight from its reduce tasks as Arrow IPC (the JVM sees opaque chunks, not
        rows)."""
        check_carried(frame.schema, "to_arrow")
        schema = arrow_schema(self._spark, frame.schema, timezone="UTC")  # as toArrow's
        return collect_arrow(self._stages.row_tasks(self.configuration, frame), schema)

    # -- operations ---------------------------------------------------------------------

    def repartition(
        self, frame: DataFrame, keys: str | Sequence[str], *, num_partitions: int | None = None
    ) -> DataFrame:
        """Rows with equal keys in the same partition (by hash); ``num_partitions`` fixed, or
        automatic from the bytes the map stage wrote."""
        configuration = self.configuration
        exchange = self._stages.hash_exchange(
            configuration, frame, keys, num_partitions, "repartition"
        )
        return self._stages.reduce(configuration, [exchange], PassThrough(), exchange.frame_schema)

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
        configuration = self.configuration
        exchange = self._stages.hash_exchange(
            configuration, frame, keys, num_partitions, "repartition"
        )
        return self._stages.reduce(configuration, [exchange], MapBatches(function), declared)

    def rebalance(
        self, frame: DataFrame, keys: str | Sequence[str], *, num_partitions: int | None = None
    ) -> DataFrame:
        """Spark's ``REBALANCE`` hint: rows hash-partitioned by ``keys`` into partitions of
        about ``pyspark-shuffle.reducer.target-size`` bytes; with ``num_partitions`` automatic,
        a skewed key's rows are split among several partitions (so, unlike
        :meth:`repartition`, equal keys may land in different partitions)."""
        configuration = self.configuration
        exchange = self._stages.hash_exchange(
            configuration, frame, keys, num_partitions, "rebalance"
        )
        operation = PassThrough(rebalance=True)
        return self._stages.reduce(configuration, [exchange], operation, exchange.frame_schema)

    def hash_exchange(
        self, frame: DataFrame, keys: str | Sequence[str], *, num_partitions: int | None = None
    ) -> Exchange:
        """The map stage of :meth:`repartition` alone: ``frame`` written, partitioned by the
        hash of ``keys``; :meth:`read` is the reduce stage. It stays until :meth:`close`
        (or :meth:`release` of a result that reads it), whatever results of it are dropped."""
        return self._stages.hash_exchange(
            self.configuration, frame, keys, num_partitions, "repartition", pinned=True
        )

    def read(self, exchange: Exchange) -> DataFrame:
        """The reduce stage: a DataFrame of the exchange's rows, partitioned as written (first
        rerunning the producers of any partition the service lost)."""
        return self._stages.reduce(
            self.configuration, [exchange], PassThrough(), exchange.frame_schema
        )

    def recover(self, result: DataFrame) -> DataFrame:
        """``result`` again, after rerunning the producers of partitions lost since it was made
        (an action on it failed with :class:`PartitionNotFoundError`). ``result`` itself keeps
        naming the lost attempts; run the action on the returned DataFrame."""
        found = self._registry.known_result(result)
        if found.broadcast is None:
            return self._stages.reduce(
                self.configuration, found.exchanges, found.operation, found.schema
            )
        # A broadcast join: the broadcast side lives in Spark's broadcast; only what its
        # tasks read through a fused input can have been lost.
        for exchange in found.exchanges:
            exchange.recover()
        again = found.row_tasks.frame.mapInArrow(found.row_tasks.produce, found.schema)
        self._registry.remember(again, dataclasses.replace(found, stage=new_stage(), kept=None))
        return again

    def group_apply(
        self,
        frame: DataFrame,
        keys: str | Sequence[str],
        function: GroupFunction | PandasFunction,
        schema: StructType | str,
        *,
        num_partitions: int | None = None,
    ) -> DataFrame:
        """``function(table)`` or ``function(key, table)`` per key group, as Spark's
        ``groupBy(keys).applyInArrow(function, schema)``; or, for a function marked by
        :func:`~pyspark_shuffle.pandas_function`, ``f(pdf)`` or ``f(key, pdf)`` as Spark's
        ``groupBy(keys).applyInPandas(f, schema)``: the same frame and key in, the result
        checked and converted as Spark does, with its error classes (under the session's
        time zone and pandas settings as they are at this call).

        A pandas function is marked rather than told by a keyword: the mark travels with the
        function, so a caller that wraps users' functions (as a drop-in for ``applyInPandas``
        does) passes them on as any other, and a pandas function cannot reach the Arrow path
        by a forgotten flag."""
        declared = declared_schema(schema, "group_apply")
        names = column_names(keys)
        if isinstance(function, PandasFunction):
            settings = PandasSettings.of(self._spark)
            # Over a reducer's sorted rows: converted a run of groups at a time.
            group = PandasGroupFunction.of(function, names, declared, settings)
            operation = GroupApply(names, PandasGroupsFunction(group), whole_partition=True)
        else:
            pass_key = len(inspect.signature(function).parameters) == 2
            operation = GroupApply(names, function, pass_key=pass_key)
        configuration = self.configuration
        exchange = self._stages.hash_exchange(
            configuration, frame, keys, num_partitions, "group_apply"
        )
        return self._stages.reduce(configuration, [exchange], operation, declared)

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
        declared = declared_schema(schema, "group_apply_sorted")
        configuration = self.configuration
        exchange = self._stages.hash_exchange(
            configuration, frame, keys, num_partitions, "group_apply_sorted"
        )
        operation = GroupApply(column_names(keys), function, whole_partition=True)
        return self._stages.reduce(configuration, [exchange], operation, declared)

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
        names = column_names(keys)
        check_frame(frame, names, "sort")
        configuration = self.configuration
        sort_keys = sort_keys_of(names, ascending)
        subpartitions = num_partitions or configuration.get(MAX_SUBPARTITIONS)
        sample = self._stages.sample(configuration, frame, names)
        partitioner = RangePartitioner(
            sort_keys, choose_boundaries(sample, sort_keys, subpartitions), subpartitions
        )
        source = self._stages.map_input(configuration, frame)
        exchange = self._stages.exchange(
            configuration, source, partitioner, f"sort{names}", automatic=num_partitions is None
        )
        return self._stages.reduce(configuration, [exchange], SortWithin(sort_keys), frame.schema)

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
        return join(
            self._stages,
            self.configuration,
            left,
            right,
            keys=column_names(on),
            how=how,
            num_partitions=num_partitions,
            broadcast=broadcast,
        )

    def cogroup_apply(
        self,
        left: DataFrame,
        right: DataFrame,
        keys: str | Sequence[str],
        function: CogroupFunction | PandasFunction,
        schema: StructType | str,
        *,
        num_partitions: int | None = None,
    ) -> DataFrame:
        """Spark's ``left.groupBy(keys).cogroup(right.groupBy(keys)).applyInArrow(function,
        schema)``: ``function(left_table, right_table)`` or ``function(key, left_table,
        right_table)`` once per key present on either side, each table a side's rows of the
        key with all its columns (empty, of that side's schema, where it has none); ``key``
        is a tuple of ``pyarrow.Scalar``, the left rows' or, where the left has none, the
        right's. Null keys are a group as any other. Both sides are hash-partitioned alike by
        ``keys`` (same names and types on both) and each reducer cogroups its rows. For a
        function marked by :func:`~pyspark_shuffle.pandas_function`, Spark's
        ``cogroup(...).applyInPandas(f, schema)``, as :meth:`group_apply` runs a pandas
        function."""
        declared = declared_schema(schema, "cogroup_apply")
        names = column_names(keys)
        if isinstance(function, PandasFunction):
            settings = PandasSettings.of(self._spark)
            # Over a reducer's two sides whole: converted a run of keys at a time.
            cogroup = PandasCogroupFunction.of(function, names, declared, settings)
            operation = CogroupApply(names, PandasCogroupsFunction(cogroup), whole_partition=True)
        else:
            pass_key = len(inspect.signature(function).parameters) == 3
            operation = CogroupApply(names, function, pass_key=pass_key)
        check_sides(left, right, names, "cogroup_apply")
        configuration = self.configuration
        exchanges = [
            self._stages.hash_exchange(
                configuration, frame, names, num_partitions, f"cogroup_apply-{side}"
            )
            for side, frame in (("left", left), ("right", right))
        ]
        return self._stages.reduce(configuration, exchanges, operation, declared)

    # -- lifecycle ------------------------------------------------------------------------

    def exchanges(self, result: DataFrame) -> list[Exchange]:
        """The shuffles behind a DataFrame this object returned."""
        return list(self._registry.known_result(result).exchanges)

    def statistics(self, result: DataFrame) -> ShuffleStatistics:
        found = self._registry.known_result(result)
        self._registry.release_unreachable()
        adopt_reruns(found)
        return found.statistics()

    def release(self, result: DataFrame) -> None:
        """Delete the shuffle data behind ``result``; reading it again then fails (unless a
        later stage's rerun may need it: see ``docs/pyspark.md``). Data that another live
        result reads too (one made by :meth:`recover`, or a second :meth:`read` of the same
        exchange) stays until that one is released as well."""
        self._registry.release(result)

    def session_running(self) -> bool:
        """Whether the Spark session this object serves still runs."""
        return self._stages.driver.link.running()

    def close(self) -> None:
        """Release every shuffle this object made and stop its master. Results it made can no
        longer be read."""
        shared = self._registry.close()
        if shared is None:
            return
        self._master.unregister_job(self._job.job_id)
        self._master.close()
        atexit.unregister(self.close)
        # Last: the data is gone already whatever Spark answers here.
        if self._stages.driver.link.running():
            for each in shared:
                each.destroy()
        self._stages.driver.link.close()

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
