"""``SparkShuffle.group_apply`` and ``cogroup_apply`` of an Arrow function wrapped by
``ArrowGroupFunction`` / ``ArrowCogroupFunction`` give what Spark's own ``applyInArrow`` gives
on the same data and function: the tables and key the function is handed (nullability
included), the rows of a result taken by name, and the error class and message of a result
Spark refuses (a type that is not exactly the declared one, a wrong name, a wrong count by
position, no table at all).

On the default service only: what differs is in the reduce tasks, the same for every
service."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Hashable, Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.errors import PythonException

from pyspark_shuffle import SparkShuffle
from pyspark_shuffle.driver.schemas import declared_schema
from pyspark_shuffle.spark.compat import SPARK_VERSION
from pyspark_shuffle.tasks.arrow_functions import ArrowCogroupFunction, ArrowGroupFunction
from pyspark_shuffle.tasks.pandas_functions import PandasSettings
from tests.integration.services import DEFAULT_SERVICE_ONLY
from tests.integration.spark_rows import canonical, multiset, rows_of

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = [
    DEFAULT_SERVICE_ONLY,
    pytest.mark.skipif(SPARK_VERSION < (4, 0), reason="applyInArrow: Spark 4.0"),
]

ZONE = "America/Los_Angeles"
BY_NAME = "spark.sql.legacy.execution.pandas.groupedMap.assignColumnsByName"


@pytest.fixture(scope="module")
def in_zone(spark: SparkSession) -> Iterator[None]:
    """The session in Los Angeles time while the module runs (put back after: the session is
    shared)."""
    key = "spark.sql.session.timeZone"
    before = spark.conf.get(key)
    spark.conf.set(key, ZONE)
    yield
    spark.conf.set(key, str(before))


@pytest.fixture
def by_position(spark: SparkSession) -> Iterator[None]:
    """Result columns taken by position, for one test."""
    spark.conf.set(BY_NAME, "false")
    yield
    spark.conf.unset(BY_NAME)


@pytest.fixture(scope="module")
def events(spark: SparkSession, in_zone: None) -> DataFrame:
    """k: 7 keys and a null one; id: never null (Spark's schema says so); n: an int with
    nulls; s: strings; t: timestamps."""
    frame: DataFrame = spark.range(0, 400, 1, 3).selectExpr(
        "case when id % 50 = 0 then null else id % 7 end as k",
        "id",
        "case when id % 3 = 0 then null else cast(id as int) end as n",
        "concat('s', id % 13) as s",
        "timestamp_seconds(1710000000 + id * 600) as t",
    )
    return frame.cache()


@pytest.fixture(scope="module")
def others(spark: SparkSession, in_zone: None) -> DataFrame:
    """Keys 4-9 and a null one (0-3 only in ``events``, 7-9 only here)."""
    frame: DataFrame = spark.range(0, 60, 1, 2).selectExpr(
        "case when id % 20 = 0 then null else id % 6 + 4 end as k", "id * 0.5d as w"
    )
    return frame.cache()


def _described(table: pa.Table) -> str:
    return f"{table.num_rows} rows of {table.schema}"


def _key_text(key: tuple[pa.Scalar, ...]) -> str:
    return repr([(type(scalar).__name__, str(scalar.type), scalar.as_py()) for scalar in key])


def _handed(key: tuple[pa.Scalar, ...], table: pa.Table) -> pa.Table:
    """What the function got: the key and the table's schema (nullability shown)."""
    return pa.table({"key": [_key_text(key)], "table": [_described(table)]})


def _handed_both(key: tuple[pa.Scalar, ...], left: pa.Table, right: pa.Table) -> pa.Table:
    return pa.table(
        {"key": [_key_text(key)], "left": [_described(left)], "right": [_described(right)]}
    )


def _ours(
    shuffle: SparkShuffle, spark: SparkSession, frame: DataFrame, function: Any, schema: str
) -> DataFrame:
    wrapped = ArrowGroupFunction.of(
        function, ["k"], declared_schema(schema, "test"), PandasSettings.of(spark)
    )
    return shuffle.group_apply(frame, "k", wrapped, schema)


def _ours_cogrouped(
    shuffle: SparkShuffle,
    spark: SparkSession,
    frames: tuple[DataFrame, DataFrame],
    function: Any,
    schema: str,
) -> DataFrame:
    wrapped = ArrowCogroupFunction.of(
        function, ["k"], declared_schema(schema, "test"), PandasSettings.of(spark)
    )
    return shuffle.cogroup_apply(*frames, "k", wrapped, schema)


def _counted(rows: list[dict[str, Any]]) -> Counter[Hashable]:
    return Counter(canonical(row) for row in rows)


def _error_line(error: PythonException) -> str:
    """The line of the worker's traceback that says what went wrong: ``[CLASS] message``."""
    found = re.search(r"\[(?:UDF_RETURN_TYPE|RESULT_[A-Z_]+)\][^\n]*", str(error))
    assert found, str(error)
    return found[0].strip()


def _outcome(frame: DataFrame) -> Counter[Hashable] | str:
    """The rows, or the error line of the failure."""
    try:
        return multiset(frame)
    except PythonException as error:
        return _error_line(error)


def test_the_function_is_handed_what_apply_in_arrow_hands_it(
    shuffle: SparkShuffle, spark: SparkSession, events: DataFrame
) -> None:
    schema = "key string, table string"
    rows = rows_of(_ours(shuffle, spark, events, _handed, schema))
    assert _counted(rows) == multiset(events.groupBy("k").applyInArrow(_handed, schema))
    assert len(rows) == 8
    # Every column nullable, as Spark hands them (its schema says id is never null).
    [described] = {row["table"].partition(" rows of ")[2] for row in rows}
    assert "id: int64\n" in described
    assert f"t: timestamp[us, tz={ZONE}]" in described


def test_the_cogrouped_tables_and_key_are_what_apply_in_arrow_hands(
    shuffle: SparkShuffle, spark: SparkSession, events: DataFrame, others: DataFrame
) -> None:
    schema = "key string, left string, right string"
    rows = rows_of(_ours_cogrouped(shuffle, spark, (events, others), _handed_both, schema))
    expected = events.groupBy("k").cogroup(others.groupBy("k")).applyInArrow(_handed_both, schema)
    assert _counted(rows) == multiset(expected)
    assert len(rows) == 11  # keys 0-9 and the null one
    # A key of the right side only: its key from the right, the left empty.
    only_right = [row for row in rows if row["key"] == _key_text((pa.scalar(9),))]
    assert [row["left"].partition(" of ")[0] for row in only_right] == ["0 rows"]


def _reordered(table: pa.Table) -> pa.Table:
    """Columns in another order than the schema's, and one computed."""
    doubled = pc.multiply(table.column("id"), 2)
    return table.select(["s", "k"]).append_column("double_id", doubled)


def _sums(left: pa.Table, right: pa.Table) -> pa.Table:
    return pa.table(
        {
            "w": pa.array([pc.sum(right.column("w")).as_py()], pa.float64()),
            "rows": pa.array([left.num_rows], pa.int64()),
        }
    )


def test_results_taken_by_name_equal_apply_in_arrows(
    shuffle: SparkShuffle, spark: SparkSession, events: DataFrame, others: DataFrame
) -> None:
    schema = "k long, double_id long, s string"
    got = multiset(_ours(shuffle, spark, events, _reordered, schema))
    assert got == multiset(events.groupBy("k").applyInArrow(_reordered, schema))
    assert sum(got.values()) == 400
    sums = "rows long, w double"
    got = multiset(_ours_cogrouped(shuffle, spark, (events, others), _sums, sums))
    expected = events.groupBy("k").cogroup(others.groupBy("k")).applyInArrow(_sums, sums)
    assert got == multiset(expected)


def _int32_into_bigint(table: pa.Table) -> pa.Table:
    return pa.table({"k": table.column("k"), "n": table.column("n")})


def _naive_timestamps(table: pa.Table) -> pa.Table:
    return pa.table({"k": table.column("k"), "t": table.column("t").cast(pa.timestamp("us"))})


def _timestamps_as_handed(table: pa.Table) -> pa.Table:
    return table.select(["k", "t"])


def _wrong_names(table: pa.Table) -> pa.Table:
    return pa.table({"k": table.column("k"), "w": table.column("n"), "v": table.column("n")})


def _not_a_table(table: pa.Table) -> tuple[int, ...]:
    return (table.num_rows,)


def _no_rows_no_columns(table: pa.Table) -> pa.Table:
    return pa.table({})


# Per function, its schema and whether Spark refuses what it returns.
CASES: dict[str, tuple[Callable[[pa.Table], Any], str, bool]] = {
    "int32-into-bigint": (_int32_into_bigint, "k long, n long", True),
    "naive-timestamps": (_naive_timestamps, "k long, t timestamp", True),
    "timestamps-as-handed": (_timestamps_as_handed, "k long, t timestamp", True),
    "wrong-names": (_wrong_names, "k long, n int", True),
    "not-a-table": (_not_a_table, "k long", True),
    "no-rows-no-columns": (_no_rows_no_columns, "k long, n int", False),
}


@pytest.mark.parametrize("case", CASES)
def test_a_result_fails_or_passes_as_in_apply_in_arrow(
    shuffle: SparkShuffle, spark: SparkSession, events: DataFrame, case: str
) -> None:
    function, schema, refused = CASES[case]
    expected = _outcome(events.groupBy("k").applyInArrow(function, schema))
    got = _outcome(_ours(shuffle, spark, events, function, schema))
    assert got == expected
    assert isinstance(got, str) == refused


def test_a_wrong_type_from_a_cogroup_fails_as_in_apply_in_arrow(
    shuffle: SparkShuffle, spark: SparkSession, events: DataFrame, others: DataFrame
) -> None:
    def int32_rows(left: pa.Table, right: pa.Table) -> pa.Table:
        return pa.table({"rows": pa.array([left.num_rows], pa.int32())})

    schema = "rows long"
    cogrouped = events.groupBy("k").cogroup(others.groupBy("k"))
    expected = _outcome(cogrouped.applyInArrow(int32_rows, schema))
    got = _outcome(_ours_cogrouped(shuffle, spark, (events, others), int32_rows, schema))
    assert isinstance(got, str)
    assert got == expected
    assert "column 'rows' (expected int64, actual int32)" in got


@pytest.mark.usefixtures("by_position")
@pytest.mark.skipif(SPARK_VERSION < (4, 3), reason="Spark checks the count from 4.3 (in Python)")
def test_by_position_names_are_ignored_and_a_wrong_count_fails(
    shuffle: SparkShuffle, spark: SparkSession, events: DataFrame
) -> None:
    schema = "a long, b string"

    def renamed(table: pa.Table) -> pa.Table:
        return pa.table({"x": table.column("k"), "y": table.column("s")})

    got = _outcome(_ours(shuffle, spark, events, renamed, schema))
    assert got == _outcome(events.groupBy("k").applyInArrow(renamed, schema))
    assert isinstance(got, Counter)
    assert sum(got.values()) == 400
    expected = _outcome(events.groupBy("k").applyInArrow(_wrong_names, schema))
    got = _outcome(_ours(shuffle, spark, events, _wrong_names, schema))
    assert got == expected
    assert isinstance(got, str)
    assert got.endswith("Expected: 2 Actual: 3")
