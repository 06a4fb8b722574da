"""Joins: both sides shuffled alike and joined per reducer, or one side broadcast (read whole
by every task of the other side, which is then not shuffled at all)."""

from __future__ import annotations

import dataclasses
import logging
import operator
import time
from collections.abc import Sequence

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from pyspark_shuffle.driver.broadcast import BroadcastSide, broadcast_join, broadcast_side
from pyspark_shuffle.driver.exchange import Exchange
from pyspark_shuffle.driver.fused import FusedInput, collect_arrow
from pyspark_shuffle.driver.inputs import MapInput
from pyspark_shuffle.driver.parquet import ParquetInput
from pyspark_shuffle.driver.results import Result
from pyspark_shuffle.driver.schemas import arrow_schema, join_schema
from pyspark_shuffle.driver.stages import Stages, check_sides
from pyspark_shuffle.kernels.ipc import to_ipc_stream
from pyspark_shuffle.kernels.operations import Join, PassThrough
from pyspark_shuffle.kernels.planning import one_reducer
from pyspark_shuffle.options import JOIN_BROADCAST_THRESHOLD
from pyspark_shuffle.tasks.map_reduce import add_counts
from scheduling.skew import ConsumerPlan
from shuffle_api import Configuration

__all__ = ["join"]

_LOG = logging.getLogger(__name__)

SmallSide = tuple[pa.Table, BroadcastSide]
"""A join side read whole into the driver, and the figures of reading it."""


def _checked_join(
    left: DataFrame, right: DataFrame, keys: Sequence[str], how: str
) -> tuple[Join, StructType]:
    """The join's operation and its rows' schema, or a clear error before any Spark job: an
    unknown join type, a key missing or of different types on the two sides, columns on both
    sides."""
    operation = Join(tuple(keys), how)
    check_sides(left, right, keys, "join")
    return operation, join_schema(left.schema, right.schema, keys, how)


def _small_parquet_side(source: MapInput, side: str, threshold: int | None) -> SmallSide | None:
    """A side that is a Parquet source of this object, read whole in the driver when
    Parquet's own sizes (then the table's) are within ``threshold`` (None: forced): no Spark
    job for it at all. None for any other side, or a larger one."""
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


def _broadcast_join(
    stages: Stages,
    configuration: Configuration,
    small: SmallSide,
    streamed_frame: DataFrame,
    *,
    operation: Join,
    schema: StructType,
) -> DataFrame:
    """``streamed_frame`` joined task by task with the whole ``small`` side, shared as Spark's
    own broadcast joins share theirs."""
    driver = stages.driver
    # Not kept: its tasks run the other side's tasks and join in the same pass.
    streamed = stages.map_input(configuration, streamed_frame, keep=False)
    table, written = small
    shared = driver.link.share(to_ipc_stream(table))
    # Counted as they run where Spark cannot say before (a DataFrame under Spark Connect).
    tasks_run = None
    if streamed.number_of_maps is None:
        tasks_run = driver.link.tally(frozenset[int](), operator.or_)
    tasks = broadcast_join(
        dataclasses.replace(streamed.row_tasks(), number_of_tasks=streamed.number_of_maps),
        arrow_schema(driver.spark, streamed.schema),
        table,
        side=written.side,
        shared=shared,
        operation=operation,
        output_schema=arrow_schema(driver.spark, schema),
        tasks_run=tasks_run,
    )
    result = Result(
        list(streamed.exchanges) if isinstance(streamed, FusedInput) else [],
        operation,
        schema,
        ConsumerPlan((), (), ()),
        [],
        driver.link.tally((0, 0), add_counts),
        None,
        (shared,),
        tasks,
        dataclasses.replace(written, joining_tasks=streamed.number_of_maps or 0),
        wraps=streamed.producer_stage,
        tasks_run=tasks_run,
    )
    frame = tasks.frame.mapInArrow(tasks.produce, schema)
    stages.registry.remember(frame, result)
    return frame


def _collect_broadcast_side(
    stages: Stages, configuration: Configuration, small: Exchange, side: str
) -> SmallSide:
    """What ``small`` wrote, read by one reducer into the driver; ``small`` is released once
    read."""
    plan = one_reducer([small.written_bytes()])
    reader = stages.reduce(configuration, [small], PassThrough(), small.frame_schema, plan=plan)
    table = collect_arrow(
        stages.registry.known_result(reader).row_tasks,
        arrow_schema(stages.driver.spark, small.frame_schema),
    )
    rows, size = small.total_rows, small.total_bytes
    stages.registry.release(reader)
    return table, BroadcastSide(side, small.number_of_maps, small.runs.seconds, rows, size, 0)


def join(
    stages: Stages,
    configuration: Configuration,
    left: DataFrame,
    right: DataFrame,
    *,
    keys: tuple[str, ...],
    how: str,
    num_partitions: int | None,
    broadcast: str,
) -> DataFrame:
    """``SparkShuffle.join``: see there."""
    operation, schema = _checked_join(left, right, keys, how)
    threshold = configuration.get(JOIN_BROADCAST_THRESHOLD)
    side = broadcast_side(how, broadcast, threshold)
    partitioner = stages.hash_partitioner(configuration, keys, num_partitions)
    automatic = num_partitions is None
    frames = {"left": left, "right": right}
    written: dict[str, Exchange] = {}
    if side is not None:
        other = "left" if side == "right" else "right"
        forced = broadcast == side
        # Built once: a Parquet one lists its files.
        source = stages.map_input(configuration, frames[side])
        small = _small_parquet_side(source, side, None if forced else threshold)
        if small is not None:
            return _broadcast_join(
                stages, configuration, small, frames[other], operation=operation, schema=schema
            )
        written[side] = stages.exchange(
            configuration, source, partitioner, f"join-{side}{keys}", automatic=automatic
        )
        if forced or written[side].total_bytes <= threshold:
            small = _collect_broadcast_side(stages, configuration, written[side], side)
            return _broadcast_join(
                stages, configuration, small, frames[other], operation=operation, schema=schema
            )
    exchanges = [
        written.get(name)
        or stages.exchange(
            configuration,
            stages.map_input(configuration, frames[name]),
            partitioner,
            f"join-{name}{keys}",
            automatic=automatic,
        )
        for name in ("left", "right")
    ]
    return stages.reduce(configuration, exchanges, operation, schema)
