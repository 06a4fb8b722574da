"""``pyspark_shuffle.spark.internals``: a Spark Connect frame sized by its optimized plan's
statistics, and whether a Connect client draws a progress bar of its own."""

from __future__ import annotations

import pytest

from pyspark_shuffle.spark.internals import connect_progress_bar, estimated_bytes


class _PrintedPlan:
    """A Spark Connect DataFrame as the estimate sees it: what ``explain(mode="cost")`` prints."""

    def __init__(self, text: str) -> None:
        self._text = text

    def _explain_string(self, *, mode: str) -> str:
        assert mode == "cost"
        return self._text


_COST_PLAN = """== Optimized Logical Plan ==
Project [(id#0L % 7) AS k#2L, id#0L], Statistics(sizeInBytes={root})
+- Range (0, 4000, step=1, splits=Some(40)), Statistics(sizeInBytes=31.3 KiB, rowCount=4.00E+3)

== Physical Plan ==
*(1) Project [(id#0L % 7) AS k#2L, id#0L]
+- *(1) Range (0, 4000, step=1, splits=40)
"""


@pytest.mark.parametrize(
    ("root", "estimated"),
    [
        ("62.5 KiB", 64_000),
        ("1024.0 B", 1024),
        ("3.0 MiB, rowCount=1.00E+5", 3 << 20),
        ("8.0 EiB", 8 << 60),  # what Spark prints for a size it does not know
    ],
)
def test_a_connect_frame_is_sized_by_its_optimized_plans_root(root: str, estimated: int) -> None:
    frame = _PrintedPlan(_COST_PLAN.format(root=root))
    assert estimated_bytes(frame) == estimated  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "text", ["", "== Physical Plan ==\nRange (0, 10)", "== Optimized Logical Plan ==\nRange (0, 1)"]
)
def test_a_plan_printed_without_statistics_gives_no_estimate(text: str) -> None:
    assert estimated_bytes(_PrintedPlan(text)) is None  # type: ignore[arg-type]


def test_a_connect_client_draws_its_own_bar_where_its_shell_turned_it_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SPARK_CONNECT_PROGRESS_BAR_ENABLED", raising=False)
    assert not connect_progress_bar()
    monkeypatch.setenv("SPARK_CONNECT_PROGRESS_BAR_ENABLED", "1")  # what PySpark's shell sets
    assert connect_progress_bar()
