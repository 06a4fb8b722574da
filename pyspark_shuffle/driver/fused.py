"""A result's rows out of the tasks that make them, without the JVM turning them into rows:
straight into the map side of the next exchange (a fused stage), as Parquet files the tasks
write (committed once per task), or as Arrow IPC chunks collected into a ``pyarrow.Table``."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Final

import numpy as np
import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.types import StructType

from pyspark_shuffle.driver.exchange import Exchange, stage_failure
from pyspark_shuffle.driver.inputs import MapInput, RowTasks
from pyspark_shuffle.driver.parquet import WRITE_MODES, WRITE_REPORT_SCHEMA, ParquetSink
from pyspark_shuffle.driver.progress import JobLabel
from pyspark_shuffle.kernels.ipc import from_ipc_stream, to_ipc_stream
from pyspark_shuffle.tasks.map_reduce import task_attempt_id
from shuffle_api import InvalidOperationError
from shuffle_runtime.batches import conform_all
from shuffle_runtime.ndarrays import arrow_array, bytes_array, longs

__all__ = ["FusedInput", "collect_arrow", "sample_rows", "write_parquet"]

_CHUNK_SCHEMA: Final = "task long, chunk binary"


def _task_index() -> int:
    task = TaskContext.get()
    assert task is not None, "Spark sets the TaskContext of every Python task"
    return task.partitionId()


def collect_arrow(tasks: RowTasks, schema: pa.Schema) -> pa.Table:
    """The result in task order, each task's batches as IPC streams (Spark's driver result
    limit, spark.driver.maxResultSize, applies as to ``toArrow``)."""
    produce = tasks.produce

    def chunks(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task = _task_index()
        for batch in produce(batches):
            if batch.num_rows:
                yield pa.record_batch(
                    {
                        "task": longs([task]),
                        "chunk": bytes_array([to_ipc_stream(batch)]),
                    }
                )

    with JobLabel(tasks.frame.sparkSession, f"{tasks.description} to Arrow"):
        try:
            rows = tasks.frame.mapInArrow(chunks, _CHUNK_SCHEMA).collect()
        except Exception as error:
            raise stage_failure(f"{tasks.description} to Arrow", error) from error
    batches = [batch for row in rows for batch in from_ipc_stream(bytes(row["chunk"])).to_batches()]
    return conform_all(batches, schema)


def write_parquet(tasks: RowTasks, sink: ParquetSink, mode: str) -> int:
    """Write the result with ``sink`` as Spark's ``write.mode(mode).parquet`` would; the
    number of files committed (0 when ``mode`` is ignore and the path exists)."""
    if mode not in WRITE_MODES:
        raise InvalidOperationError(f"write mode {mode!r}: one of {list(WRITE_MODES)}")
    for name in sink.partition_by:
        if name not in sink.schema.names:
            raise InvalidOperationError(
                f"partition_by: no column {name!r}; columns: {sink.schema.names}"
            )
    if len(sink.partition_by) == len(sink.schema.names):
        raise InvalidOperationError("partition_by names every column: no data would be left")
    if sink.existing():
        if mode in ("error", "errorifexists"):
            raise InvalidOperationError(
                f"path {sink.url} already exists; mode 'overwrite', 'append' or 'ignore'"
            )
        if mode == "ignore":
            return 0
    produce = tasks.produce

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield sink.write_task(_task_index(), task_attempt_id(), produce(batches))

    description = f"{tasks.description} to Parquet {sink.url}"
    try:
        with JobLabel(tasks.frame.sparkSession, description):
            reports = tasks.frame.mapInArrow(write, WRITE_REPORT_SCHEMA).collect()
    except Exception as error:
        sink.abort()
        raise stage_failure(description, error) from error
    return sink.commit(
        [(row["task"], row["attempt"], list(row["files"])) for row in reports],
        overwrite=mode == "overwrite",
    )


class FusedInput(MapInput):
    """An earlier result as the input of a map stage, never through the JVM: each map task is
    one of the result's reduce tasks, whose rows (of the result's declared types) go straight
    into the new exchange's writer."""

    def __init__(
        self, tasks: RowTasks, schema: StructType, exchanges: Sequence[Exchange], stage: str
    ) -> None:
        self._tasks = tasks
        self._schema = schema
        self.exchanges = tuple(exchanges)
        self._stage = stage

    @property
    def schema(self) -> StructType:
        return self._schema

    @property
    def number_of_maps(self) -> int | None:
        return self._tasks.number_of_tasks

    @property
    def upstream(self) -> Sequence[Exchange]:
        return self.exchanges

    @property
    def producer_stage(self) -> str:
        return self._stage

    def row_tasks(self) -> RowTasks:
        return self._tasks


def sample_rows(tasks: RowTasks, schema: pa.Schema, wanted: int) -> pa.Table:
    """About ``wanted`` rows of ``schema``'s columns, drawn uniformly from the result, in one
    job whose tasks send the driver their samples as Arrow IPC (never rows through the JVM).
    Each task keeps up to three times its even share (as Spark's RangePartitioner), in random
    order; the driver then takes the first rows of each in proportion to the rows it had."""
    produce, names = tasks.produce, schema.names

    def sample(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task = _task_index()
        keys = [batch.select(names) for batch in produce(batches) if batch.num_rows]
        table = pa.Table.from_batches(keys) if keys else None
        rows = 0 if table is None else table.num_rows
        chunk = b""
        if table is not None:
            chosen = np.random.default_rng(task).choice(rows, min(rows, share), replace=False)
            chunk = to_ipc_stream(table.take(arrow_array(chosen)))
        yield pa.record_batch(
            {
                "task": longs([task]),
                "rows": longs([rows]),
                "chunk": bytes_array([chunk]),
            }
        )

    # A result's tasks are known; elsewhere each task keeps up to 3 x ``wanted``.
    share = max(1, -(-3 * wanted // max(1, tasks.number_of_tasks or 1)))
    description = f"sample of {', '.join(names)} from {tasks.description}"
    with JobLabel(tasks.frame.sparkSession, description):
        try:
            reports = tasks.frame.mapInArrow(sample, "task long, rows long, chunk binary").collect()
        except Exception as error:
            raise stage_failure(description, error) from error
    total = sum(int(report["rows"]) for report in reports)
    pieces = []
    for report in reports:
        if not report["rows"]:
            continue
        table = from_ipc_stream(bytes(report["chunk"]))
        take = min(table.num_rows, -(-wanted * int(report["rows"]) // total))
        pieces.append(table.slice(0, take))
    return pa.concat_tables(pieces) if pieces else schema.empty_table()
