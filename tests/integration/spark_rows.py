"""Comparing Spark results as Spark does: row multisets (NaN equal to NaN, -0.0 to 0.0)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark import TaskContext

from pyspark_shuffle.spark.compat import collected_arrow

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def canonical(value: object) -> Hashable:
    if isinstance(value, float) and math.isnan(value):
        return ("NaN",)
    if isinstance(value, float) and value == 0.0:
        return 0.0
    if isinstance(value, list | tuple):
        return tuple(canonical(each) for each in value)
    if isinstance(value, dict):
        return tuple((key, canonical(each)) for key, each in value.items())
    return value


def rows_of(frame: DataFrame) -> list[dict[str, Any]]:
    """The rows in the DataFrame's order, through Arrow (fast for lists and decimals)."""
    rows: list[dict[str, Any]] = collected_arrow(frame).to_pylist()
    return rows


def rows_per_partition(frame: DataFrame) -> list[int]:
    """The rows of each partition, empty ones too (by Python tasks: works under Spark
    Connect, which has no ``rdd``)."""

    def count(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task = TaskContext.get()
        assert task is not None
        rows = sum(batch.num_rows for batch in batches)
        yield pa.record_batch({"partition": [task.partitionId()], "rows": [rows]})

    counted = frame.mapInArrow(count, "partition long, rows long").collect()
    return [row["rows"] for row in sorted(counted, key=lambda row: row["partition"])]


def partitions_of(frame: DataFrame) -> int:
    return len(rows_per_partition(frame))


def multiset(frame: DataFrame) -> Counter[Hashable]:
    return Counter(canonical(row) for row in rows_of(frame))


def handed_to_python(frame: DataFrame) -> pa.Table:
    """The rows as Spark hands them to Python (``mapInArrow``), in the DataFrame's order.
    Not ``toArrow``: PySpark 4.3's casts its table to the schema, which pyarrow refuses for a
    null struct with a non-null field."""

    def as_ipc(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task = TaskContext.get()
        assert task is not None
        for number, batch in enumerate(batches):
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, batch.schema) as writer:
                writer.write_batch(batch)
            yield pa.record_batch(
                {
                    "task": [task.partitionId()],
                    "number": [number],
                    "ipc": [sink.getvalue().to_pybytes()],
                }
            )

    chunks = frame.mapInArrow(as_ipc, "task long, number long, ipc binary").collect()
    chunks.sort(key=lambda row: (row["task"], row["number"]))
    batches = [pa.ipc.open_stream(bytes(row["ipc"])).read_next_batch() for row in chunks]
    return pa.Table.from_batches(batches) if batches else pa.table({})


def handed_rows(frame: DataFrame) -> list[Hashable]:
    """:func:`handed_to_python`'s rows, canonical (a map's entries in no order: Spark keeps
    the order a map was built in, which for binary keys differs each time a row is read),
    in order."""
    return canonical_rows(handed_to_python(frame))


def canonical_rows(table: pa.Table) -> list[Hashable]:
    """The table's rows, canonical as :func:`handed_rows` makes them, in order."""
    row_type = pa.struct(list(table.schema))
    return [_canonical_of(row, row_type) for row in table.to_pylist()]


def _canonical_of(value: Any, data_type: pa.DataType) -> Hashable:
    if value is None:
        return None
    if pa.types.is_map(data_type):
        entries = [
            (_canonical_of(key, data_type.key_type), _canonical_of(item, data_type.item_type))
            for key, item in value
        ]
        return ("map", tuple(sorted(entries, key=repr)))
    if pa.types.is_struct(data_type):
        return tuple(
            (field.name, _canonical_of(value[field.name], field.type)) for field in data_type
        )
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        return tuple(_canonical_of(each, data_type.value_type) for each in value)
    return canonical(value)


def ordered(frame: DataFrame) -> list[Hashable]:
    return [canonical(row) for row in rows_of(frame)]
