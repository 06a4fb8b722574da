"""The switch across a session's end: a session stopped and made again (as a notebook's
kernel restart or a job's second ``getOrCreate`` does) is enabled afresh, routes its calls and
gives Spark's answers; the stopped session's switch is dropped, not reused. In a process of its
own, since it stops its sessions (classic, or a Connect client under
``TEST_SPARK_SESSION=connect``)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from tests.conftest import TEST_SPARK

pytestmark = pytest.mark.slow

_JOB = textwrap.dedent(
    """
    import contextlib, json, sys
    import pandas as pd
    from pyspark.sql import SparkSession
    import pyspark_shuffle
    from pyspark_shuffle.spark.local import local_connect_server, local_spark_session

    CONFIG = {
        "shuffle-service-factory.class": sys.argv[2],
        "pyspark-shuffle.dropin.min-input-size": 0,
    }

    def totals(pdf):
        return pd.DataFrame({"k": [pdf["k"].iloc[0]], "n": [len(pdf)], "v": [pdf["v"].sum()]})

    def rows(spark):
        frame = spark.range(0, 3_000, 1, 3).selectExpr("id % 7 as k", "id * 0.5 as v")
        result = frame.groupBy("k").applyInPandas(totals, "k long, n long, v double")
        return sorted(tuple(row) for row in result.collect())

    def one_session(make):
        spark = make()
        expected = rows(spark)
        switch = pyspark_shuffle.enable(spark, CONFIG)
        got = rows(spark)
        call = switch.calls[-1]
        spark.stop()
        return switch, {
            "path": call.path, "equal": got == expected, "rows": len(got), "reason": call.reason
        }

    with contextlib.ExitStack() as stack:
        if sys.argv[1] == "connect":
            url = stack.enter_context(local_connect_server(cores=1))
            make = lambda: SparkSession.builder.remote(url).getOrCreate()
        else:
            make = lambda: local_spark_session("dropin-restart", cores=1)
        first, first_report = one_session(make)
        second, second_report = one_session(make)
    print(json.dumps({"first": first_report, "second": second_report,
                      "same_switch": first is second}))
    """
)


@pytest.fixture(scope="module", params=["netty_like"])
def report(request: pytest.FixtureRequest) -> dict[str, Any]:
    """What the job saw, on the default service (the one whose state lives in the session's
    processes; ``make connect`` runs the ``netty_like`` cases)."""
    done = subprocess.run(
        [sys.executable, "-c", _JOB, TEST_SPARK, request.param],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    reported: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return reported


def test_a_session_made_again_is_enabled_afresh(report: dict[str, Any]) -> None:
    assert not report["same_switch"]
    for session in ("first", "second"):
        seen = report[session]
        assert (seen["path"], seen["equal"], seen["rows"]) == ("pyshuffle", True, 7), (
            session,
            seen,
        )
