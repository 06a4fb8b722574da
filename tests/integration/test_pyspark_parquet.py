"""Parquet in and out of pyshuffle operations in a real local Spark session, on the default service:
``read_parquet`` (columns, filters, Hive partitions, splits by size) read by the map tasks,
``write_parquet`` committed once per task (a retried task and a killed Python worker leave no
duplicate and nothing staged), and ``to_arrow``, each against what Spark itself reads,
writes or collects from the same files."""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Hashable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from pyspark_shuffle import SparkShuffle
from shuffle_api import InvalidOperationError, StageFailedError
from tests.integration.services import DEFAULT_SERVICE_ONLY
from tests.integration.spark_rows import canonical, multiset, ordered

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = DEFAULT_SERVICE_ONLY

ROWS = 20_000


@pytest.fixture(scope="module")
def events(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A Parquet dataset as Spark writes it: Hive partitions by ``cat``, several files, small
    row groups (so statistics can prune), nulls in a key and in a payload."""
    path = str(tmp_path_factory.mktemp("events") / "events")
    frame = spark.range(0, ROWS, 1, 4).selectExpr(
        "id",
        "case when id % 13 = 0 then null else id % 97 end as user",
        "cast(id % 5 as int) as cat",
        "cast(id * 0.25 as double) as amount",
        "case when id % 7 = 0 then null else concat('text-', id % 31) end as note",
        "timestamp_seconds(1700000000 + id * 60) as at",
    )
    frame.write.option("parquet.block.size", 32 * 1024).partitionBy("cat").parquet(path)
    return path


def _spark_read(spark: SparkSession, path: str) -> DataFrame:
    return spark.read.parquet(path)


def _group_count(table: pa.Table) -> pa.Table:
    return pa.table(
        {
            "user": table["user"][:1],
            "rows": pa.array([table.num_rows], pa.int64()),
            "amount": pa.array([pc.sum(table["amount"]).as_py()], pa.float64()),
        }
    )


GROUP_SCHEMA = "user long, rows long, amount double"


def _spark_group_count(frame: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F  # noqa: N812, PLC0415

    return frame.groupBy("user").agg(
        F.count("*").alias("rows"), F.sum("amount").cast("double").alias("amount")
    )


# -- read_parquet -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("columns", "filters"),
    [
        (None, None),
        (["user", "amount", "cat"], [("amount", ">=", 1000.0), ("cat", "in", [1, 3])]),
        (["user", "amount"], [[("user", "<", 10)], [("note", "not in", ["text-1", "text-2"])]]),
        (["user", "amount", "note"], [("note", "!=", "text-5"), ("cat", "=", 4)]),
    ],
    ids=["everything", "and-in", "or-not-in", "ne-partition"],
)
def test_read_parquet_gives_the_rows_spark_reads(
    shuffle: SparkShuffle,
    spark: SparkSession,
    events: str,
    columns: list[str] | None,
    filters: Any,
) -> None:
    source = shuffle.read_parquet(events, columns=columns, filter=filters)
    expected = multiset(source)  # used by Spark: its own read, filter and select
    reference = _spark_read(spark, events)
    assert source.schema == (reference if columns is None else reference.select(*columns)).schema
    result = shuffle.repartition(source, "user", num_partitions=3)
    assert result.schema == source.schema
    assert multiset(result) == expected
    assert shuffle.statistics(result).rows_written == sum(expected.values())


def test_a_source_feeds_group_apply_sort_and_join(
    shuffle: SparkShuffle, spark: SparkSession, events: str
) -> None:
    source = shuffle.read_parquet(events, columns=["id", "user", "amount", "cat"])
    plain = _spark_read(spark, events).select("id", "user", "amount", "cat")
    grouped = shuffle.group_apply(source, "user", _group_count, GROUP_SCHEMA)
    assert multiset(grouped) == multiset(_spark_group_count(plain))
    ordered_rows = shuffle.sort(source, ["amount", "id"], ascending=[False, True])
    assert ordered(ordered_rows) == ordered(plain.orderBy(plain.amount.desc(), plain.id))
    users = spark.range(0, 50).selectExpr("id as user", "concat('u', id) as name")
    joined = shuffle.join(source, users, "user", "left")
    assert multiset(joined) == multiset(plain.join(users, "user", "left"))


def test_the_map_tasks_split_the_row_groups_by_size(
    shuffle: SparkShuffle, spark: SparkSession, events: str
) -> None:
    key = "spark.sql.files.maxPartitionBytes"
    spark.conf.set(key, str(16 * 1024))
    try:
        small = shuffle.repartition(shuffle.read_parquet(events), "user", num_partitions=2)
        many = shuffle.statistics(small).map_tasks
    finally:
        spark.conf.unset(key)
    whole = shuffle.repartition(shuffle.read_parquet(events), "user", num_partitions=2)
    files = [name for _, _, names in os.walk(events) for name in names if name.endswith(".parquet")]
    # One task per row group when each may hold 16 kB; a few for the whole (every core one).
    assert many >= len(files) > shuffle.statistics(whole).map_tasks >= 2
    assert multiset(small) == multiset(whole) == multiset(_spark_read(spark, events))


def test_a_filter_that_prunes_every_row_group_gives_no_rows(
    shuffle: SparkShuffle, events: str
) -> None:
    source = shuffle.read_parquet(events, filter=[("amount", "<", -1.0)])
    result = shuffle.group_apply(source, "user", _group_count, GROUP_SCHEMA)
    assert result.count() == 0
    assert shuffle.statistics(result).rows_written == 0


def test_a_source_changed_by_spark_is_an_ordinary_input(
    shuffle: SparkShuffle, spark: SparkSession, events: str
) -> None:
    changed = shuffle.read_parquet(events).filter("id % 2 = 0").selectExpr("*", "amount * 2 as x")
    plain = _spark_read(spark, events).filter("id % 2 = 0").selectExpr("*", "amount * 2 as x")
    assert multiset(shuffle.repartition(changed, "user", num_partitions=2)) == multiset(plain)


@pytest.mark.parametrize(
    ("kwargs", "complaint"),
    [
        ({"columns": ["nope"]}, "no column 'nope'"),
        ({"filter": [("nope", "=", 1)]}, "no column 'nope'"),
        ({"filter": [("user", "~", 1)]}, "filter op '~'"),
        ({"filter": [("user", "in", "abc")]}, "'in' takes a collection"),
        ({"filter": [("user", 1)]}, "not (column, op, value)"),
    ],
)
def test_read_parquet_refuses_bad_arguments(
    shuffle: SparkShuffle, events: str, kwargs: dict[str, Any], complaint: str
) -> None:
    with pytest.raises(
        InvalidOperationError, match=complaint.replace("(", r"\(").replace(")", r"\)")
    ):
        shuffle.read_parquet(events, **kwargs)


# -- to_arrow -----------------------------------------------------------------------------------


def test_to_arrow_equals_spark_to_arrow(
    shuffle: SparkShuffle, spark: SparkSession, events: str
) -> None:
    source = shuffle.read_parquet(events)
    ordered_result = shuffle.sort(source, ["user", "id"])
    table = shuffle.to_arrow(ordered_result)
    assert table.schema == ordered_result.toArrow().schema
    assert table.to_pylist() == ordered_result.toArrow().to_pylist()
    assert shuffle.to_arrow(source).sort_by("id").equals(source.toArrow().sort_by("id"))


# -- write_parquet ------------------------------------------------------------------------------


def _files(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file())


def _written(spark: SparkSession, path: Path, columns: list[str]) -> Counter[Hashable]:
    return multiset(spark.read.parquet(str(path)).select(*columns))


def test_write_parquet_writes_what_spark_reads_back(
    shuffle: SparkShuffle, spark: SparkSession, events: str, tmp_path: Path
) -> None:
    source = shuffle.read_parquet(events)
    grouped = shuffle.group_apply(source, "user", _group_count, GROUP_SCHEMA)
    out = tmp_path / "by-user"
    written = shuffle.write_parquet(grouped, str(out))
    assert written == len([f for f in _files(out) if f.suffix == ".parquet"]) > 0
    assert (out / "_SUCCESS").is_file()
    assert not (out / "_temporary").exists()
    assert _written(spark, out, ["user", "rows", "amount"]) == multiset(grouped)


def test_write_parquet_partitions_as_spark_does(
    shuffle: SparkShuffle, spark: SparkSession, events: str, tmp_path: Path
) -> None:
    source = shuffle.read_parquet(events)
    result = shuffle.repartition(source, "user", num_partitions=3)
    ours, spark_own = tmp_path / "ours", tmp_path / "spark"
    shuffle.write_parquet(result, str(ours), partition_by=["cat"])
    result.write.partitionBy("cat").parquet(str(spark_own))

    def visible(path: Path) -> list[str]:  # Hadoop's .crc files aside
        return sorted(p.name for p in path.iterdir() if not p.name.startswith("."))

    assert visible(ours) == visible(spark_own)
    assert _written(spark, ours, source.columns) == _written(spark, spark_own, source.columns)


def test_write_modes_are_sparks(
    shuffle: SparkShuffle, spark: SparkSession, events: str, tmp_path: Path
) -> None:
    source = shuffle.read_parquet(events, columns=["id", "user"], filter=[("id", "<", 100)])
    out = tmp_path / "modes"
    shuffle.write_parquet(source, str(out))
    once = _written(spark, out, ["id", "user"])
    with pytest.raises(InvalidOperationError, match="already exists"):
        shuffle.write_parquet(source, str(out))
    assert shuffle.write_parquet(source, str(out), mode="ignore") == 0
    assert _written(spark, out, ["id", "user"]) == once
    shuffle.write_parquet(source, str(out), mode="append")
    assert _written(spark, out, ["id", "user"]) == once + once
    shuffle.write_parquet(source, str(out), mode="overwrite")
    assert _written(spark, out, ["id", "user"]) == once
    with pytest.raises(InvalidOperationError, match="write mode 'replace'"):
        shuffle.write_parquet(source, str(out), mode="replace")
    with pytest.raises(InvalidOperationError, match="no column 'nope'"):
        shuffle.write_parquet(source, str(out), partition_by="nope", mode="overwrite")


def _fail_first_attempts(marker_directory: Path, how: str):  # type: ignore[no-untyped-def]
    """A group function that, in each reducer's first attempt, returns some groups and then
    fails (``raise``) or kills its Python worker (``kill``)."""

    def function(table: pa.Table) -> pa.Table:
        from pyspark import TaskContext  # noqa: PLC0415

        task = TaskContext.get()
        assert task is not None
        marker = marker_directory / f"reducer-{task.partitionId()}"
        if task.attemptNumber() == 0:
            seen = int(marker.read_text()) if marker.exists() else 0
            marker.write_text(str(seen + 1))
            if seen == 3:  # after three groups went to the staged file
                if how == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                raise RuntimeError("first attempt fails half-way (as asked)")
        return _group_count(table)

    return function


@pytest.mark.parametrize("how", ["raise", "kill"])
def test_a_retried_task_leaves_no_duplicate_and_nothing_staged(
    shuffle: SparkShuffle, spark: SparkSession, events: str, tmp_path: Path, how: str
) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    source = shuffle.read_parquet(events)
    flaky = shuffle.group_apply(
        source, "user", _fail_first_attempts(markers, how), GROUP_SCHEMA, num_partitions=2
    )
    out = tmp_path / "out"
    shuffle.write_parquet(flaky, str(out))
    assert sorted(int(m.read_text()) for m in markers.iterdir()) == [4, 4], "each failed once"
    plain = _spark_read(spark, events)
    assert _written(spark, out, ["user", "rows", "amount"]) == multiset(_spark_group_count(plain))
    assert not (out / "_temporary").exists()
    assert (out / "_SUCCESS").is_file()


def test_a_write_that_fails_commits_nothing(
    shuffle: SparkShuffle, events: str, tmp_path: Path
) -> None:
    def always_fails(table: pa.Table) -> pa.Table:
        raise ValueError("this function never works (as asked)")

    source = shuffle.read_parquet(events)
    failing = shuffle.group_apply(source, "user", always_fails, GROUP_SCHEMA)
    out = tmp_path / "out"
    with pytest.raises(StageFailedError, match="never works"):
        shuffle.write_parquet(failing, str(out))
    assert not out.exists() or _files(out) == []


def test_an_empty_result_writes_one_file_with_its_columns(
    shuffle: SparkShuffle, spark: SparkSession, events: str, tmp_path: Path
) -> None:
    source = shuffle.read_parquet(events, filter=[("id", "<", 0)])
    result = shuffle.repartition(source, "user", num_partitions=2)
    out = tmp_path / "empty"
    assert shuffle.write_parquet(result, str(out)) == 0
    (data_file,) = [f for f in _files(out) if f.suffix == ".parquet"]
    assert pq.read_schema(data_file).names == source.columns
    assert spark.read.parquet(str(out)).count() == 0
    assert spark.read.parquet(str(out)).columns == source.columns


def test_parquet_round_trip_without_spark_reading_rows(
    shuffle: SparkShuffle, spark: SparkSession, events: str, tmp_path: Path
) -> None:
    # read -> group -> write entirely in the tasks; the driver then checks with pyarrow.
    out = tmp_path / "round-trip"
    grouped = shuffle.group_apply(shuffle.read_parquet(events), "user", _group_count, GROUP_SCHEMA)
    shuffle.write_parquet(grouped, str(out))
    table = pq.read_table(str(out))
    plain = _spark_group_count(_spark_read(spark, events))
    assert Counter(canonical(r) for r in table.to_pylist()) == multiset(plain)
