"""What pyshuffle's tasks load into a Python worker: not pandas, which Spark's own
``mapInArrow`` workers never import (some 27 MiB of anonymous memory and 0.2 s each); and the
Arrow memory pool they allocate from (``pyspark-shuffle.worker.memory-pool``)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pyarrow as pa
import pytest

pytestmark = pytest.mark.slow

# Its own application: the shared session's workers are reused, and a test's function may
# have imported pandas in them (a Python list made an Arrow array does).
_JOB = textwrap.dedent(
    """
    import json, os, sys
    import pyarrow as pa
    from pyspark_shuffle import SparkShuffle
    from pyspark_shuffle.spark.local import local_spark_session
    from shuffle_runtime.ndarrays import bytes_array, longs

    def report(batches):
        rows = sum(batch.num_rows for batch in batches)
        flags = [rows, int("pandas" in sys.modules), os.getpid()]
        pool = pa.default_memory_pool().backend_name
        yield pa.record_batch(
            [*(longs([flag]) for flag in flags), bytes_array([pool.encode()], pa.string())],
            names=["rows", "pandas", "pid", "pool"],
        )

    schema = "rows long, pandas long, pid long, pool string"
    with local_spark_session("worker-imports", cores=1) as spark:
        data = spark.range(0, 20_000, 1, 3).selectExpr("id % 101 as k", "id * 0.5 as v")
        with SparkShuffle(spark) as shuffle:
            results = {
                "repartition": shuffle.repartition(data, "k", num_partitions=4),
                "sort": shuffle.sort(data, "v"),
            }
            print(json.dumps({
                name: [row.asDict() for row in frame.mapInArrow(report, schema).collect()]
                for name, frame in results.items()
            }))
    """
)


@pytest.fixture(scope="module")
def reports() -> dict[str, list[dict[str, Any]]]:
    """Per result, what each of its tasks' workers reported."""
    done = subprocess.run(
        [sys.executable, "-c", _JOB], capture_output=True, text=True, timeout=300, check=True
    )
    reported: dict[str, list[dict[str, Any]]] = json.loads(done.stdout.strip().splitlines()[-1])
    return reported


def test_a_pyshuffle_task_does_not_import_pandas(reports: dict[str, list[dict[str, Any]]]) -> None:
    for name, rows in reports.items():
        assert sum(row["rows"] for row in rows) == 20_000, name
        assert [row["pandas"] for row in rows] == [0] * len(rows), (name, rows)


def test_a_pyshuffle_task_allocates_from_jemalloc(reports: dict[str, list[dict[str, Any]]]) -> None:
    """The default pool, where this pyarrow has it (pyarrow's own default is mimalloc). The
    repartition's ``mapInArrow`` runs inside its reducers (fused): in the worker of a pyshuffle
    task (the sort's runs in a worker of its own, which may not have run one)."""
    try:
        expected = pa.jemalloc_memory_pool().backend_name
    except NotImplementedError:
        expected = "system"
    assert {row["pool"] for row in reports["repartition"]} == {expected}
