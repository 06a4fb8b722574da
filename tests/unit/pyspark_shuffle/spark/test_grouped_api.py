"""PySpark's grouped API as the drop-in switch reads it: the keys a groupBy names, the form a
function takes, the notes on UDF calls, and wrapping methods that are put back as they were."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pandas as pd
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 (Spark's own spelling)
from pyspark.sql.pandas.functions import pandas_udf

from pyspark_shuffle.spark.compat import SPARK_VERSION
from pyspark_shuffle.spark.grouped_api import (
    GROUPED_AGG_PANDAS,
    MethodPatches,
    iterator_form,
    keep_udf_call,
    key_names,
    note_udf_call,
    udf_call_of,
)


@pytest.fixture(scope="module")
def frame(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame([(1, 2.0, "a")], "k long, value double, Name string")


# Columns are made in the tests: a Column needs a running session.
KEYS: dict[str, tuple[Callable[[DataFrame], list[object]], tuple[str, ...]]] = {
    "names": (lambda frame: ["k"], ("k",)),
    "names by case": (lambda frame: ["K", "name"], ("k", "Name")),  # as Spark by default
    "columns": (lambda frame: [F.col("k"), F.col("`value`")], ("k", "value")),
    "the frame's columns": (lambda frame: [frame.k, frame["value"]], ("k", "value")),
}


@pytest.mark.parametrize("case", sorted(KEYS))
def test_keys_that_name_columns_resolve_to_them(frame: DataFrame, case: str) -> None:
    keys, names = KEYS[case]
    assert key_names(frame, keys(frame), case_sensitive=False) == names


NOT_KEYS: dict[str, Callable[[], object]] = {
    "expression": lambda: F.col("k") % 2,
    "aliased literal": lambda: F.lit(1).alias("k"),
    "alias": lambda: F.col("k").alias("j"),
    "ordinal": lambda: 1,
    "dotted": lambda: "k.field",
    "missing": lambda: "missing",
}


@pytest.mark.parametrize("case", sorted(NOT_KEYS))
def test_what_is_not_a_column_of_the_frame_is_no_key(frame: DataFrame, case: str) -> None:
    assert key_names(frame, [NOT_KEYS[case]()], case_sensitive=False) is None


def test_a_case_sensitive_session_resolves_exact_names_only(frame: DataFrame) -> None:
    assert key_names(frame, ["k"], case_sensitive=True) == ("k",)
    assert key_names(frame, ["K"], case_sensitive=True) is None


def test_names_equal_but_for_case_are_ambiguous(spark: SparkSession) -> None:
    both = spark.createDataFrame([(1, 2)], "a long, A long")
    assert key_names(both, ["a"], case_sensitive=False) == ("a",)
    assert key_names(both, ["B"], case_sensitive=False) is None
    assert key_names(both, [F.col("`A`")], case_sensitive=False) == ("A",)


def _plain(pdf: pd.DataFrame) -> pd.DataFrame:
    return pdf


def _batches(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    yield from batches


def test_only_iterator_hints_choose_the_iterator_form() -> None:
    assert not iterator_form(_plain, arrow=False)
    assert not iterator_form(lambda pdf: pdf, arrow=False)
    assert iterator_form(_batches, arrow=False) == (SPARK_VERSION >= (4, 1))


def test_a_udf_call_is_noted_and_kept_through_an_alias(spark: SparkSession) -> None:
    @pandas_udf("double")  # type: ignore[call-overload, untyped-decorator]
    def mean(values: pd.Series) -> float:
        return float(values.mean())

    udf = mean._unwrapped  # what __call__ runs on
    column = mean("value")
    note_udf_call(column, udf, ("value",), keywords=False)
    call = udf_call_of(column)
    assert call is not None
    assert call.eval_type == GROUPED_AGG_PANDAS and call.arguments == ("value",)
    assert call.function(pd.Series([1.0, 3.0])) == 2.0
    aliased = column.alias("m")
    assert udf_call_of(aliased) is None
    keep_udf_call(aliased, column)
    assert udf_call_of(aliased) == call
    # Keyword arguments: noted as such (their order is the function's to decide).
    by_keyword = mean(values=F.col("value"))
    note_udf_call(by_keyword, udf, (), keywords=True)
    keyword_call = udf_call_of(by_keyword)
    assert keyword_call is not None
    assert keyword_call.keywords and keyword_call.arguments == ()
    assert not call.keywords
    assert udf_call_of(F.col("value")) is None


class _Base:
    def greet(self) -> str:
        return "base"


class _Own(_Base):
    def own(self) -> str:
        return "own"


def test_wrapped_methods_are_put_back_as_they_were() -> None:
    patches = MethodPatches()
    louder = lambda original: lambda self: original(self).upper()  # noqa: E731
    patches.install(_Own, "greet", louder)  # inherited
    patches.install(_Own, "own", louder)
    patches.install(_Own, "own", louder)  # once only
    patches.install(_Own, "absent", louder)  # this class lacks it: left alone
    assert (_Own().greet(), _Own().own(), _Base().greet()) == ("BASE", "OWN", "base")
    assert patches and not hasattr(_Own, "absent")
    patches.remove_all()
    assert (_Own().greet(), _Own().own()) == ("base", "own")
    assert "greet" not in _Own.__dict__ and not patches
