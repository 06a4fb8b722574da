"""Every operation once, with Spark's own result beside it, and one failure recovered: the
subset that ``make spark-versions`` runs on each older Spark release (and ``make test`` on
the newest, classic and Connect). Here both services run on an object store too (moto's S3
server standing in): the default service's storage, and the external workers' stores."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F  # noqa: N812 (Spark's own spelling)
from pyspark.sql.pandas.functions import pandas_udf

from external_shuffle.local_cluster import LocalCluster
from pyspark_shuffle import SparkShuffle, enable, pandas_function
from pyspark_shuffle.options import DROPIN_MIN_INPUT_SIZE
from shuffle_api import InvalidOperationError, new_id
from tests.integration.services import (
    ShuffleService,
    external_service,
    netty_service,
    object_store_service,
)
from tests.integration.spark_rows import multiset, ordered, partitions_of

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

ROWS = 6_000


@pytest.fixture(
    scope="module", params=["netty_like", "external_shuffle", "s3_default", "s3_external"]
)
def service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ShuffleService]:
    """The two services on local stores, then on an object store (``s3_*``: not named after
    the services, so that ``-k netty_like`` runs the default service's local case alone)."""
    name = str(request.param)
    if name == "netty_like":
        yield netty_service(tmp_path_factory.mktemp("store"))
        return
    store_url = ""
    if name.startswith("s3_"):
        bucket = f"every-operation-{new_id()}"
        request.getfixturevalue("s3_stand_in").make_bucket(bucket)
        store_url = f"s3://{bucket}/shuffle"
    if name == "s3_default":
        yield object_store_service(name, store_url, None)
        return
    with LocalCluster(
        tmp_path_factory.mktemp("cluster"), workers=2, store_root=store_url or None
    ) as cluster:
        yield (
            object_store_service(name, store_url, cluster)
            if store_url
            else external_service(cluster)
        )


@pytest.fixture(scope="module")
def events(spark: SparkSession) -> DataFrame:
    return spark.range(0, ROWS, 1, 3).selectExpr(
        "id",
        "case when id % 11 = 0 then null else id % 29 end as k",
        "cast(id % 7 as double) * 1.5 as amount",
        "concat('e', id) as name",
    )


@pytest.fixture(scope="module")
def users(spark: SparkSession) -> DataFrame:
    return spark.range(0, 40, 1, 2).selectExpr("id as k", "concat('user', id) as user")


def _totals(table: pa.Table) -> pa.Table:
    grouped = table.group_by("k").aggregate([("amount", "sum"), ("id", "count")])
    return grouped.select(["k", "amount_sum", "id_count"]).rename_columns(["k", "total", "n"])


def _spark_totals(events: DataFrame) -> DataFrame:
    return events.groupBy("k").agg(F.sum("amount").alias("total"), F.count("id").alias("n"))


def _doubled(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        yield pa.record_batch([batch["id"], pc.multiply(batch["amount"], 2)], ["id", "twice"])


def test_many_small_partitions_are_read_in_two_map_tasks_a_core(
    shuffle: SparkShuffle, spark: SparkSession
) -> None:
    """By Spark's estimate of the input's size (a Connect client's, as its explain prints it):
    40 partitions of some 100 KiB in all are read by two map tasks for each of the 2 cores."""
    data = spark.range(0, ROWS, 1, 40).selectExpr("id % 13 as k", "id")
    result = shuffle.repartition(data, "k", num_partitions=3)
    assert multiset(result) == multiset(data)
    assert shuffle.statistics(result).map_tasks == 4


def test_repartition_rebalance_and_repartition_map(
    shuffle: SparkShuffle, events: DataFrame
) -> None:
    result = shuffle.repartition(events, "k", num_partitions=4)
    assert partitions_of(result) == 4
    assert multiset(result) == multiset(events)
    statistics = shuffle.statistics(result)
    assert (statistics.map_tasks, statistics.reducers, statistics.rows_written) == (3, 4, ROWS)
    # Counted by the reducers of multiset's action: partitions_of's mapInArrow ran in the
    # reducers of a result of its own.
    assert statistics.rows_read == ROWS
    assert multiset(shuffle.rebalance(events, "k", num_partitions=3)) == multiset(events)
    mapped = shuffle.repartition_map(events, "k", _doubled, "id long, twice double")
    assert multiset(mapped) == multiset(events.selectExpr("id", "amount * 2 as twice"))


def _what_arrived(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """One row a task: the schema its batches came in, and how many rows."""
    arrived = list(batches)
    schema = str(arrived[0].schema) if arrived else ""
    yield pa.record_batch({"schema": [schema], "rows": [sum(b.num_rows for b in arrived)]})


ARRIVED = "schema string, rows long"


def test_a_repartition_s_map_in_arrow_runs_in_its_reduce_tasks(
    shuffle: SparkShuffle, events: DataFrame
) -> None:
    """As ``repartition_map``: the function gets the batches Spark's own ``mapInArrow`` would
    hand it, of the same types, in the repartition's reducers; where pyshuffle does not run
    it (a result the user cached, one that is not the shuffled rows), Spark does."""
    result = shuffle.repartition(events, "k", num_partitions=2)
    mapped = result.mapInArrow(_what_arrived, ARRIVED)
    arrived = mapped.collect()
    assert shuffle.statistics(mapped).reducers == len(arrived) == 2  # a result of its own
    assert sum(row.rows for row in arrived) == ROWS
    spark_own = events.repartition(2, "k").mapInArrow(_what_arrived, ARRIVED).collect()
    assert {row.schema for row in arrived} == {row.schema for row in spark_own}
    by_spark = result.cache().mapInArrow(_what_arrived, ARRIVED)  # from Spark's cache
    assert sum(row.rows for row in by_spark.collect()) == ROWS
    result.unpersist()
    grouped = shuffle.group_apply(events, "k", _totals, "k long, total double, n long")
    for spark_ran in (by_spark, grouped.mapInArrow(_what_arrived, ARRIVED)):
        with pytest.raises(InvalidOperationError, match="not made by this SparkShuffle"):
            shuffle.statistics(spark_ran)
    shuffle.release(mapped)
    shuffle.release(result)


def test_group_apply_both_ways(shuffle: SparkShuffle, events: DataFrame) -> None:
    expected = multiset(_spark_totals(events))
    schema = "k long, total double, n long"
    assert multiset(shuffle.group_apply(events, "k", _totals, schema)) == expected
    assert multiset(shuffle.group_apply_sorted(events, "k", _totals, schema)) == expected


def _pandas_totals(pdf: pd.DataFrame) -> pd.DataFrame:
    # Named columns out of the schema's order: taken by name, as Spark takes them.
    return pd.DataFrame({"n": [len(pdf)], "total": [pdf["amount"].sum()], "k": pdf["k"][:1]})


def test_a_result_read_inside_a_union_and_a_cartesian_product(
    shuffle: SparkShuffle, events: DataFrame
) -> None:
    """Spark runs a result's reduce tasks as tasks of other numbers there (after another
    frame's partitions in a union; as pairs in a cartesian product): each reducer's rows
    still come once."""
    totals = shuffle.group_apply(events, "k", _totals, "k long, total double, n long")
    expected = multiset(_spark_totals(events))
    nothing = _spark_totals(events.filter("id < 0")).repartition(5)
    assert multiset(nothing.unionByName(totals)) == expected
    pairs = totals.alias("a").hint("shuffle_replicate_nl").crossJoin(totals.alias("b"))
    rows = sum(expected.values())
    assert pairs.count() == rows * rows
    assert multiset(pairs.select("a.k", "a.total", "a.n")) == Counter(
        {row: count * rows for row, count in expected.items()}
    )


def test_group_apply_of_a_pandas_function(shuffle: SparkShuffle, events: DataFrame) -> None:
    """As Spark's ``applyInPandas``: by PySpark's conversions, or pyshuffle's own on the
    releases without them."""
    schema = "k long, total double, n long"
    result = shuffle.group_apply(events, "k", pandas_function(_pandas_totals), schema)
    assert multiset(result) == multiset(_spark_totals(events))


def test_sort(shuffle: SparkShuffle, events: DataFrame) -> None:
    result = shuffle.sort(events, ["amount", "id"], ascending=[False, True], num_partitions=3)
    assert ordered(result) == ordered(events.orderBy(F.desc("amount"), F.asc("id")))


@pytest.mark.parametrize("broadcast", ["none", "right"])
def test_join_shuffled_and_broadcast(
    shuffle: SparkShuffle, events: DataFrame, users: DataFrame, broadcast: str
) -> None:
    result = shuffle.join(events, users, "k", "left", broadcast=broadcast)
    assert multiset(result) == multiset(events.join(users, "k", "left"))
    expected_side = None if broadcast == "none" else "right"
    assert shuffle.statistics(result).broadcast_side == expected_side


def test_parquet_in_and_out_and_to_arrow(
    shuffle: SparkShuffle, spark: SparkSession, events: DataFrame, tmp_path: Path
) -> None:
    events.write.parquet(str(tmp_path / "events"))
    source = shuffle.read_parquet(str(tmp_path / "events"), columns=["id", "k", "amount"])
    totals = shuffle.group_apply(
        source,
        "k",
        lambda table: _totals(table.append_column("name", table["id"])),
        "k long, total double, n long",
    )
    files = shuffle.write_parquet(totals, str(tmp_path / "totals"))
    assert files >= 1
    written = pq.read_table(tmp_path / "totals").to_pylist()
    assert sorted(written, key=str) == sorted(
        (row.asDict() for row in _spark_totals(events).collect()), key=str
    )
    table = shuffle.to_arrow(shuffle.repartition(events, "k", num_partitions=2))
    assert table.num_rows == ROWS
    assert sorted(table.column("id").to_pylist()) == list(range(ROWS))


def _sides(left: pd.DataFrame, right: pd.DataFrame) -> pd.DataFrame:
    key = left["k"][:1] if len(left) else right["k"][:1]
    return pd.DataFrame({"k": key, "left": [len(left)], "right": [len(right)]})


def test_unchanged_grouped_calls_after_enable(
    spark: SparkSession, service: ShuffleService, events: DataFrame, users: DataFrame
) -> None:
    """The switch on this release: the user's own applyInPandas, cogroup and grouped-aggregate
    pandas UDF, each through pyshuffle, each equal to Spark's."""

    @pandas_udf("double")  # type: ignore[call-overload, untyped-decorator]
    def mean(values: pd.Series) -> float:
        return float(values.mean())

    def calls() -> list[DataFrame]:
        return [
            events.groupBy("k").applyInPandas(_pandas_totals, "k long, total double, n long"),
            events.groupBy("k")
            .cogroup(users.groupBy("k"))
            .applyInPandas(_sides, "k long, left long, right long"),
            events.groupBy("k").agg(mean("amount").alias("mean")),
        ]

    expected = [multiset(result) for result in calls()]
    every_call = {**service.config(), DROPIN_MIN_INPUT_SIZE.key: 0}  # small inputs too
    with enable(spark, config=every_call) as switch:
        routed = [multiset(result) for result in calls()]
    switch.close()
    assert routed == expected
    assert [(call.api, call.path) for call in switch.calls] == [
        ("applyInPandas", "pyshuffle"),
        ("cogroup.applyInPandas", "pyshuffle"),
        ("agg", "pyshuffle"),
    ]


def test_a_fused_chain_reads_the_earlier_result_in_its_tasks(
    shuffle: SparkShuffle, events: DataFrame
) -> None:
    by_key = shuffle.repartition(events, "k", num_partitions=3)
    totals = shuffle.group_apply(by_key, "k", _totals, "k long, total double, n long")
    ordered_totals = shuffle.sort(totals, ["total", "k"], num_partitions=2)
    assert ordered(ordered_totals) == ordered(_spark_totals(events).orderBy("total", "k"))
    assert shuffle.statistics(ordered_totals).fused_inputs == 1
    shuffle.release(ordered_totals)


def test_a_lost_partition_is_recovered(shuffle: SparkShuffle, events: DataFrame) -> None:
    result = shuffle.repartition(events, "k", num_partitions=2)
    [exchange] = shuffle.exchanges(result)
    ShuffleService.delete_partition(exchange.outputs[1].descriptor)
    with pytest.raises(Exception, match="PartitionNotFoundError"):
        result.count()
    recovered = shuffle.recover(result)
    assert multiset(recovered) == multiset(events)
    assert shuffle.statistics(recovered).map_tasks_rerun == 1
    shuffle.release(recovered)
    shuffle.release(result)


def test_close_leaves_no_partition(
    spark: SparkSession, service: ShuffleService, events: DataFrame
) -> None:
    with SparkShuffle(spark, config=service.config()) as own:
        result = own.repartition(events, "k", num_partitions=2)
        assert result.count() == ROWS
        [exchange] = own.exchanges(result)
        descriptors = [output.descriptor for output in exchange.outputs.values()]
        assert all(map(ShuffleService.partition_stored, descriptors))
    assert not any(map(ShuffleService.partition_stored, descriptors))
