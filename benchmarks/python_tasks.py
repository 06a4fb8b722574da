"""What a Python task costs on ``local[2]``: ``--tasks`` tasks of one row each, in one run,
``--repeat`` times in turn:

- **as Spark starts it**: a ``mapInArrow`` that counts its rows;
- **as pyshuffle starts it**: the same, calling ``pyspark_shuffle.tasks.python_worker.task_starts``
  first (gc freeze, ``TCP_QUICKACK`` on the worker's socket), as every pyshuffle task does;
- **a JVM task**: the same partitions written to Spark's ``noop`` sink, no Python.

For each: the wall time, and the CPU the JVM spent (``/proc/<pid>/stat`` of Spark's JVM, user
plus system, children included) per task. The best of the repeats is saved.

    python benchmarks/python_tasks.py
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
from common import machine, positive, save_results
from pyspark.sql import SparkSession

from pyspark_shuffle.spark.local import local_spark_session
from pyspark_shuffle.tasks.python_worker import task_starts
from shuffle_runtime.ndarrays import longs

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results" / "python_tasks.json"


def count_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield pa.record_batch({"rows": longs([sum(batch.num_rows for batch in batches)])})


def count_rows_as_pyshuffle_starts(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    task_starts()
    return count_rows(batches)


def jvm_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(field) for field in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def spark_jvm() -> int:
    found = subprocess.run(
        ["pgrep", "-f", "org.apache.spark.deploy.SparkSubmit"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(found.stdout.split()[0])


def runs(session: SparkSession, tasks: int) -> dict[str, Callable[[], object]]:
    frame = session.range(0, tasks, 1, tasks)
    return {
        "as_spark_starts_it": lambda: frame.mapInArrow(count_rows, "rows long").collect(),
        "as_pyshuffle_starts_it": lambda: frame.mapInArrow(
            count_rows_as_pyshuffle_starts, "rows long"
        ).collect(),
        "jvm_task": lambda: frame.write.format("noop").mode("overwrite").save(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=positive, default=400)
    parser.add_argument("--repeat", type=positive, default=3)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args()
    best: dict[str, dict[str, float]] = {}
    with local_spark_session("python-tasks", conf={"spark.sql.adaptive.enabled": "false"}) as spark:
        jvm = spark_jvm()
        measured = runs(spark, args.tasks)
        for run in runs(spark, 8).values():  # untimed: workers and the JVM's code warm
            run()
        for _ in range(args.repeat):
            for name, run in measured.items():
                cpu, started = jvm_cpu_seconds(jvm), time.perf_counter()
                run()
                seconds = time.perf_counter() - started
                per_task_ms = 1e3 * (jvm_cpu_seconds(jvm) - cpu) / args.tasks
                print(f"{name:24} {seconds:6.2f} s   JVM CPU {per_task_ms:5.2f} ms a task")
                if name not in best or seconds < best[name]["seconds"]:
                    best[name] = {"seconds": seconds, "jvm_cpu_ms_per_task": per_task_ms}
    save_results(
        args.output,
        {
            "benchmark": "python_tasks",
            "parameters": {"tasks": args.tasks, "repeat": args.repeat, "master": "local[2]"},
            "results": best,
            "machine": machine(),
        },
    )


if __name__ == "__main__":
    main()
