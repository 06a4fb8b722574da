"""Every Spark type through every operation, on the default service, checked against Spark on
generated schemas (nested up to three levels) and rows (nulls, empties, extremes): each result
has the rows and the schema (names, types, nullability) that Spark's own operator gives.

CI runs a few examples per test from a fixed seed; ``make types`` runs many more
(``TYPE_TEST_EXAMPLES``, random seeds)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F  # noqa: N812
from pyspark.sql.types import LongType, StructField, StructType

from pyspark_shuffle import SparkShuffle
from pyspark_shuffle.driver.broadcast import BROADCAST_CHOICES
from pyspark_shuffle.driver.schemas import arrow_schema
from pyspark_shuffle.spark.compat import SPARK_VERSION
from shuffle_api import UnsupportedTypeError
from tests.integration.services import DEFAULT_SERVICE_ONLY, ShuffleService
from tests.integration.spark_rows import canonical, canonical_rows, handed_rows, handed_to_python
from tests.integration.spark_types import KEY, TypedRows, short, typed_rows

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = DEFAULT_SERVICE_ONLY

_MANY = int(os.environ.get("TYPE_TEST_EXAMPLES", "0"))
_SLOW = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example]
EXAMPLES = settings(
    # CI: a fixed seed and two examples per test (each a Spark job or several: `make types`
    # draws many more). No shrinking, which would run Spark jobs by the hundred: a failure
    # prints its example as drawn.
    max_examples=_MANY or 2,
    derandomize=not _MANY,
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=_SLOW,
    print_blob=True,
)
SPARK_JOIN_NAMES = {"semi": "left_semi", "anti": "left_anti"}
BROADCASTABLE = {"inner": ("left", "right"), "left": ("right",), "semi": ("right",)}
BROADCASTABLE |= {"anti": ("right",), "right": ("left",), "full": ()}


def frame_of(spark: SparkSession, typed: TypedRows, partitions: int = 3) -> DataFrame:
    """The rows as a DataFrame of ``partitions`` partitions (so several map tasks)."""
    rows = spark.sparkContext.parallelize(typed.rows, partitions)
    frame: DataFrame = spark.createDataFrame(rows, typed.schema)
    return frame


def assert_same_result(ours: DataFrame, theirs: DataFrame) -> None:
    """The same schema, as Spark reports it, and the same rows."""
    assert ours.schema == theirs.schema, f"{ours.schema.simpleString()} != {theirs.schema}"
    got, expected = Counter(handed_rows(ours)), Counter(handed_rows(theirs))
    assert got == expected, (
        f"only ours: {short(list((got - expected).elements()))};"
        f" only Spark's: {short(list((expected - got).elements()))}"
    )


def keys_in_order(frame: DataFrame, keys: Sequence[str] = (KEY,)) -> list[Hashable]:
    """The keys of the rows, in the DataFrame's order."""
    rows = handed_to_python(frame).to_pylist()
    return [canonical([row[key] for key in keys]) for row in rows]


def with_group_size(table: pa.Table) -> pa.Table:
    """A group's rows, each with the number of rows in its group."""
    return table.append_column(
        "group_rows", pa.array([table.num_rows] * table.num_rows, pa.int64())
    )


def group_schema(schema: StructType) -> StructType:
    return StructType([*schema.fields, StructField("group_rows", LongType(), False)])


@contextmanager
def time_zone(spark: SparkSession, zone: str) -> Iterator[None]:
    """The session's time zone, for the ``with`` block."""
    key = "spark.sql.session.timeZone"
    was = str(spark.conf.get(key))
    spark.conf.set(key, zone)
    try:
        yield
    finally:
        spark.conf.set(key, was)


# Spark 4.3's applyInArrow hands its function timestamps in the session's time zone but
# wants them back in "UTC": where the two differ, Spark's own fails, so the tests that
# compare with it run in UTC; the others in a zone of their own.
GROUP_APPLY_ZONE, OTHER_ZONE = "UTC", "America/Los_Angeles"


@contextmanager
def scratch_directory() -> Iterator[str]:
    directory = tempfile.mkdtemp(prefix="pyshuffle-types-")
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# -- generated: every operation against Spark's own ------------------------------------------


@EXAMPLES
@given(typed=typed_rows(), reducers=st.integers(1, 5))
def test_repartition_and_rebalance_equal_spark(
    shuffle: SparkShuffle, spark: SparkSession, typed: TypedRows, reducers: int
) -> None:
    with time_zone(spark, OTHER_ZONE):
        frame = frame_of(spark, typed)
        result = shuffle.repartition(frame, KEY, num_partitions=reducers)
        assert_same_result(result, frame.repartition(reducers, KEY))
        placed = result.select(KEY, F.spark_partition_id().alias("partition")).distinct()
        partitions_of_a_key = Counter(keys_in_order(placed))
        assert all(count == 1 for count in partitions_of_a_key.values()), "a key in two partitions"
        assert_same_result(shuffle.rebalance(frame, KEY), frame.hint("rebalance", KEY))


@EXAMPLES
@given(typed=typed_rows())
def test_group_apply_equals_apply_in_arrow(
    shuffle: SparkShuffle, spark: SparkSession, typed: TypedRows
) -> None:
    with time_zone(spark, GROUP_APPLY_ZONE):
        frame = frame_of(spark, typed)
        schema = group_schema(typed.schema)
        result = shuffle.group_apply(frame, KEY, with_group_size, schema)
        assert_same_result(result, frame.groupBy(KEY).applyInArrow(with_group_size, schema))


@EXAMPLES
@given(typed=typed_rows(), ascending=st.booleans())
def test_sort_equals_order_by(
    shuffle: SparkShuffle, spark: SparkSession, typed: TypedRows, ascending: bool
) -> None:
    with time_zone(spark, OTHER_ZONE):
        frame = frame_of(spark, typed)
        result = shuffle.sort(frame, KEY, ascending=ascending, num_partitions=3)
        expected = frame.orderBy(F.col(KEY).asc() if ascending else F.col(KEY).desc())
        assert_same_result(result, expected)
        assert keys_in_order(result) == keys_in_order(expected)


@st.composite
def joins(draw: st.DrawFn) -> tuple[TypedRows, list[bool], str, str]:
    typed = draw(typed_rows())
    kept = draw(st.lists(st.booleans(), min_size=len(typed.rows), max_size=len(typed.rows)))
    how = draw(st.sampled_from(sorted(BROADCASTABLE)))
    broadcast = draw(st.sampled_from(["auto", "none", *BROADCASTABLE[how]]))
    assert broadcast in BROADCAST_CHOICES
    return typed, kept, how, broadcast


@EXAMPLES
@given(join=joins())
def test_join_equals_spark_join(
    shuffle: SparkShuffle, spark: SparkSession, join: tuple[TypedRows, list[bool], str, str]
) -> None:
    with time_zone(spark, OTHER_ZONE):
        typed, kept, how, broadcast = join
        left = frame_of(spark, typed)
        # The right side: some of the rows, a payload of the left's renamed.
        chosen = [row for row, keep in zip(typed.rows, kept, strict=True) if keep]
        right_rows = TypedRows(typed.schema, chosen)
        right = frame_of(spark, right_rows, 2).select(KEY, F.col("c0").alias("r0"))
        result = shuffle.join(left, right, KEY, how, num_partitions=3, broadcast=broadcast)
        assert_same_result(result, left.join(right, on=KEY, how=SPARK_JOIN_NAMES.get(how, how)))


@EXAMPLES
@given(typed=typed_rows())
def test_a_fused_chain_equals_spark(
    shuffle: SparkShuffle, spark: SparkSession, typed: TypedRows
) -> None:
    with time_zone(spark, GROUP_APPLY_ZONE):
        frame = frame_of(spark, typed)
        schema = group_schema(typed.schema)
        grouped = shuffle.group_apply(shuffle.repartition(frame, KEY), KEY, with_group_size, schema)
        result = shuffle.sort(grouped, KEY)
        assert shuffle.statistics(result).fused_inputs == 1
        expected = frame.groupBy(KEY).applyInArrow(with_group_size, schema).orderBy(KEY)
        assert_same_result(result, expected)
        assert keys_in_order(result) == keys_in_order(expected)


def _refusal(write: Callable[[], object]) -> Exception | None:
    """None when ``write()`` succeeded, else its error."""
    try:
        write()
    except Exception as error:  # Spark's own refusals are Py4J or analysis errors
        return error
    return None


@EXAMPLES
@given(typed=typed_rows())
def test_parquet_and_to_arrow_equal_spark(
    shuffle: SparkShuffle, spark: SparkSession, typed: TypedRows
) -> None:
    with time_zone(spark, OTHER_ZONE):
        frame = frame_of(spark, typed)
        result = shuffle.repartition(frame, KEY, num_partitions=2)
        ours_arrow = shuffle.to_arrow(result)
        assert ours_arrow.schema.equals(arrow_schema(spark, frame.schema, timezone="UTC"))
        assert Counter(canonical_rows(ours_arrow)) == Counter(handed_rows(frame))
        with scratch_directory() as directory:
            ours, theirs = f"{directory}/ours", f"{directory}/theirs"
            refused = _refusal(lambda: shuffle.write_parquet(result, ours))
            spark_refused = _refusal(lambda: frame.write.parquet(theirs))
            # Where Spark's Parquet writer refuses a type, so does pyshuffle's, with its own error.
            assert (refused is None) == (spark_refused is None), (refused, spark_refused)
            if refused is not None:
                assert isinstance(refused, UnsupportedTypeError), refused
                return
            assert_same_result(spark.read.parquet(ours), spark.read.parquet(theirs))
            source = shuffle.read_parquet(theirs)
            assert_same_result(shuffle.repartition(source, KEY), spark.read.parquet(theirs))


# -- every type at once, as keys and beside them -------------------------------------------

ATOMIC_COLUMNS = {
    "b": "g % 3 = 0",
    "i8": "cast(g * 13 - 128 as tinyint)",
    "i16": "cast(g * 7919 % 65536 - 32768 as smallint)",
    "i32": "cast(g * 104729 as int)",
    "i64": "case when g % 5 = 0 then 9223372036854775807 else -g end",
    "f32": "cast(case g % 6 when 0 then 'NaN' when 1 then '-0.0' when 2 then 'Infinity'"
    " else g / 4 end as float)",
    "f64": "case g % 6 when 0 then double('NaN') when 1 then -0.0 when 2 then double('-Infinity')"
    " else g / 3 end",
    "d5": "cast(g * 47 % 1000 / 100 as decimal(5, 2))",
    "d38": "cast(g * 1234567.891 as decimal(38, 10))",
    "s": "case g % 4 when 0 then '' when 1 then 'é😀' else concat('s', g % 9) end",
    "bin": "cast(concat('b', g % 5) as binary)",
    "d": "date_add(date'0001-01-01', cast(g * 182500 as int))",
    "ts": "timestamp_seconds(g * 86400 * 365 * 7 - 62000000000)",
    "ntz": "cast(timestamp_seconds(g * 3600) as timestamp_ntz)",
    "dti": "make_dt_interval(g % 9, g % 24, g, g / 7)",
    "void": "null",
}
NULL_EVERY = 11


@pytest.fixture(scope="module")
def every_type(spark: SparkSession) -> DataFrame:
    """Every atomic type (nulls in every column), a struct of them all, an array, a map, and
    on Spark 4 a variant: 60 rows whose values repeat every 20 (so groups and matches)."""
    atomic = [
        f"case when g % {NULL_EVERY} = 0 then null else {expression} end as {name}"
        for name, expression in ATOMIC_COLUMNS.items()
    ]
    fields = ", ".join(f"'{name}', {name}" for name in ATOMIC_COLUMNS)
    nested = [
        f"named_struct({fields}) as st",
        "case when i64 % 4 = 0 then null else array(i32, null, i32 + 1) end as arr",
        "map(coalesce(s, ''), array(d), 'x', array()) as m",
    ]
    if SPARK_VERSION >= (4, 0):
        nested.append("parse_json(concat('{\"row\": ', id, '}')) as var")
    frame: DataFrame = (
        spark.range(0, 60, 1, 3)
        .selectExpr("id", "id % 20 as g")
        .selectExpr("id", *atomic)
        .selectExpr("*", *nested)
    )
    return frame


KEY_SETS = {
    "atomic": [name for name in ATOMIC_COLUMNS if name != "void"],
    "nested": ["st", "arr"],
}


def _without_variant(frame: DataFrame) -> DataFrame:
    """Spark's own applyInArrow, joins and Parquet reader take no variant column."""
    return frame.drop("var") if "var" in frame.columns else frame


@pytest.mark.parametrize("keys", list(KEY_SETS.values()), ids=list(KEY_SETS))
def test_every_type_as_a_key_and_beside_one_equals_spark(
    shuffle: SparkShuffle, spark: SparkSession, every_type: DataFrame, keys: list[str]
) -> None:
    with time_zone(spark, OTHER_ZONE):
        assert_same_result(
            shuffle.repartition(every_type, keys, num_partitions=4),
            every_type.repartition(4, *keys),
        )
        directions = [index % 2 == 0 for index in range(len(keys))]
        ordered = shuffle.sort(every_type, keys, ascending=directions, num_partitions=3)
        columns = [F.col(key) for key in keys]
        expected = every_type.orderBy(
            *[col.asc() if up else col.desc() for col, up in zip(columns, directions, strict=True)]
        )
        assert_same_result(ordered, expected)
        assert keys_in_order(ordered, keys) == keys_in_order(expected, keys)
        right = _without_variant(every_type).select(*keys, F.col("id").alias("right_id"))
        for how, broadcast in [("inner", "none"), ("full", "none"), ("left", "right")]:
            spark_join = every_type.join(right, on=keys, how=how)
            joined = shuffle.join(every_type, right, keys, how, broadcast=broadcast)
            assert_same_result(joined, spark_join)
    with time_zone(spark, GROUP_APPLY_ZONE):
        frame = _without_variant(every_type)
        schema = group_schema(frame.schema)
        assert_same_result(
            shuffle.group_apply(frame, keys, with_group_size, schema),
            frame.groupBy(*keys).applyInArrow(with_group_size, schema),
        )


def test_every_type_through_parquet_and_to_arrow(
    shuffle: SparkShuffle, spark: SparkSession, every_type: DataFrame
) -> None:
    with time_zone(spark, OTHER_ZONE), scratch_directory() as directory:
        result = shuffle.repartition(every_type, "i32", num_partitions=3)
        table = shuffle.to_arrow(result)
        assert table.schema.equals(arrow_schema(spark, every_type.schema, timezone="UTC"))
        assert Counter(canonical_rows(table)) == Counter(handed_rows(every_type))
        shuffle.write_parquet(result, f"{directory}/ours")
        every_type.write.parquet(f"{directory}/theirs")
        assert_same_result(
            spark.read.parquet(f"{directory}/ours"), spark.read.parquet(f"{directory}/theirs")
        )


# -- the case: a broadcast join whose streamed side has a map column -----------------


@pytest.mark.parametrize("how", ["inner", "left", "semi", "anti"])
def test_a_broadcast_join_streaming_a_map_column_equals_spark(
    shuffle: SparkShuffle, spark: SparkSession, how: str
) -> None:
    # Spark's physical plan promises more than the DataFrame's schema says (the map's values
    # are non-null, the filtered column is), so its batches' Arrow schema differs from the
    # declared one in nullability alone: once a SchemaMismatchError in every task.
    left = (
        spark.range(0, 3_000, 1, 4)
        .selectExpr(
            "id",
            "cast(id % 50 as double) as k",
            "case when id % 7 = 0 then null else cast(id as int) end as i",
            "cast(map('a', id, 'b', id * 2) as map<string, bigint>) as v_map",
            "named_struct('x', id, 'y', cast(id as string)) as s",
        )
        .where("i is not null")
    )
    right = spark.range(0, 40, 1, 1).selectExpr("cast(id as double) as k", "id as r")
    result = shuffle.join(left, right, "k", how)
    assert shuffle.statistics(result).broadcast_side == "right"
    assert_same_result(result, left.join(right, on="k", how=SPARK_JOIN_NAMES.get(how, how)))


# -- refused before any task runs ----------------------------------------------------------

REFUSED_COLUMNS = {
    "calendar interval": ("make_interval(1, 2, 3, 4, 5, 6, 7.5) as c", "'c'", "interval"),
    "year-month interval, nested": (
        "named_struct('ym', interval '1-2' year to month) as c",
        "'c.ym'",
        "interval year to month",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED_COLUMNS))
def test_a_column_spark_cannot_hand_to_python_is_refused_before_any_task(
    shuffle: SparkShuffle, spark: SparkSession, service: ShuffleService, case: str
) -> None:
    column, path, type_name = REFUSED_COLUMNS[case]
    frame = spark.range(0, 10, 1, 2).selectExpr("id", column)
    before = service.stored_paths()
    operations: list[Callable[[], object]] = [
        lambda: shuffle.repartition(frame, "id"),
        lambda: shuffle.sort(frame, "id"),
        lambda: shuffle.join(frame, frame.select("id"), "id"),
        lambda: shuffle.to_arrow(frame),
        lambda: shuffle.group_apply(frame.select("id"), "id", lambda t: t, frame.schema),
    ]
    for operation in operations:
        with pytest.raises(UnsupportedTypeError, match=rf"{path}.*{type_name}"):
            operation()
    assert service.stored_paths() == before


KEYS_SPARK_REFUSES = {
    "map": ("map('a', id) as c", "map<string,bigint>"),
    "struct of a map": ("named_struct('m', map('a', id)) as c", "map<string,bigint>"),
}
if SPARK_VERSION >= (4, 0):
    KEYS_SPARK_REFUSES["variant"] = ("parse_json('{\"a\": 1}') as c", "variant")
    KEYS_SPARK_REFUSES["array of geometry"] = (
        "array(st_geomfromwkb(X'0101000000000000000000F03F0000000000000040')) as c",
        "geometry",
    )


@pytest.mark.parametrize("case", list(KEYS_SPARK_REFUSES))
def test_a_key_spark_neither_hashes_nor_orders_is_refused(
    shuffle: SparkShuffle, spark: SparkSession, case: str
) -> None:
    column, type_name = KEYS_SPARK_REFUSES[case]
    frame = spark.range(0, 10, 1, 2).selectExpr("id", column)
    operations: list[Callable[[], object]] = [
        lambda: shuffle.repartition(frame, "c"),
        lambda: shuffle.rebalance(frame, "c"),
        lambda: shuffle.group_apply(frame, "c", lambda t: t, frame.schema),
        lambda: shuffle.sort(frame, "c"),
        lambda: shuffle.join(frame, frame.select("c"), "c"),
    ]
    for operation in operations:
        with pytest.raises(UnsupportedTypeError, match=rf"'c'.*cannot be a key.*{type_name}"):
            operation()


def test_group_apply_takes_timestamps_back_in_any_time_zone(
    shuffle: SparkShuffle, spark: SparkSession
) -> None:
    frame = spark.range(0, 40, 1, 2).selectExpr(
        "id % 4 as k",
        "timestamp_seconds(id * 86400) as t",
        "named_struct('t', timestamp_seconds(id)) as s",
    )

    def in_utc(table: pa.Table) -> pa.Table:
        # What Spark's own applyInArrow wants back, whatever the session's zone.
        utc = pa.timestamp("us", tz="UTC")
        nested = pa.struct([pa.field("t", utc)])
        return table.cast(pa.schema([table.schema.field("k"), ("t", utc), ("s", nested)]))

    with time_zone(spark, OTHER_ZONE):
        for function in (in_utc, lambda table: table):
            result = shuffle.group_apply(frame, "k", function, frame.schema)
            assert Counter(handed_rows(result)) == Counter(handed_rows(frame))


# -- Parquet's dictionary-encoded columns ---------------------------------------------------


def test_dictionary_encoded_parquet_columns_read_as_spark_reads_them(
    shuffle: SparkShuffle, spark: SparkSession
) -> None:
    rows = 2_000
    names = pa.array([f"name-{i % 37}" if i % 13 else None for i in range(rows)])
    table = pa.table(
        {
            "id": pa.array(range(rows), pa.int64()),
            "name": names.dictionary_encode(),
            "tags": pa.array([[f"t{i % 3}", f"t{i % 5}"] for i in range(rows)]),
            "point": pa.array([{"label": f"p{i % 4}", "x": i} for i in range(rows)]),
        }
    )
    with time_zone(spark, OTHER_ZONE), scratch_directory() as directory:
        for part in range(3):
            # pyarrow keeps the dictionary type in the file's Arrow schema and writes every
            # column dictionary-encoded.
            piece = table.slice(part * rows // 3, rows // 3 + 1)
            pq.write_table(piece, f"{directory}/part-{part}.parquet", use_dictionary=True)
        source = shuffle.read_parquet(directory)
        spark_source = spark.read.parquet(directory)
        assert_same_result(shuffle.repartition(source, "name", num_partitions=3), spark_source)
        ordered = shuffle.sort(shuffle.read_parquet(directory), ["name", "id"])
        assert_same_result(ordered, spark_source.orderBy("name", "id"))
        assert keys_in_order(ordered, ["id"]) == keys_in_order(
            spark_source.orderBy("name", "id"), ["id"]
        )
        right = spark_source.select("name", F.col("id").alias("other"))
        assert_same_result(
            shuffle.join(shuffle.read_parquet(directory), right, "name", "inner", broadcast="none"),
            spark_source.join(right, on="name"),
        )
