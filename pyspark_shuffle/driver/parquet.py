"""Parquet in and out, by pyarrow in the tasks, so that rows never cross the JVM.

A source is a DataFrame that Spark reads as usual, but that the map tasks of a pyshuffle
operation read themselves (only the needed columns, row groups pruned by their statistics,
split across tasks by size). A sink writes a result from its reduce tasks: each task attempt
stages its files apart, and the driver commits the attempt Spark reports for each task, once,
then writes ``_SUCCESS`` (as Spark's file committer does)."""

from __future__ import annotations

import operator
import os
import pickle
import posixpath
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import fsspec
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 (Spark's own spelling)
from pyspark.sql.types import StructType

from pyspark_shuffle.driver.inputs import MapInput, RowTasks
from pyspark_shuffle.spark.link import SparkLink
from shuffle_api import InvalidOperationError
from shuffle_runtime.batches import conform, nullable_inside

if TYPE_CHECKING:
    # Imported where a parquet job runs, not with pyshuffle: pyarrow.dataset imports pandas
    # (some 27 MiB in every Python worker that has no use for it).
    import pyarrow.dataset as ds

__all__ = ["WRITE_MODES", "ParquetFilter", "ParquetInput", "ParquetSink", "ParquetSource"]

Predicate = tuple[str, str, Any]
ParquetFilter = Sequence[Predicate] | Sequence[Sequence[Predicate]]
"""pyarrow.parquet's ``filters``: ``(column, op, value)`` predicates ANDed together, or a list
of such lists ORed (disjunctive normal form). ``op``: ``=``, ``==``, ``!=``, ``<``, ``<=``,
``>``, ``>=``, ``in``, ``not in``."""

_COMPARISONS: Final[dict[str, Callable[[Any, Any], Any]]] = {
    "=": operator.eq,
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_MEMBERSHIP: Final = ("in", "not in")


def _disjunction(filters: ParquetFilter | None) -> tuple[tuple[Predicate, ...], ...]:
    """``filters`` as ORed tuples of ANDed predicates, each checked."""
    if not filters:
        return ()
    first = filters[0]
    nested = isinstance(first, list | tuple) and bool(first) and isinstance(first[0], list | tuple)
    conjunctions = [list(term) for term in filters] if nested else [list(filters)]
    checked = []
    for conjunction in conjunctions:
        predicates = []
        for predicate in conjunction:
            if not isinstance(predicate, list | tuple) or len(predicate) != 3:
                raise InvalidOperationError(
                    f"filter predicate {predicate!r} is not (column, op, value)"
                )
            name, op, value = predicate
            if op not in _COMPARISONS and op not in _MEMBERSHIP:
                raise InvalidOperationError(
                    f"filter op {op!r} of {predicate!r}: one of {[*_COMPARISONS, *_MEMBERSHIP]}"
                )
            if op in _MEMBERSHIP and isinstance(value, str | bytes):
                raise InvalidOperationError(f"filter {predicate!r}: 'in' takes a collection")
            predicates.append((str(name), str(op), list(value) if op in _MEMBERSHIP else value))
        checked.append(tuple(predicates))
    return tuple(checked)


def _combine(terms: Sequence[Any], join: Callable[[Any, Any], Any]) -> Any:
    combined = terms[0]
    for term in terms[1:]:
        combined = join(combined, term)
    return combined


def _arrow_predicate(name: str, op: str, value: Any) -> ds.Expression:
    import pyarrow.dataset as ds  # noqa: PLC0415 (see above)

    field = ds.field(name)
    if op == "in":
        return field.isin(value)
    if op == "not in":
        # As Spark's NOT IN: a null is in no set and out of none (the row is dropped).
        return ~field.isin(value) & field.is_valid()
    expression: ds.Expression = _COMPARISONS[op](field, value)
    return expression


def _spark_predicate(name: str, op: str, value: Any) -> Column:
    column = F.col(name)
    if op in _MEMBERSHIP:
        member = column.isin(value)
        return member if op == "in" else ~member
    condition: Column = _COMPARISONS[op](column, F.lit(value))
    return condition


def _arrow_filesystem(url: str) -> tuple[pafs.FileSystem, str]:
    """pyarrow's filesystem for an fsspec URL (native for local paths), and the path in it."""
    filesystem, path = fsspec.core.url_to_fs(url)
    if isinstance(filesystem, LocalFileSystem):
        return pafs.LocalFileSystem(), os.path.abspath(path)
    return pafs.PyFileSystem(pafs.FSSpecHandler(filesystem)), path


@dataclass(frozen=True, slots=True)
class ParquetSource:
    """Parquet files to read: a directory (Hive-style ``key=value`` subdirectories become
    columns, as Spark discovers them) or files, any fsspec URL."""

    paths: tuple[str, ...]
    columns: tuple[str, ...] | None
    filters: tuple[tuple[Predicate, ...], ...]

    @classmethod
    def of(
        cls,
        path: str | Sequence[str],
        columns: Sequence[str] | None = None,
        filters: ParquetFilter | None = None,
    ) -> ParquetSource:
        paths = (path,) if isinstance(path, str) else tuple(path)
        if not paths:
            raise InvalidOperationError("read_parquet needs at least one path")
        return cls(paths, None if columns is None else tuple(columns), _disjunction(filters))

    def frame(self, spark: SparkSession) -> DataFrame:
        """The source as an ordinary DataFrame: what Spark itself reads."""
        frame = spark.read.parquet(*self.paths)
        known = set(frame.columns)
        wanted = [name for conjunction in self.filters for name, _, _ in conjunction]
        for name in [*wanted, *(self.columns or ())]:
            if name not in known:
                raise InvalidOperationError(
                    f"read_parquet: no column {name!r} in {list(self.paths)};"
                    f" columns: {frame.columns}"
                )
        if self.filters:
            frame = frame.filter(self.spark_condition())
        return frame if self.columns is None else frame.select(*self.columns)

    def spark_condition(self) -> Column:
        terms = [
            _combine([_spark_predicate(*predicate) for predicate in conjunction], operator.and_)
            for conjunction in self.filters
        ]
        condition: Column = _combine(terms, operator.or_)
        return condition

    def arrow_condition(self) -> ds.Expression | None:
        if not self.filters:
            return None
        terms = [
            _combine([_arrow_predicate(*predicate) for predicate in conjunction], operator.and_)
            for conjunction in self.filters
        ]
        condition: ds.Expression = _combine(terms, operator.or_)
        return condition

    def dataset(self) -> ds.Dataset:
        import pyarrow.dataset as ds  # noqa: PLC0415 (see above)

        systems = [_arrow_filesystem(path) for path in self.paths]
        filesystem = systems[0][0]
        # Spark writes timestamps as INT96 by default: read them as microseconds, as Spark
        # does (as nanoseconds, Arrow's default, years before 1677 or after 2262 overflow).
        parquet = ds.ParquetFileFormat(
            read_options=ds.ParquetReadOptions(coerce_int96_timestamp_unit="us")
        )
        if len(systems) == 1:
            return ds.dataset(
                systems[0][1], filesystem=filesystem, format=parquet, partitioning="hive"
            )
        # Files named one by one: no partition discovery (as Spark without basePath).
        return ds.dataset([path for _, path in systems], filesystem=filesystem, format=parquet)


@dataclass(frozen=True, slots=True)
class _RowGroup:
    fragment: ds.ParquetFileFragment
    size: int
    uncompressed_size: int


def _row_groups(
    dataset: ds.Dataset, condition: ds.Expression | None, columns: set[str]
) -> list[_RowGroup]:
    """Every row group the condition may match (by its statistics), with the compressed and
    uncompressed bytes of the columns read from it."""
    found = []
    for fragment in dataset.get_fragments():
        metadata = fragment.metadata
        for piece in fragment.split_by_row_group(condition, schema=dataset.schema):
            (group,) = piece.row_groups
            chunks = metadata.row_group(group.id)
            read = [
                chunks.column(index)
                for index in range(chunks.num_columns)
                if chunks.column(index).path_in_schema.split(".")[0] in columns
            ]
            found.append(
                _RowGroup(
                    piece,
                    sum(chunk.total_compressed_size for chunk in read),
                    sum(chunk.total_uncompressed_size for chunk in read),
                )
            )
    return found


def split_by_size(sizes: Sequence[int], max_split: int, open_cost: int) -> list[list[int]]:
    """Indexes of ``sizes`` packed into tasks as Spark packs file splits: largest first, a task
    closed when the next piece would take it over ``max_split`` (each piece costs
    ``open_cost`` more)."""
    tasks: list[list[int]] = []
    current: list[int] = []
    filled = 0
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        if current and filled + sizes[index] > max_split:
            tasks.append(current)
            current, filled = [], 0
        current.append(index)
        filled += sizes[index] + open_cost
    if current:
        tasks.append(current)
    return tasks


class _FragmentReader:
    """Inside a map task: reads the row groups named by its one input row, as batches of the
    Arrow schema Spark would have handed over for the same rows."""

    def __init__(
        self, dataset_schema: pa.Schema, condition: ds.Expression | None, target: pa.Schema
    ) -> None:
        self._dataset_schema = dataset_schema
        self._condition = condition
        self._target = target

    def read(self, tasks: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for task in tasks:
            for encoded in task.column("row_groups").to_pylist():
                yield from self.read_fragments(pickle.loads(encoded))

    def read_fragments(
        self, fragments: Sequence[ds.ParquetFileFragment]
    ) -> Iterator[pa.RecordBatch]:
        import pyarrow.dataset as ds  # noqa: PLC0415 (see above)

        for fragment in fragments:
            scanner = ds.Scanner.from_fragment(
                fragment,
                schema=self._dataset_schema,
                columns=self._target.names,
                filter=self._condition,
            )
            for batch in scanner.to_batches():
                if batch.num_rows:
                    yield self._conform(batch)

    def _conform(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        # Spark's types for the same column (hive partition values inferred narrower, say, or
        # nanosecond timestamps, which Spark truncates to microseconds).
        return conform(batch, self._target, safe=False)


class ParquetInput(MapInput):
    """A :class:`ParquetSource` read by the map tasks: one task per split of its row groups."""

    def __init__(
        self,
        link: SparkLink,
        source: ParquetSource,
        frame_schema: StructType,
        arrow_schema: pa.Schema,
    ) -> None:
        self._link = link
        self._schema = frame_schema
        self._arrow_schema = arrow_schema
        dataset = source.dataset()
        self._dataset_schema = dataset.schema
        self._condition = source.arrow_condition()
        groups = _row_groups(dataset, self._condition, set(arrow_schema.names))
        open_cost = link.sql_bytes("spark.sql.files.openCostInBytes")
        total = sum(group.size + open_cost for group in groups)
        # Spark's FilePartition.maxSplitBytes: every core gets a task, none past the maximum.
        max_split = min(
            link.sql_bytes("spark.sql.files.maxPartitionBytes"),
            max(open_cost, total // link.default_parallelism()),
        )
        splits = split_by_size([group.size for group in groups], max_split, open_cost)
        self._tasks = [[groups[index].fragment for index in split] for split in splits] or [[]]
        # What Parquet says the columns read take decoded (its dictionaries still encoded).
        self.uncompressed_bytes = sum(group.uncompressed_size for group in groups)

    @property
    def schema(self) -> StructType:
        return self._schema

    @property
    def number_of_maps(self) -> int:
        return len(self._tasks)

    def row_tasks(self) -> RowTasks:
        pickled = [pickle.dumps(task) for task in self._tasks]
        spark = self._link.spark
        if self._link.connect:
            # Task i's row groups carried in the plan: row i of a literal array.
            groups = F.array(*(F.lit(each) for each in pickled))
            frame = spark.range(0, len(pickled), 1, len(pickled)).select(
                F.element_at(groups, F.col("id").cast("int") + 1).alias("row_groups")
            )
        else:
            rows = spark.sparkContext.parallelize([(each,) for each in pickled], len(pickled))
            frame = spark.createDataFrame(rows, "row_groups binary")
        return RowTasks(frame, self._reader().read, "Parquet source", len(pickled))

    def read_table(self) -> pa.Table:
        """Every row, read here (in the driver) rather than by map tasks: for a side small
        enough to broadcast, a Spark job costs more than the read."""
        fragments = [fragment for task in self._tasks for fragment in task]
        return pa.Table.from_batches(
            list(self._reader().read_fragments(fragments)), schema=self._arrow_schema
        )

    def _reader(self) -> _FragmentReader:
        return _FragmentReader(self._dataset_schema, self._condition, self._arrow_schema)


WRITE_MODES: Final = ("error", "errorifexists", "overwrite", "append", "ignore")
"""As Spark's ``DataFrameWriter.mode``."""
WRITE_REPORT_SCHEMA: Final = "task long, attempt string, files array<string>, rows long"
"""The one row each writing task returns (Spark DDL): the files it staged, relative paths."""
STAGING_DIRECTORY: Final = "_temporary"
SUCCESS_MARKER: Final = "_SUCCESS"


# Where Spark keeps the Spark schema of what it wrote, in a Parquet file's footer: Spark reads
# the types Parquet has no name for (intervals, void, char) back from it.
SPARK_SCHEMA_KEY: Final = "org.apache.spark.sql.parquet.row.metadata"


@dataclass(frozen=True, slots=True)
class ParquetSink:
    """One write of a result as Parquet files under ``url`` (Hive-style directories by
    ``partition_by``), staged per task attempt under ``_temporary/<job id>``. ``schema``:
    the rows' Arrow schema; the files also carry ``spark_schema``, as Spark's own do."""

    url: str
    partition_by: tuple[str, ...]
    job_id: str
    rows_schema: pa.Schema
    spark_schema: StructType
    compression: str

    @property
    def schema(self) -> pa.Schema:
        """What the files are written with: the rows' schema, nested fields nullable (Arrow's
        Parquet writer refuses the nulls a null struct hides in a non-null field; Spark reads
        every field as nullable anyway), with the Spark schema of the columns a file holds
        (not those its directory names)."""
        in_files = [f for f in self.spark_schema.fields if f.name not in self.partition_by]
        schema = nullable_inside(self.rows_schema)
        return schema.with_metadata({SPARK_SCHEMA_KEY: StructType(in_files).json()})

    @property
    def staging_url(self) -> str:
        return f"{self.url.rstrip('/')}/{STAGING_DIRECTORY}/{self.job_id}"

    def write_task(
        self, task: int, attempt: str, batches: Iterator[pa.RecordBatch]
    ) -> pa.RecordBatch:
        """Inside a task: stage ``batches`` under this attempt's own directory; the report."""
        import pyarrow.dataset as ds  # noqa: PLC0415 (see above)

        filesystem, root = _arrow_filesystem(f"{self.staging_url}/{attempt}")
        staged: list[str] = []
        rows = 0
        schema = self.schema

        def conformed() -> Iterator[pa.RecordBatch]:
            nonlocal rows
            for batch in batches:
                if batch.num_rows:
                    rows += batch.num_rows
                    yield conform(batch, schema)

        partitioning = None
        if self.partition_by:
            fields = [schema.field(name) for name in self.partition_by]
            partitioning = ds.partitioning(pa.schema(fields), flavor="hive")
        ds.write_dataset(
            conformed(),
            root,
            schema=schema,
            format="parquet",
            filesystem=filesystem,
            partitioning=partitioning,
            basename_template=f"part-{task:05d}-{self.job_id}-{{i}}.parquet",
            existing_data_behavior="overwrite_or_ignore",
            file_options=ds.ParquetFileFormat().make_write_options(compression=self.compression),
            max_partitions=1 << 20,
            file_visitor=lambda written: staged.append(written.path),
        )
        return pa.record_batch(
            {
                "task": pa.array([task], pa.int64()),
                "attempt": pa.array([attempt]),
                "files": pa.array([[posixpath.relpath(path, root) for path in staged]]),
                "rows": pa.array([rows], pa.int64()),
            }
        )

    def existing(self) -> bool:
        filesystem, root = fsspec.core.url_to_fs(self.url)
        return bool(filesystem.exists(root))

    def commit(self, reports: Sequence[tuple[int, str, Sequence[str]]], *, overwrite: bool) -> int:
        """Move the staged files of the one attempt Spark reports per task into place (first
        deleting what was there, with ``overwrite``), drop the staging directory, write
        ``_SUCCESS``; the number of files committed."""
        filesystem, root = fsspec.core.url_to_fs(self.url)
        _, staging = fsspec.core.url_to_fs(self.staging_url)
        if overwrite and filesystem.exists(root):
            for entry in filesystem.ls(root, detail=False):
                if posixpath.basename(entry.rstrip("/")) != STAGING_DIRECTORY:
                    filesystem.rm(entry, recursive=True)
        committed = 0
        for _, attempt, files in sorted(reports):
            for relative in files:
                target = posixpath.join(root, relative)
                filesystem.makedirs(posixpath.dirname(target), exist_ok=True)
                filesystem.mv(posixpath.join(staging, attempt, relative), target)
                committed += 1
        if not committed and not self.partition_by:
            # No rows at all: one empty file still says what the columns are.
            filesystem.makedirs(root, exist_ok=True)
            empty = posixpath.join(root, f"part-00000-{self.job_id}-0.parquet")
            with filesystem.open(empty, "wb") as out:
                pq.write_table(self.schema.empty_table(), out, compression=self.compression)
        self.abort()
        filesystem.touch(posixpath.join(root, SUCCESS_MARKER))
        return committed

    def abort(self) -> None:
        """Delete what this write staged (and the staging parent once empty)."""
        filesystem, staging = fsspec.core.url_to_fs(self.staging_url)
        if filesystem.exists(staging):
            filesystem.rm(staging, recursive=True)
        parent = posixpath.dirname(staging)
        if filesystem.exists(parent) and not filesystem.ls(parent, detail=False):
            filesystem.rm(parent, recursive=True)
