"""Every SparkShuffle operation returns what Spark's own operator returns on the same data, in
a real local Spark session: repartition, group-apply (both signatures), sorted group-apply,
sort and all six joins, on skewed, null, string, decimal, timestamp and list columns."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Hashable, Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from pyspark_shuffle import SparkShuffle, spark_configuration
from pyspark_shuffle.options import MAX_SUBPARTITIONS
from shuffle_api import (
    ConfigError,
    InvalidOperationError,
    ShuffleServiceClosedError,
    UnsupportedTypeError,
)
from tests.conftest import SPARK_MAX_SUBPARTITIONS
from tests.integration.services import DEFAULT_SERVICE_ONLY, ShuffleService
from tests.integration.spark_rows import canonical, multiset, ordered, partitions_of, rows_of

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

ROWS = 10_000
SPARK_JOIN_NAMES = {"semi": "left_semi", "anti": "left_anti"}


@pytest.fixture(scope="module")
def small_reducers(spark: SparkSession, service: ShuffleService) -> Iterator[SparkShuffle]:
    """Automatic reducers that read ~48 kB each: several reducers even for small data."""
    config = service.config(**{"pyspark-shuffle.reducer.target-size": "48k"})
    with SparkShuffle(spark, config=config) as made:
        yield made


@pytest.fixture(scope="module")
def data(spark: SparkSession) -> DataFrame:
    """k: 60 % of rows on key 0 (skew); nk: nulls; s: strings with '' and nulls; decimals,
    timestamps, a list payload and doubles with nulls and NaN."""
    frame: DataFrame = spark.range(0, ROWS, 1, 4).selectExpr(
        "id",
        "cast(case when id % 10 < 6 then 0 else id % 101 end as int) as k",
        "case when id % 13 = 0 then null else id % 17 end as nk",
        "case when id % 11 = 0 then null when id % 11 = 1 then '' else concat('s', id % 23) end"
        " as s",
        "cast((id % 29) * 0.25 as decimal(10, 2)) as d",
        "timestamp_seconds(1700000000 + (id % 31) * 3600) as t",
        "array(id, id % 3) as l",
        "case when id % 19 = 0 then null when id % 19 = 1 then double('NaN')"
        " else (id % 7) * 0.5 end as f",
    )
    return frame.cache()


@pytest.fixture(scope="module")
def data_rows(data: DataFrame) -> Counter[Hashable]:
    return multiset(data)


def _partition_of_each_key(result: DataFrame, keys: list[str]) -> Counter[Any]:
    """How many output partitions hold each key (should be one)."""
    from pyspark.sql import functions as F  # noqa: N812, PLC0415

    placed = result.select(*keys, F.spark_partition_id().alias("partition")).distinct()
    return Counter(tuple(canonical(row[key]) for key in keys) for row in rows_of(placed))


# -- repartition ----------------------------------------------------------------------------


@pytest.mark.parametrize("keys", [["k"], ["nk"], ["s", "d", "t"]], ids="-".join)
def test_repartition_equals_spark_and_keeps_each_key_in_one_partition(
    shuffle: SparkShuffle, data: DataFrame, data_rows: Counter[Hashable], keys: list[str]
) -> None:
    result = shuffle.repartition(data, keys, num_partitions=5)
    assert partitions_of(result) == 5
    assert result.columns == data.columns
    assert multiset(result) == data_rows  # Spark's data.repartition(5, *keys): the same rows
    placements = _partition_of_each_key(result, keys)
    assert placements, "no keys"
    assert max(placements.values()) == 1, "a key is in more than one partition"
    statistics = shuffle.statistics(result)
    assert statistics.rows_written == ROWS
    assert statistics.map_tasks == 4
    assert statistics.reducers == 5


def test_repartition_with_automatic_reducers(
    small_reducers: SparkShuffle,
    shuffle: SparkShuffle,
    data: DataFrame,
    data_rows: Counter[Hashable],
) -> None:
    result = small_reducers.repartition(data, "nk")
    statistics = small_reducers.statistics(result)
    assert 1 < statistics.reducers <= SPARK_MAX_SUBPARTITIONS
    assert partitions_of(result) == statistics.reducers
    assert multiset(result) == data_rows
    assert max(_partition_of_each_key(result, ["nk"]).values()) == 1
    # 64 MiB per reducer by default (lowered to keep both cores busy): fewer reducers.
    fewer = shuffle.repartition(data, "nk")
    assert 1 <= shuffle.statistics(fewer).reducers < statistics.reducers
    assert fewer.count() == ROWS


def test_re_evaluating_a_result_gives_the_same_rows(
    shuffle: SparkShuffle, data: DataFrame, data_rows: Counter[Hashable]
) -> None:
    result = shuffle.repartition(data, ["k", "s"], num_partitions=3)
    first = multiset(result)
    assert result.count() == ROWS
    assert multiset(result) == first == data_rows
    assert shuffle.statistics(result).rows_read >= 2 * ROWS


# -- group apply ----------------------------------------------------------------------------


def _count_and_total(table: pa.Table) -> pa.Table:
    return pa.table(
        {
            "nk": table.column("nk").slice(0, 1),
            "s": table.column("s").slice(0, 1),
            "n": pa.array([table.num_rows], pa.int64()),
            "total": pa.array([pc.sum(table.column("id")).as_py()], pa.int64()),
            "amount": pa.array([pc.sum(table.column("d")).as_py()], pa.decimal128(20, 2)),
        }
    )


def _with_key(key: tuple[pa.Scalar, ...], table: pa.Table) -> pa.Table:
    nk, s = key
    return pa.table(
        {
            "nk": pa.array([nk.as_py()], pa.int64()),
            "s": pa.array([s.as_py()], pa.string()),
            "n": pa.array([table.num_rows], pa.int64()),
            "total": pa.array([pc.sum(table.column("id")).as_py()], pa.int64()),
            "amount": pa.array([pc.sum(table.column("d")).as_py()], pa.decimal128(20, 2)),
        }
    )


GROUP_SCHEMA = "nk long, s string, n long, total long, amount decimal(20, 2)"


@pytest.mark.parametrize(
    ("function", "num_partitions"),
    [(_count_and_total, None), (_with_key, 3)],
    ids=["table-automatic", "key-table-fixed"],
)
def test_group_apply_equals_apply_in_arrow(
    shuffle: SparkShuffle,
    data: DataFrame,
    function: Callable[..., pa.Table],
    num_partitions: int | None,
) -> None:
    result = shuffle.group_apply(
        data, ["nk", "s"], function, GROUP_SCHEMA, num_partitions=num_partitions
    )
    expected = data.groupBy("nk", "s").applyInArrow(function, GROUP_SCHEMA)
    got = multiset(result)
    assert got == multiset(expected)
    assert sum(got.values()) == 18 * 25  # nk (17 values and null) x s (23, '' and null)
    reducers = shuffle.statistics(result).reducers
    assert reducers == num_partitions if num_partitions else 1 <= reducers <= 8


def test_group_apply_on_a_skewed_key(small_reducers: SparkShuffle, data: DataFrame) -> None:
    def summary(table: pa.Table) -> pa.Table:
        return pa.table(
            {
                "k": table.column("k").slice(0, 1),
                "n": pa.array([table.num_rows], pa.int64()),
                "lists": pa.array([sum(len(each) for each in table.column("l").to_pylist())]),
            }
        )

    schema = "k int, n long, lists long"
    result = small_reducers.group_apply(data, "k", summary, schema)
    expected = data.groupBy("k").applyInArrow(summary, schema)
    assert multiset(result) == multiset(expected)
    assert max(row["n"] for row in rows_of(result)) > ROWS // 2


def test_group_apply_sorted_equals_a_spark_aggregate(
    small_reducers: SparkShuffle, data: DataFrame
) -> None:
    from pyspark.sql import functions as F  # noqa: N812, PLC0415

    def per_partition(table: pa.Table) -> pa.Table:
        keys = table.select(["nk", "t"]).to_pylist()
        if keys != sorted(keys, key=lambda row: (row["nk"] is not None, row["nk"] or 0, row["t"])):
            raise AssertionError("a reducer's rows were not sorted by their keys")
        aggregated: pa.Table = table.group_by(["nk", "t"], use_threads=False).aggregate(
            [("id", "count"), ("id", "max")]
        )
        return aggregated.rename_columns(["nk", "t", "n", "top"])

    result = small_reducers.group_apply_sorted(
        data, ["nk", "t"], per_partition, "nk long, t timestamp, n long, top long"
    )
    expected = data.groupBy("nk", "t").agg(
        F.count("id").alias("n").cast("long"), F.max("id").alias("top")
    )
    assert multiset(result) == multiset(expected.select("nk", "t", "n", "top"))
    assert small_reducers.statistics(result).reducers > 1


# -- sort -----------------------------------------------------------------------------------


def _spark_order(data: DataFrame, columns: list[str], ascending: list[bool]) -> DataFrame:
    from pyspark.sql import functions as F  # noqa: N812, PLC0415

    ordered_columns = [
        F.col(name).asc() if up else F.col(name).desc()
        for name, up in zip(columns, ascending, strict=True)
    ]
    return data.orderBy(*ordered_columns)


@DEFAULT_SERVICE_ONLY
@pytest.mark.parametrize(
    ("columns", "ascending", "num_partitions"),
    [
        (["nk", "s", "id"], [True, False, True], 4),
        (["s", "nk", "id"], [False, True, False], None),
        (["k", "id"], [True, True], 4),
        (["t", "d", "id"], [False, True, True], None),
        (["f", "id"], [False, True], None),
        (["f", "id"], [True, False], 4),
    ],
    ids=["nk-s-desc", "s-desc-nk", "skewed", "timestamp-desc-decimal", "nan-desc", "nan-asc"],
)
def test_sort_equals_order_by(
    small_reducers: SparkShuffle,
    data: DataFrame,
    columns: list[str],
    ascending: list[bool],
    num_partitions: int | None,
) -> None:
    result = small_reducers.sort(data, columns, ascending=ascending, num_partitions=num_partitions)
    assert ordered(result) == ordered(_spark_order(data, columns, ascending))
    if num_partitions is None:
        assert small_reducers.statistics(result).reducers > 1


def test_sort_with_one_direction_for_all(shuffle: SparkShuffle, data: DataFrame) -> None:
    result = shuffle.sort(data, ["s", "id"], ascending=False, num_partitions=3)
    assert partitions_of(result) == 3
    assert ordered(result) == ordered(_spark_order(data, ["s", "id"], [False, False]))


# -- join -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sides(spark: SparkSession, data: DataFrame) -> tuple[DataFrame, DataFrame]:
    left = data.filter("id < 2000").select("id", "k", "nk", "s", "d", "l")
    right: DataFrame = spark.range(0, 300, 1, 3).selectExpr(
        "cast(id % 120 as int) as k",
        "case when id % 50 = 0 then null else id % 25 end as nk",
        "case when id % 7 = 0 then null else concat('s', id % 23) end as s",
        "id * 2 as w",
        "array(cast(id as string)) as rl",
        "timestamp_seconds(id) as rt",
    )
    return left, right


@DEFAULT_SERVICE_ONLY
@pytest.mark.parametrize(
    ("how", "keys"),
    [(how, ["nk"]) for how in ("inner", "left", "right")]
    + [(how, ["k", "s"]) for how in ("full", "semi", "anti")],
    ids=lambda value: value if isinstance(value, str) else "-".join(value),
)
@pytest.mark.parametrize("broadcast", ["none", "auto"])
def test_join_equals_spark_join(
    shuffle: SparkShuffle,
    sides: tuple[DataFrame, DataFrame],
    how: str,
    keys: list[str],
    broadcast: str,
) -> None:
    left, right = sides
    # Only the keys may be on both sides.
    others = [name for name in ("k", "nk", "s") if name not in keys]
    right = right.drop(*others)
    result = shuffle.join(left, right, keys, how, num_partitions=4, broadcast=broadcast)
    # auto: every join type but full broadcasts a side here (both are small).
    broadcast_side = shuffle.statistics(result).broadcast_side
    assert (broadcast_side is not None) == (broadcast == "auto" and how != "full")
    expected = left.join(right, on=keys, how=SPARK_JOIN_NAMES.get(how, how))
    assert result.columns == expected.columns
    got = multiset(result)
    assert got == multiset(expected)
    assert sum(got.values()) > 0


def test_join_with_automatic_reducers_and_skew(
    small_reducers: SparkShuffle, data: DataFrame, spark: SparkSession
) -> None:
    right = spark.range(0, 101, 1, 2).selectExpr("cast(id as int) as k", "id * 10 as w")
    result = small_reducers.join(data, right, "k", "full")
    expected = data.join(right, on="k", how="full")
    assert multiset(result) == multiset(expected)
    assert small_reducers.statistics(result).reducers > 1


# -- edge inputs ----------------------------------------------------------------------------


OPERATIONS: dict[str, Callable[[SparkShuffle, DataFrame], DataFrame]] = {
    "repartition": lambda shuffle, frame: shuffle.repartition(frame, "k"),
    "sort": lambda shuffle, frame: shuffle.sort(frame, ["k", "v"]),
    "group_apply": lambda shuffle, frame: shuffle.group_apply(
        frame, "k", lambda t: t, frame.schema
    ),
    "group_apply_sorted": lambda shuffle, frame: shuffle.group_apply_sorted(
        frame, "k", lambda t: t, frame.schema
    ),
    "join": lambda shuffle, frame: shuffle.join(
        frame, frame.select("k", frame["v"].alias("w")), "k", "full"
    ),
}


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_empty_input(shuffle: SparkShuffle, spark: SparkSession, operation: str) -> None:
    empty = spark.createDataFrame([], "k long, v string, l array<long>")
    result = OPERATIONS[operation](shuffle, empty)
    assert rows_of(result) == []
    assert len(result.columns) >= 3


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_a_map_key_is_refused_as_spark_refuses_it(
    shuffle: SparkShuffle, spark: SparkSession, operation: str
) -> None:
    frame = spark.range(0, 10, 1, 2).selectExpr("map(id, id) as k", "cast(id as string) as v")
    with pytest.raises(UnsupportedTypeError, match=r"'k'.*map<bigint,bigint>.*cannot be a key"):
        OPERATIONS[operation](shuffle, frame)


# -- lifecycle and configuration ------------------------------------------------------------


def test_release_makes_later_reads_fail_clearly(shuffle: SparkShuffle, data: DataFrame) -> None:
    result = shuffle.repartition(data, "k", num_partitions=2)
    assert result.count() == ROWS
    [exchange] = shuffle.exchanges(result)
    shuffle.release(result)
    with pytest.raises(Exception, match=exchange.result_id) as raised:
        result.collect()
    assert "PartitionNotFoundError" in str(raised.value) or "released" in str(raised.value)
    with pytest.raises(InvalidOperationError):
        shuffle.statistics(result)


def test_releasing_one_of_two_reads_of_an_exchange_keeps_the_other_readable(
    shuffle: SparkShuffle, data: DataFrame
) -> None:
    exchange = shuffle.hash_exchange(data, "k", num_partitions=2)
    first, second = shuffle.read(exchange), shuffle.read(exchange)
    shuffle.release(first)
    assert second.count() == ROWS
    shuffle.release(second)
    with pytest.raises(Exception, match=exchange.result_id):
        second.collect()


def test_close_leaves_no_partition_files(
    spark: SparkSession, data: DataFrame, service: ShuffleService
) -> None:
    before = service.stored_paths()
    shuffle = SparkShuffle(spark, config=service.config())
    kept = shuffle.repartition(data, "k", num_partitions=3)
    shuffle.join(data.select("k", "id"), data.select("k", "s"), "k", "semi")
    assert kept.count() == ROWS
    assert service.stored_paths() - before
    shuffle.close()
    assert service.stored_paths() == before  # no files, and no empty directories either
    with pytest.raises(ShuffleServiceClosedError):
        shuffle.repartition(data, "k")
    shuffle.close()  # idempotent


def test_configuration_from_spark_conf(
    spark: SparkSession, shuffle: SparkShuffle, data: DataFrame, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The session was started with spark.pyshuffle.pyspark-shuffle.max-subpartitions.
    assert spark_configuration(spark).get(MAX_SUBPARTITIONS) == SPARK_MAX_SUBPARTITIONS
    assert shuffle.configuration.get(MAX_SUBPARTITIONS) == SPARK_MAX_SUBPARTITIONS
    exchange = shuffle.hash_exchange(data, "k")
    assert exchange.spec.partitioner.number_of_subpartitions == SPARK_MAX_SUBPARTITIONS
    assert exchange.number_of_maps == 4
    # Spark conf beats PYSHUFFLE_* variables; explicit overrides beat Spark conf.
    monkeypatch.setenv("PYSHUFFLE_PYSPARK_SHUFFLE_MAX_SUBPARTITIONS", "5")
    assert spark_configuration(spark).get(MAX_SUBPARTITIONS) == SPARK_MAX_SUBPARTITIONS
    overridden = spark_configuration(spark, {"pyspark-shuffle.max-subpartitions": 3})
    assert overridden.get(MAX_SUBPARTITIONS) == 3


def test_unknown_or_invalid_config_is_a_config_error(
    spark: SparkSession, service: ShuffleService
) -> None:
    with pytest.raises(ConfigError, match=r"'pyspark-shuffle\.max-subpartition'"):
        SparkShuffle(spark, config=service.config(**{"pyspark-shuffle.max-subpartition": 3}))
    with pytest.raises(ConfigError, match=r"'pyspark-shuffle\.max-subpartitions'"):
        SparkShuffle(spark, config=service.config(**{"pyspark-shuffle.max-subpartitions": 0}))


def test_repartition_map_equals_repartition_then_map_in_arrow(
    shuffle: SparkShuffle, data: DataFrame
) -> None:
    def per_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        table = pa.Table.from_batches(list(batches))
        keys = table.column("k").unique().drop_null()
        yield pa.record_batch(
            {
                "rows": pa.array([table.num_rows], pa.int64()),
                "keys": pa.array([len(keys)], pa.int64()),
            }
        )

    schema = "rows long, keys long"
    fused = shuffle.repartition_map(data, "k", per_partition, schema, num_partitions=3)
    separate = shuffle.repartition(data, "k", num_partitions=3).mapInArrow(per_partition, schema)
    assert sorted(fused.collect()) == sorted(separate.collect())
    assert sum(row["rows"] for row in fused.collect()) == data.count()


@DEFAULT_SERVICE_ONLY
@pytest.mark.parametrize("broadcast", ["none", "auto"])
@pytest.mark.parametrize("how", ["inner", "left", "right", "full"])
def test_join_on_a_float_key_keeps_each_rows_own_zero(
    shuffle: SparkShuffle, spark: SparkSession, how: str, broadcast: str
) -> None:
    # -0.0 joins 0.0 (Spark normalises the key to compare it) yet each output row keeps its
    # own key as Spark does: the left's, the right's for a right join, either for a full one.
    left = spark.createDataFrame(
        [(-0.0, 1), (0.0, 2), (1.5, 3), (-0.0, 4), (2.5, 5)], "x double, a long"
    )
    right = spark.createDataFrame([(0.0, 10), (-0.0, 20), (3.5, 30)], "x double, b long")
    result = shuffle.join(left, right, "x", how, num_partitions=2, broadcast=broadcast)
    expected = left.join(right, on="x", how=SPARK_JOIN_NAMES.get(how, how))

    def signed(frame: DataFrame) -> Counter[tuple[object, ...]]:
        return Counter(
            tuple(
                (value, math.copysign(1.0, value)) if isinstance(value, float) else value
                for value in row.values()
            )
            for row in frame.toArrow().to_pylist()
        )

    assert signed(result) == signed(expected)
