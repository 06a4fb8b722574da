"""Spark internals pyshuffle uses, each with the versions it is tested on and what it does
where one is missing.

On the driver, Spark shuffles pyshuffle holds on to: a DataFrame that reads one shuffle every
time it is queried, and telling Spark that the map outputs of such a shuffle are gone, so that
it recomputes them (and, through the lineage, whatever they were computed from) the next time
a stage needs them, as it does for outputs lost with an executor.

An exchange on the default service keeps a Spark shuffle of its map tasks' metadata rows (see
``Exchange.held_map_outputs``): Spark reruns lost map tasks through it. Once pyshuffle deletes
the exchange's partitions, Spark must stop believing that shuffle holds them, else a rerun of a
later stage fused from the exchange would read deleted partitions instead of remaking them.

PySpark has no API for either. The DataFrame is made in the JVM through Py4J from the
shuffle's own RDD (public Java API: ``Dataset.javaRDD``, ``SparkSession.createDataFrame``).
Spark's ``MapOutputTrackerMaster`` is reached through the
DAGScheduler with Py4J reflection (``SparkEnv``'s own methods cannot be listed by Py4J in
Spark 4); where that fails, :attr:`SparkShuffleOutputs.available` is false and callers keep
what a rerun may need instead.

Classic sessions only (Spark Connect has no Py4J: there the driver collects the map tasks'
rows and reruns lost map tasks itself). Tested on PySpark 3.5.9, 4.0.5 and 4.3.0 (``make
spark-versions`` recovers a lost partition through it); the driver uses these internals (and
whether the SparkContext still runs) and no other. The held shuffle is planned with Spark 4.2's
checksums of rerun map tasks off (public SQL settings, put back after).

Spark's estimate of a DataFrame's size, :func:`estimated_bytes`: its optimized plan's
statistics (``sizeInBytes``: a Parquet scan's file bytes, a range's rows by their width, an
upper bound after filters), the same from 3.5 to 4.3; under Spark Connect (no Py4J), the same
statistics as the client's ``explain(mode="cost")`` prints them (``_explain_string``, in
every Connect client from 3.5 to 4.3: the one size the protocol gives); ``None`` where the
plan will not say.

In a Python worker: the connection a task reads its input from, :func:`task_connection` (the
``infile`` of ``pyspark.worker.main``, the same in every release from 3.5 to 4.3; ``None``
where it is not found, and the caller leaves the connection as Spark made it).

Also in a Python worker, a grouped map's pandas conversions, by PySpark's own functions, so
that a pandas function sees and answers what it would under ``applyInPandas``:
:func:`pandas_group` (the group as a frame: ``ArrowBatchTransformer.to_pandas`` of
``pyspark.sql.conversion``, 4.2 and later), :func:`check_pandas_result` (the result's type and
columns, raising the release's own error classes: ``pyspark.worker.verify_pandas_result``, the
same call from 3.5 to 4.3) and :func:`pandas_result_batch` (the result in the schema's Arrow
types, cast where Spark casts: ``PandasToArrowConversion.convert``, 4.2 and later). Tested on
4.3.0 and 3.5.9; where one is missing (3.5 to 4.1 for the conversions) pyshuffle's own
:mod:`~pyspark_shuffle.spark.pandas_fallback` does what those releases do (on 3.5.9, the same
frames, batches and errors as its serializers).

Also in a Python worker, the checks of an ``applyInArrow`` function's result, by PySpark's own
functions, so that it fails as it would under Spark with the release's error classes:
:func:`arrow_result` (``verify_return_type`` and ``ArrowBatchTransformer.enforce_schema``
without casts, 4.3 and later; ``verify_arrow_table``, 4.1 and 4.2, or ``verify_arrow_result``,
4.0), against the Arrow types of :func:`arrow_result_schema`. Tested on 4.3.0, on the
pyspark-client packages of 4.0.0, 4.1.0 and 4.2.0 (unit tests only) and, through pyshuffle's
own :mod:`~pyspark_shuffle.spark.arrow_fallback` (4.3's checks, where a release has none: 3.5
has no ``applyInArrow``), on 3.5.9. And the values of Arrow grouped-aggregate UDFs,
:func:`arrow_aggregates`, enforced as the 4.3 worker enforces them (``enforce_schema`` with
its casts); 4.1 and 4.2, which convert them otherwise, are left to Spark.

For a map stage's progress bar, where the driver's output shows: :func:`submitted_to_terminal`
(under spark-submit, whose JVM started the Python driver, as PySpark's ``PYSPARK_GATEWAY_PORT``
says, and relays its output to the JVM's stdout: whether that is a terminal, by the JVM's
``System.console()``, and Spark's log4j root logger shows no INFO lines there; false where
any of it cannot be asked), and on a Spark Connect client whether the client draws its own
bar, :func:`connect_progress_bar` (``pyspark.sql.connect.shell.progress_bar_enabled``: the
variable PySpark's Connect shell sets; false where a release has none, 3.5). Tested on 4.3.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import re
import sys
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from pyspark_shuffle.spark import arrow_fallback
from pyspark_shuffle.spark.compat import SPARK_VERSION, spark_arrow_schema
from shuffle_api import InvalidOperationError

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "HeldShuffle",
    "SparkShuffleOutputs",
    "arrow_aggregates",
    "arrow_aggregates_supported",
    "arrow_result",
    "arrow_result_schema",
    "check_pandas_result",
    "connect_progress_bar",
    "context_running",
    "estimated_bytes",
    "held_shuffle",
    "pandas_group",
    "pandas_result_batch",
    "submitted_to_terminal",
    "task_connection",
]

_LOG = logging.getLogger(__name__)


def _map_output_tracker(spark: SparkSession) -> Any | None:
    try:
        scheduler = spark.sparkContext._jsc.sc().dagScheduler()
        field = scheduler.getClass().getDeclaredField("mapOutputTracker")
        field.setAccessible(True)
        tracker = field.get(scheduler)
        tracker.getNumAvailableOutputs(-1)  # proves the method is reachable
    except Exception as error:  # Py4J raises several kinds; any means "not reachable"
        _LOG.warning(
            "Spark's map output tracker is not reachable (%s): exchanges on executors stay"
            " while a later stage may rerun from them",
            error,
        )
        return None
    return tracker


@dataclass(frozen=True)
class HeldShuffle:
    """A DataFrame over one Spark shuffle's output, and its JVM RDD."""

    frame: DataFrame
    java_rdd: Any


def context_running(spark: SparkSession) -> bool:
    """False once the SparkContext is stopped (PySpark drops its JVM handle; no public API
    says so)."""
    return spark.sparkContext._jsc is not None


def submitted_to_terminal(spark: SparkSession) -> bool:
    """Whether this Python driver runs under spark-submit, whose JVM relays its output to a
    terminal that Spark writes no INFO lines to."""
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return False
    try:
        jvm: Any = spark.sparkContext._jvm
        console = jvm.java.lang.System.console()
        info_shown = jvm.org.apache.logging.log4j.LogManager.getRootLogger().isInfoEnabled()
    except Exception as error:  # Py4J raises several kinds; any means "not known"
        _LOG.debug("cannot tell whether spark-submit relays to a terminal: %s", error)
        return False
    if console is None or info_shown:
        return False
    try:
        return bool(console.isTerminal())
    except Exception:  # Py4J: no isTerminal before Java 22, where a console is a terminal
        return True


def connect_progress_bar() -> bool:
    """Whether this Spark Connect client draws a progress bar of its own queries."""
    try:
        # Not at the top: pyspark.sql.connect fails to import without the Connect client's
        # own dependencies, which a classic session need not have.
        from pyspark.sql.connect.shell import progress_bar_enabled  # noqa: PLC0415
    except ImportError:
        return False
    return bool(progress_bar_enabled())


# Spark 4.2 and later (by default; 4.1 when asked) checksum each map task's shuffled rows and,
# when a rerun's rows differ, rerun every task of the stages that read them, or fail the job
# when one of those is a result stage with tasks done (Spark's SQL migration guide, 4.1 to
# 4.2). The rows of a held shuffle say where each map output lives, which a rerun changes by
# design; reducers that finished read the old places while they held. Spark makes a shuffle
# without checksums only when both settings are off.
_RERUN_CHECKSUMS = (
    "spark.sql.shuffle.orderIndependentChecksum.enabled",
    "spark.sql.shuffle.orderIndependentChecksum.enableFullRetryOnMismatch",
)


@contextmanager
def _without_rerun_checksums(session: SparkSession) -> Iterator[None]:
    """While a shuffle is planned, Spark makes it without those checksums (the session's
    settings are put back after: a query planned meanwhile in another thread would lose them
    too)."""
    before = {  # none on a Spark without them
        key: value
        for key in _RERUN_CHECKSUMS
        if session.conf.isModifiable(key) and (value := session.conf.get(key)) is not None
    }
    for key in before:
        session.conf.set(key, "false")
    try:
        yield
    finally:
        for key, value in before.items():
            session.conf.set(key, value)


def estimated_bytes(frame: DataFrame) -> int | None:
    """Spark's estimate of the bytes of ``frame``'s rows, or ``None``."""
    java_frame = getattr(frame, "_jdf", None)  # a Spark Connect DataFrame has none
    try:
        if java_frame is None:
            return _printed_estimate(frame)
        return int(str(java_frame.queryExecution().optimizedPlan().stats().sizeInBytes()))
    except Exception as error:  # Py4J's or Connect's errors, or a plan Spark cannot size
        _LOG.debug("Spark did not estimate the size of a DataFrame: %s", error)
        return None


_OPTIMIZED_PLAN = "== Optimized Logical Plan =="
# As Spark prints sizes (Utils.bytesToString): "78.1 KiB", "8.0 EiB" for an unknown size.
_PRINTED_SIZE = re.compile(
    r"Statistics\(sizeInBytes=([0-9]+(?:\.[0-9]+)?) ?(B|KiB|MiB|GiB|TiB|PiB|EiB)\b"
)
_UNIT_BYTES = {
    unit: 1 << (10 * power)
    for power, unit in enumerate(("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"))
}


def _printed_estimate(frame: DataFrame) -> int | None:
    """The size of the root of ``frame``'s optimized plan, as a Spark Connect client's
    ``explain(mode="cost")`` prints it (to a tenth of its unit)."""
    explain = getattr(frame, "_explain_string", None)
    if explain is None:
        return None
    text = str(explain(mode="cost"))
    _, found, optimized = text.partition(_OPTIMIZED_PLAN)
    match = _PRINTED_SIZE.search(optimized) if found else None
    if match is None:
        return None
    return int(float(match[1]) * _UNIT_BYTES[match[2]])


def held_shuffle(shuffled: DataFrame) -> HeldShuffle:
    """``shuffled`` (which ends in a shuffle) as a DataFrame over its one RDD: every query over
    it reads that same Spark shuffle, where a query planned from ``shuffled`` would shuffle
    anew. In the JVM (``Dataset.javaRDD``, ``createDataFrame``), so no row passes through
    Python on the way. Planning it may run the shuffle's map stage (adaptive execution
    materializes it). Its map tasks' rows may differ when rerun (see ``_RERUN_CHECKSUMS``)."""
    session = shuffled.sparkSession
    with _without_rerun_checksums(session):
        java_rows = shuffled._jdf.javaRDD()
    frame = session._jsparkSession.createDataFrame(java_rows, shuffled._jdf.schema())
    return HeldShuffle(DataFrame(frame, session), java_rows.rdd())


def _shuffle_dependency(java_rdd: Any) -> Any:
    """The Spark shuffle nearest below ``java_rdd`` in its lineage (first parents)."""
    while True:
        dependencies = java_rdd.dependencies()
        if dependencies.isEmpty():
            raise ValueError(f"no shuffle in the lineage of {java_rdd}")
        dependency = dependencies.head()
        if dependency.getClass().getSimpleName() == "ShuffleDependency":
            return dependency
        java_rdd = dependency.rdd()


class SparkShuffleOutputs:
    """The driver's map output tracker of one Spark application."""

    def __init__(self, spark: SparkSession) -> None:
        self._context = spark.sparkContext
        self._tracker = _map_output_tracker(spark)

    @property
    def available(self) -> bool:
        """Whether :meth:`forget` works here."""
        return self._tracker is not None

    @property
    def one_executor(self) -> bool:
        """Whether the application's one executor is the driver's JVM (local mode, not
        local-cluster): losing it loses the application, never just its map outputs."""
        master = str(self._context.master)
        return master == "local" or master.startswith("local[")

    def bytes_written(self, held: HeldShuffle) -> int | None:
        """The bytes of ``held``'s shuffle that Spark's map tasks wrote (its map output
        statistics), or ``None`` where Spark cannot say."""
        if self._tracker is None or self._context._jsc is None:
            return None
        try:
            statistics = self._tracker.getStatistics(_shuffle_dependency(held.java_rdd))
            return sum(int(size) for size in statistics.bytesByPartitionId())
        except Exception as error:  # Py4J's errors, or Spark's for a shuffle it dropped
            _LOG.debug("Spark's map output statistics are not reachable: %s", error)
            return None

    def drop(self, held: HeldShuffle) -> None:
        """Remove ``held``'s shuffle from Spark now, its map outputs and the executors' files,
        as Spark's cleaner does once the driver's garbage collector let go of it (which may
        take until the cleaner's periodic GC, 30 minutes by default): until then dynamic
        allocation's shuffle tracking keeps every executor that holds a file of it."""
        if self._context._jsc is None:
            return
        try:
            cleaner = self._context._jsc.sc().cleaner()
            if cleaner.isDefined():
                shuffle_id = _shuffle_dependency(held.java_rdd).shuffleId()
                cleaner.get().doCleanupShuffle(shuffle_id, False)
        except Exception as error:  # Py4J's errors: the cleaner takes it later
            _LOG.warning("Spark's shuffle of the map tasks' rows was not removed: %s", error)

    def forget(self, held: HeldShuffle) -> bool:
        """Unregister every map output of ``held``'s shuffle: the next stage that needs them
        reruns its map stage first. False if Spark could not be told (nothing to tell once
        the application stopped)."""
        if self._context._jsc is None:
            return True
        if self._tracker is None:
            return False
        try:
            shuffle_id = _shuffle_dependency(held.java_rdd).shuffleId()
            self._tracker.unregisterAllMapAndMergeOutput(shuffle_id)
        except Exception as error:  # Py4J's errors, or Spark's for a shuffle it dropped
            _LOG.warning("Spark's map outputs were not unregistered: %s", error)
            return False
        return True


_WORKER_MAIN = ("main", os.path.join("pyspark", "worker.py"))


def task_connection() -> int | None:
    """The file descriptor of the connection the running Python task reads its input from
    (a socket to its executor), found up the calling stack; ``None`` outside a task or where
    this PySpark runs tasks otherwise. Spark closes it when the task ends: use it within."""
    name, file = _WORKER_MAIN
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == name and code.co_filename.endswith(file):
            try:
                return int(frame.f_locals["infile"].fileno())
            except (KeyError, AttributeError, OSError, ValueError):
                return None
        frame = frame.f_back
    return None


# Spark hands a grouped map every timestamp in nanoseconds from 4.0 on, and casts a result
# column Arrow will not convert directly from 4.1 on.
_TIMESTAMPS_IN_NANOSECONDS_SINCE = (4, 0)
_GROUPED_MAP_CASTS_SINCE = (4, 1)
# Spark expects an applyInArrow result's strings and binaries as large ones where
# useLargeVarTypes says so from 4.3 on (SPARK-56929); before, always as small ones.
_LARGE_ARROW_RESULTS_SINCE = (4, 3)

# Imported when a task first converts: the worker's module is the task's to load, neither is in
# every release, and pandas (with the fallback, which needs it) loads only in the workers of
# pandas functions (a worker that imports it for nothing holds ~15 MiB more).


@functools.cache
def _conversion() -> Any | None:
    """``pyspark.sql.conversion``, where this PySpark has it (4.2 and later)."""
    try:
        from pyspark.sql import conversion  # noqa: PLC0415 (see above)
    except ImportError:
        return None
    return conversion


@functools.cache
def _pandas() -> tuple[Any, Any]:
    """pandas and :mod:`~pyspark_shuffle.spark.pandas_fallback` (which imports it)."""
    import pandas  # noqa: PLC0415 (see above)

    from pyspark_shuffle.spark import pandas_fallback  # noqa: PLC0415 (see above)

    return pandas, pandas_fallback


@functools.cache
def _worker_function(name: str) -> Any | None:
    """The function ``name`` of ``pyspark.worker``, where this PySpark has it."""
    try:
        from pyspark import worker  # noqa: PLC0415 (see above)
    except ImportError:
        return None
    return getattr(worker, name, None)


def pandas_group(table: pa.Table, *, timezone: str, prefer_int_extension: bool) -> pd.DataFrame:
    """A group's rows as the frame ``applyInPandas`` hands its function: numbers with nulls
    as floats with NaN (``prefer_int_extension``, Spark 4.3: as nullable integers instead),
    timestamps naive in ``timezone``, dates as ``datetime.date``, structs as dicts."""
    pandas, fallback = _pandas()
    conversion = _conversion()
    if conversion is None:
        nanoseconds = SPARK_VERSION >= _TIMESTAMPS_IN_NANOSECONDS_SINCE
        frame: pd.DataFrame = fallback.to_pandas_frame(table, timezone, nanoseconds=nanoseconds)
        return frame
    series = conversion.ArrowBatchTransformer.to_pandas(
        table, timezone=timezone, prefer_int_ext_dtype=prefer_int_extension
    )
    concatenated: pd.DataFrame = pandas.concat(series, axis=1)
    return concatenated


def check_pandas_result(result: Any, schema: StructType, *, by_name: bool) -> None:
    """Raise what Spark raises for ``result`` of a grouped map declared ``schema``: not a
    frame, or (a frame of no rows and no columns aside) columns that ``schema`` does not
    name (``by_name`` and a label is a string) or not as many as it has."""
    verify = _worker_function("verify_pandas_result")  # 3.5 to 4.3 alike
    if verify is None:
        _pandas()[1].check_result(result, schema, by_name)
    else:
        verify(result, schema, by_name, False)


def pandas_result_batch(
    result: pd.DataFrame,
    schema: StructType,
    *,
    timezone: str,
    safecheck: bool,
    by_name: bool,
    int_to_decimal: bool,
    large_var_types: bool,
) -> pa.RecordBatch:
    """A checked result as a batch of ``schema``'s Arrow types (naive timestamps read in
    ``timezone``), with Spark's fallback to Arrow's cast (4.1 and later) and its conversion
    errors (``safecheck``: Spark's ``convertToArrowArraySafely``; ``int_to_decimal``: its
    ``intToDecimalCoercionEnabled``)."""
    conversion = _conversion()
    try:
        if conversion is None:
            fallback_batch: pa.RecordBatch = _pandas()[1].to_arrow_batch(
                result,
                schema,
                timezone=timezone,
                safecheck=safecheck,
                arrow_cast=SPARK_VERSION >= _GROUPED_MAP_CASTS_SINCE,
                by_name=by_name,
                int_to_decimal=int_to_decimal,
                large_var_types=large_var_types,
            )
            return fallback_batch
        batch: pa.RecordBatch = conversion.PandasToArrowConversion.convert(
            result,
            schema,
            timezone=timezone,
            safecheck=safecheck,
            arrow_cast=True,
            prefers_large_types=large_var_types,
            assign_cols_by_name=by_name,
            int_to_decimal_coercion_enabled=int_to_decimal,
        )
    except PySparkException as error:
        _tell_cause(error)
        raise
    return batch


def _tell_cause(error: BaseException) -> None:
    """Add to ``error``'s text what caused it (Arrow's own complaint: "int or Decimal object
    expected, got datetime.date"). Spark's worker shows the cause of an error raised in its
    conversion, but drops it from a traceback through other code, as a pyshuffle task's is."""
    cause = error.__cause__
    if cause is not None:
        told = "".join(traceback.format_exception_only(type(cause), cause)).strip()
        error.add_note(f"The direct cause: {told}")


def arrow_result_schema(schema: StructType, *, large_var_types: bool) -> pa.Schema:
    """The Arrow types Spark's ``applyInArrow`` wants of a result declared ``schema``:
    timestamps in UTC, strings and binaries large where ``large_var_types`` (Spark 4.3 and
    later; small before, whatever the setting)."""
    return spark_arrow_schema(
        schema,
        timezone="UTC",
        prefers_large_types=large_var_types and SPARK_VERSION >= _LARGE_ARROW_RESULTS_SINCE,
    )


@functools.cache
def _enforce_schema() -> Any | None:
    """``ArrowBatchTransformer.enforce_schema`` where it checks names (or the count) and
    types without casting (4.3 and later: ``reorder_by_name``)."""
    transformer = getattr(_conversion(), "ArrowBatchTransformer", None)
    enforce = getattr(transformer, "enforce_schema", None)
    if enforce is None or "reorder_by_name" not in inspect.signature(enforce).parameters:
        return None
    return enforce


def _spark_arrow_checks() -> Any | None:
    """Before 4.3, the worker's check of an ``applyInArrow`` result: ``verify_arrow_table``
    (4.1, 4.2), or 4.0's ``verify_arrow_result`` (which checks it is a table too)."""
    verify = _worker_function("verify_arrow_table")
    if verify is None and SPARK_VERSION == (4, 0):
        verify = _worker_function("verify_arrow_result")
    return verify


def arrow_aggregates_supported() -> bool:
    """Whether pyshuffle runs Arrow grouped-aggregate UDFs as this release's worker does: from
    4.3 (``enforce_schema`` on each value's one-row array); 4.1 and 4.2 convert otherwise."""
    return _enforce_schema() is not None


def arrow_aggregates(values: Sequence[Sequence[Any]], expected: pa.Schema) -> pa.Table:
    """The values of Arrow aggregate UDFs (one list per UDF, a value per group) as Spark's
    worker makes them: each value a one-row ``pa.array``, the UDFs' arrays a table named as
    ``expected``, its types enforced (cast, safely) with the release's errors. Groups whose
    values have the same Arrow types are enforced together: casts are per value."""
    enforce = _enforce_schema()
    if enforce is None:
        raise InvalidOperationError("Arrow aggregate UDFs need PySpark 4.3 or later")
    arrays = [[pa.array([value]) for value in each] for each in values]
    names = expected.names
    if all(len({array.type for array in each}) <= 1 for each in arrays):
        columns = [
            pa.concat_arrays(each) if each else pa.nulls(0, field.type)
            for each, field in zip(arrays, expected, strict=True)
        ]
        return pa.Table.from_batches(
            [enforce(pa.RecordBatch.from_arrays(columns, names), expected)], expected
        )
    groups = len(arrays[0])
    batches = [
        enforce(pa.RecordBatch.from_arrays([each[group] for each in arrays], names), expected)
        for group in range(groups)
    ]
    return pa.Table.from_batches(batches, expected)


def arrow_result(result: Any, expected: pa.Schema, *, by_name: bool) -> pa.Table:
    """``result`` of an ``applyInArrow`` function checked as Spark checks it, raising the
    release's own error classes (not a table; names, by name, or count, by position, other
    than ``expected``'s; a type not exactly its: nothing is cast), as Spark then reads it:
    ``expected``'s columns under its names, or no rows for a table of no rows and no
    columns."""
    if isinstance(result, pa.Table) and result.schema.equals(expected):
        # What every release's checks pass unchanged; taken first, as they cost a small
        # function's time again.
        return result
    enforce, verify_type = _enforce_schema(), _worker_function("verify_return_type")
    if enforce is not None and verify_type is not None:
        verify_type(result, pa.Table)
        result = enforce(result, expected, arrow_cast=False, reorder_by_name=by_name)
    elif (verify := _spark_arrow_checks()) is not None:
        types = [(field.name, field.type) for field in expected]
        verify(result, by_name, dict(types) if by_name else types)
    else:
        arrow_fallback.check_result(result, expected, by_name)
    return arrow_fallback.arranged(result, expected, by_name)
