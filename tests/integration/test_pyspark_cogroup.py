"""``SparkShuffle.cogroup_apply`` returns what Spark's own
``groupBy(keys).cogroup(other.groupBy(keys)).applyInArrow`` returns on the same data and
function: an as-of join per symbol (with and without the key argument), keys on one side only,
two key columns, null keys and an empty side."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pytest

from pyspark_shuffle import SparkShuffle
from shuffle_api import InvalidOperationError
from tests.integration.services import DEFAULT_SERVICE_ONLY
from tests.integration.spark_rows import multiset, rows_of

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from pyspark.sql import DataFrame, SparkSession


@pytest.fixture(scope="module")
def trades(spark: SparkSession) -> DataFrame:
    """3,000 trades of symbols 0-39 (0-2 never quoted) and of a null symbol, on venues 0-1."""
    frame: DataFrame = spark.range(0, 3000, 1, 3).selectExpr(
        "case when id % 97 = 0 then null else id % 40 end as sym",
        "id % 2 as venue",
        "id as trade",
        "id * 2 as t",
    )
    return frame.cache()


@pytest.fixture(scope="module")
def quotes(spark: SparkSession) -> DataFrame:
    """2,000 quotes of symbols 3-47 (40-47 never traded) and of a null symbol, on venues
    0-2."""
    frame: DataFrame = spark.range(0, 2000, 1, 2).selectExpr(
        "case when id % 89 = 0 then null else id % 45 + 3 end as sym",
        "id % 3 as venue",
        "id * 3 + 1 as t",
        "id / 2 as bid",
    )
    return frame.cache()


AS_OF_SCHEMA = "sym long, trade long, bid double"


def _as_of(trades: pa.Table, quotes: pa.Table) -> pa.Table:
    """Each trade with the bid of the last quote at or before it (null where there is none)."""
    quotes = quotes.sort_by("t")
    times = quotes.column("t").to_numpy()
    last = np.searchsorted(times, trades.column("t").to_numpy(), side="right") - 1
    return pa.table(
        {
            "sym": trades.column("sym"),
            "trade": trades.column("trade"),
            "bid": quotes.column("bid").take(pa.array(last, mask=last < 0)),
        }
    )


def _as_of_with_key(key: tuple[pa.Scalar, ...], trades: pa.Table, quotes: pa.Table) -> pa.Table:
    matched = _as_of(trades, quotes)
    symbols = pa.array([key[0].as_py()] * trades.num_rows, pa.int64())
    return matched.set_column(0, "sym", symbols)


SIZES_SCHEMA = "key string, trades long, quotes long"


def _sizes(key: tuple[pa.Scalar, ...], trades: pa.Table, quotes: pa.Table) -> pa.Table:
    """The key as Spark passes it, and each side's rows of it."""
    return pa.table(
        {
            "key": [repr(tuple(scalar.as_py() for scalar in key))],
            "trades": pa.array([trades.num_rows], pa.int64()),
            "quotes": pa.array([quotes.num_rows], pa.int64()),
        }
    )


def _spark_cogroup(
    left: DataFrame,
    right: DataFrame,
    keys: Sequence[str],
    function: Callable[..., pa.Table],
    schema: str,
) -> DataFrame:
    return left.groupBy(*keys).cogroup(right.groupBy(*keys)).applyInArrow(function, schema)


@pytest.mark.parametrize("function", [_as_of, _as_of_with_key], ids=["tables", "key-tables"])
def test_as_of_per_symbol_equals_spark_cogroup_apply_in_arrow(
    shuffle: SparkShuffle,
    trades: DataFrame,
    quotes: DataFrame,
    function: Callable[..., pa.Table],
) -> None:
    result = shuffle.cogroup_apply(trades, quotes, "sym", function, AS_OF_SCHEMA)
    expected = _spark_cogroup(trades, quotes, ["sym"], function, AS_OF_SCHEMA)
    got = multiset(result)
    assert got == multiset(expected)
    assert sum(got.values()) == 3000
    statistics = shuffle.statistics(result)
    assert statistics.rows_read >= 5000
    assert statistics.reducers >= 1


def test_keys_on_one_side_only_and_null_keys(
    shuffle: SparkShuffle, trades: DataFrame, quotes: DataFrame
) -> None:
    result = shuffle.cogroup_apply(trades, quotes, "sym", _sizes, SIZES_SCHEMA)
    got = {row["key"]: (row["trades"], row["quotes"]) for row in rows_of(result)}
    assert multiset(result) == multiset(
        _spark_cogroup(trades, quotes, ["sym"], _sizes, SIZES_SCHEMA)
    )
    # Symbols 0-2 never quoted, 40-47 never traded; the null symbol on both sides, one key.
    assert len(got) == 48 + 1
    assert all(got[repr((sym,))][1] == 0 for sym in range(3))
    assert all(got[repr((sym,))][0] == 0 for sym in range(40, 48))
    assert got[repr((None,))] == (31, 23)


@DEFAULT_SERVICE_ONLY
def test_two_key_columns_and_a_chain_reading_the_result(
    shuffle: SparkShuffle, trades: DataFrame, quotes: DataFrame
) -> None:
    keys = ["sym", "venue"]
    result = shuffle.cogroup_apply(trades, quotes, keys, _sizes, SIZES_SCHEMA, num_partitions=3)
    assert multiset(result) == multiset(_spark_cogroup(trades, quotes, keys, _sizes, SIZES_SCHEMA))
    assert shuffle.statistics(result).reducers == 3
    # The next operation reads the result's tasks, not rows from the JVM.
    again = shuffle.repartition(result, "key")
    assert shuffle.statistics(again).fused_inputs == 1
    assert multiset(again) == multiset(result)


@DEFAULT_SERVICE_ONLY
def test_an_empty_side_is_an_empty_table_of_its_schema(
    shuffle: SparkShuffle, trades: DataFrame, quotes: DataFrame
) -> None:
    no_trades = trades.filter("sym < 0")
    result = shuffle.cogroup_apply(no_trades, quotes, "sym", _sizes, SIZES_SCHEMA)
    rows = rows_of(result)
    assert multiset(result) == multiset(
        _spark_cogroup(no_trades, quotes, ["sym"], _sizes, SIZES_SCHEMA)
    )
    # Every quoted symbol once, its key taken from the quotes.
    assert len(rows) == 45 + 1
    assert {row["trades"] for row in rows} == {0}


@DEFAULT_SERVICE_ONLY
def test_a_key_missing_or_of_other_types_on_a_side_is_refused(
    shuffle: SparkShuffle, trades: DataFrame, quotes: DataFrame
) -> None:
    with pytest.raises(InvalidOperationError, match=r"right side.*'trade'"):
        shuffle.cogroup_apply(trades, quotes, "trade", _sizes, SIZES_SCHEMA)
    as_text = quotes.selectExpr("cast(sym as string) as sym", "bid")
    with pytest.raises(InvalidOperationError, match="'sym' is bigint on the left but string"):
        shuffle.cogroup_apply(trades, as_text, "sym", _sizes, SIZES_SCHEMA)
