"""Many map tasks and reducers: pyshuffle beside Spark's own shuffle, cell by cell, in one run.

Each cell of the grid map tasks x reducers shuffles ``max(--min-rows, --rows-per-block x maps
x reducers)`` rows of two longs (``k``, ``v``; made by ``spark.range`` in ``maps`` partitions)
by ``k`` into ``reducers`` partitions, and feeds every reducer to the same ``mapInArrow`` that
counts its rows:

- Spark: ``df.repartition(reducers, "k").mapInArrow(count)`` (AQE off, so Spark keeps every
  reducer, as pyshuffle does with ``num_partitions``);
- pyshuffle: ``SparkShuffle.repartition(df, "k", num_partitions=reducers).mapInArrow(count)``
  (run ``<service>``), and ``SparkShuffle.repartition_map(df, "k", count, ...)``, the same
  consumer run inside the reduce tasks (run ``<service>+fused``); on the default service
  (``netty_like``) and on the external one (a coordinator and two worker daemons on
  127.0.0.1, reducers reading through the workers).

And a floor, ``python_tasks``: as many Python tasks as pyshuffle's map stage ran (it reads
many small partitions in fewer map tasks: ``pyspark-shuffle.map.target-size``), then
``reducers``, doing nothing (``spark.range`` partitions fed to the counting ``mapInArrow``),
started as pyshuffle starts its tasks (``pyspark_shuffle.tasks.python_worker.task_starts``).
pyshuffle runs each map task and each reducer as a Python task, where Spark's map tasks stay
in the JVM: this floor says how close a Python-side shuffle can come. Each cell saves the map
tasks each pyshuffle run had.

Both must count every row; a cell that fails or passes ``--cell-timeout`` (600 s) is cancelled
and counts as failed (ratio 0), not skipped. Saved per cell: both times and their ratio
(Spark's time over pyshuffle's: above 1 is faster than Spark), and over the grid:

- ``speedup_min``: the smallest ratio of all cells and pyshuffle runs (goal >= 1.0);
- ``reduce_task_overhead_ms``: per pyshuffle run, what one more reducer costs pyshuffle minus
  what it costs Spark, from the two largest reducer counts at the smallest map count (goal <= 0);
- ``per_block_us``: per pyshuffle run, what one more block (map output x reducer) costs
  pyshuffle minus what it costs Spark, from the two largest map counts at the largest reducer count
  (goal <= 20).

    python benchmarks/many_partitions.py
    python benchmarks/many_partitions.py --maps 16,200 --reducers 200,1000 --services netty_like
    python benchmarks/many_partitions.py --conf spark.python.unix.domain.socket.enabled=true

With ``--uncoalesced``, pyshuffle runs one map task a partition
(``pyspark-shuffle.map.target-size=0``), as a stage of big splits does, on the grid map tasks
{1,000, 4,000} x reducers {1,000, 4,000} (unless ``--maps``/``--reducers`` say otherwise), and
the figures are saved in the same file beside the coalesced grid's (``uncoalesced``), with
``speedup_min_uncoalesced`` (goal >= 2.0) and ``per_block_us_uncoalesced`` (goal <= 3)::

    python benchmarks/many_partitions.py --uncoalesced

With ``--master local-cluster[2,1,1024]``: two executor JVMs, the default service keeping each
executor's partitions in its own Spark local directory, so reducers read across executors
through the data ports, as on two hosts::

    python benchmarks/many_partitions.py --master 'local-cluster[2,1,1024]' \\
        --maps 200 --reducers 1000 --services netty_like \\
        --output benchmarks/results/many_partitions_cluster.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyspark
from common import key_value, machine, positive, save_results
from pyspark.sql import DataFrame, SparkSession

from external_shuffle.local_cluster import LocalCluster
from pyspark_shuffle import SparkShuffle
from pyspark_shuffle.spark.local import local_spark_session
from pyspark_shuffle.tasks.python_worker import task_starts

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results" / "many_partitions.json"
SERVICES = ("netty_like", "external_shuffle")
SPARK = "spark"
FLOOR = "python_tasks"
FUSED = "+fused"
COUNT_SCHEMA = "rows long"
COALESCED_GRID = ([16, 200, 1000], [200, 1000, 4000])
UNCOALESCED_GRID = ([1000, 4000], [1000, 4000])
# One map task a partition: nothing is read together, as with splits of 128 MiB.
UNCOALESCED = {"pyspark-shuffle.map.target-size": 0}
GOALS = {"speedup_min": 1.0, "reduce_task_overhead_ms": 0.0, "per_block_us": 20.0}
UNCOALESCED_GOALS = {"speedup_min": 2.0, "per_block_us": 3.0}
UNCOALESCED_KEYS = ("speedup_min_uncoalesced", "per_block_us_uncoalesced", "uncoalesced")


def count_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield pa.record_batch({"rows": pa.array([sum(batch.num_rows for batch in batches)])})


def counts(text: str) -> list[int]:
    """An argument type: comma-separated integers >= 1."""
    return [positive(part) for part in text.split(",") if part.strip()]


def service_list(text: str) -> list[str]:
    """An argument type: a comma-separated subset of :data:`SERVICES`."""
    chosen = [part.strip() for part in text.split(",") if part.strip()]
    if not chosen or any(service not in SERVICES for service in chosen):
        raise argparse.ArgumentTypeError(f"services are a subset of {','.join(SERVICES)}")
    return chosen


@dataclass(frozen=True)
class Cell:
    maps: int
    reducers: int
    rows: int

    @property
    def name(self) -> str:
        return f"{self.maps}x{self.reducers}"


# A cell's job: from the cell's data, the frame of row counts to collect and the pyshuffle
# result to release after (None for Spark's own shuffle).
Job = Callable[[DataFrame, "Cell"], tuple[DataFrame, DataFrame | None]]


def spark_job(data: DataFrame, cell: Cell) -> tuple[DataFrame, DataFrame | None]:
    return data.repartition(cell.reducers, "k").mapInArrow(count_rows, COUNT_SCHEMA), None


def pyshuffle_job(shuffle: SparkShuffle, fused: bool) -> Job:
    def job(data: DataFrame, cell: Cell) -> tuple[DataFrame, DataFrame | None]:
        if fused:
            result = shuffle.repartition_map(
                data, "k", count_rows, COUNT_SCHEMA, num_partitions=cell.reducers
            )
            return result, result
        result = shuffle.repartition(data, "k", num_partitions=cell.reducers)
        return result.mapInArrow(count_rows, COUNT_SCHEMA), result

    return job


@dataclass(frozen=True)
class Measured:
    seconds: float | None
    """None if a row was missing or extra, the job failed, or it passed the cell's timeout."""
    map_tasks: int | None = None
    """The map tasks pyshuffle's map stage ran (None for Spark's own shuffle)."""


def measure(
    session: SparkSession, cell: Cell, job: Job, shuffle: SparkShuffle | None, timeout: float
) -> Measured:
    """Run ``job`` on ``cell`` and count every reducer's rows (past ``timeout`` it is
    cancelled)."""
    data = session.range(0, cell.rows, 1, cell.maps).selectExpr("id as k", "id * 2 as v")
    timer = threading.Timer(timeout, session.sparkContext.cancelAllJobs)
    timer.start()
    started = time.perf_counter()
    result: DataFrame | None = None
    map_tasks = None
    try:
        counted, result = job(data, cell)
        rows = sum(row.rows for row in counted.collect())
        seconds = time.perf_counter() - started
        if shuffle is not None and result is not None:
            map_tasks = shuffle.statistics(result).map_tasks
    except Exception as error:  # a failed or cancelled cell is a figure, not a crash
        print(f"    failed after {time.perf_counter() - started:.1f} s: {str(error)[:300]}")
        return Measured(None)
    finally:
        timer.cancel()
        if shuffle is not None and result is not None:
            shuffle.release(result)
    if rows != cell.rows:
        print(f"    {rows} rows arrived of {cell.rows}")
        return Measured(None, map_tasks)
    return Measured(seconds, map_tasks)


def count_rows_as_pyshuffle_starts(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    task_starts()
    return count_rows(batches)


def python_tasks_floor(session: SparkSession, cell: Cell, map_tasks: int) -> float:
    """Seconds of ``map_tasks`` then ``cell.reducers`` Python tasks that count nothing."""
    started = time.perf_counter()
    for tasks in (map_tasks, cell.reducers):
        frame = session.range(0, tasks, 1, tasks)
        frame.mapInArrow(count_rows_as_pyshuffle_starts, COUNT_SCHEMA).collect()
    return time.perf_counter() - started


def open_session(master: str, work: Path, settings: dict[str, str]) -> SparkSession:
    """``local[2]``, or a ``local-cluster`` whose executors keep their local directories (the
    default service's stores) apart under ``work``; with ``settings`` on top."""
    conf = {"spark.sql.adaptive.enabled": "false", **settings}
    if not master.startswith("local-cluster"):
        return local_spark_session("many-partitions", driver_memory="4g", conf=conf)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (
        SparkSession.builder.master(master)
        .appName("many-partitions")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "4g")
        .config("spark.local.dir", str(work / "local"))
        .config("spark.executorEnv.PYTHONPATH", os.pathsep.join(sys.path))
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def open_shuffle(
    stack: contextlib.ExitStack, session: SparkSession, service: str, settings: dict[str, Any]
) -> SparkShuffle:
    # The default service as a user gets it: each executor's store is its own local directory.
    options: dict[str, Any] = dict(settings)
    if service != "netty_like":
        # Stores apart: reducers read through the workers, as on hosts of their own.
        directory = stack.enter_context(tempfile.TemporaryDirectory(prefix=f"many-{service}-"))
        cluster = stack.enter_context(LocalCluster(Path(directory), workers=2, store_shared=False))
        options.update(cluster.client_config())
    return stack.enter_context(SparkShuffle(session, options))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--maps", type=counts, help="default 16,200,1000 (uncoalesced 1000,4000)")
    parser.add_argument(
        "--reducers", type=counts, help="default 200,1000,4000 (uncoalesced 1000,4000)"
    )
    parser.add_argument(
        "--uncoalesced",
        action="store_true",
        help="one map task a partition; saved beside the coalesced grid's figures",
    )
    parser.add_argument("--services", type=service_list, default=list(SERVICES))
    parser.add_argument("--rows-per-block", type=positive, default=4)
    parser.add_argument("--min-rows", type=positive, default=1_000_000)
    parser.add_argument("--cell-timeout", type=float, default=600.0)
    parser.add_argument("--master", default="local[2]", help="local[2] or local-cluster[...]")
    parser.add_argument(
        "--conf",
        type=key_value,
        action="append",
        default=[],
        help="KEY=VALUE, a Spark setting for every run (e.g."
        " spark.python.unix.domain.socket.enabled=true)",
    )
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args()
    settings = dict(args.conf)
    grid_maps, grid_reducers = UNCOALESCED_GRID if args.uncoalesced else COALESCED_GRID
    shuffle_settings: dict[str, Any] = UNCOALESCED if args.uncoalesced else {}

    cells = [
        Cell(maps, reducers, max(args.min_rows, args.rows_per_block * maps * reducers))
        for maps in sorted(args.maps or grid_maps)
        for reducers in sorted(args.reducers or grid_reducers)
    ]
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="many-partitions-")))
        session = open_session(args.master, work, settings)
        stack.callback(session.stop)
        jobs: dict[str, tuple[Job, SparkShuffle | None]] = {SPARK: (spark_job, None)}
        for service in args.services:
            opened = open_shuffle(stack, session, service, shuffle_settings)
            jobs[service] = (pyshuffle_job(opened, fused=False), opened)
            jobs[service + FUSED] = (pyshuffle_job(opened, fused=True), opened)
        runs = [name for name in jobs if name != SPARK]
        times: dict[str, dict[str, float | None]] = {name: {} for name in [*jobs, FLOOR]}
        map_tasks: dict[str, dict[str, int | None]] = {name: {} for name in runs}
        # Untimed: Python workers, the JVM's Arrow path, the daemons' first streams.
        for job, shuffle in jobs.values():
            measure(session, Cell(4, 8, 10_000), job, shuffle, args.cell_timeout)
        print(
            f"{'cell':>10} {'rows':>11} {'spark':>8} {'floor':>8}"
            + "".join(f"{run:>26}" for run in runs)
        )
        for cell in cells:
            for name, (job, shuffle) in jobs.items():
                measured = measure(session, cell, job, shuffle, args.cell_timeout)
                times[name][cell.name] = measured.seconds
                if name in map_tasks:
                    map_tasks[name][cell.name] = measured.map_tasks
            ran = [tasks for run in map_tasks.values() if (tasks := run[cell.name])]
            times[FLOOR][cell.name] = python_tasks_floor(session, cell, min(ran, default=cell.maps))
            print(_row(cell, times, runs), flush=True)

    summary = summarize(times, cells, runs, UNCOALESCED_GOALS if args.uncoalesced else GOALS)
    print(_summary_lines(summary))
    grid = {
        "machine": machine(pyspark=pyspark.__version__, pyarrow=pa.__version__),
        "parameters": {
            "master": args.master,
            "adaptive": False,
            "spark_settings": settings,
            "pyshuffle_settings": shuffle_settings,
            "rows_per_block": args.rows_per_block,
            "min_rows": args.min_rows,
            "cell_timeout_s": args.cell_timeout,
        },
        "cells": [
            {
                "maps": cell.maps,
                "reducers": cell.reducers,
                "rows": cell.rows,
                "spark_s": times[SPARK][cell.name],
                "python_tasks_floor_s": times[FLOOR][cell.name],
                **{
                    run: {
                        "seconds": times[run][cell.name],
                        "speedup": _speedup(times[SPARK][cell.name], times[run][cell.name]),
                        "map_tasks": map_tasks[run][cell.name],
                    }
                    for run in runs
                },
            }
            for cell in cells
        ],
        **summary,
    }
    save_results(args.output, with_grid(args.output, grid, uncoalesced=args.uncoalesced))


def with_grid(path: Path, grid: dict[str, Any], *, uncoalesced: bool) -> dict[str, Any]:
    """The document to save: the coalesced grid's figures at the top, the uncoalesced grid's
    under ``uncoalesced`` with its two headline figures beside them; the other grid's kept
    from ``path``."""
    saved = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    if not uncoalesced:
        kept = {key: saved[key] for key in UNCOALESCED_KEYS if key in saved}
        return {"benchmark": "many_partitions", **grid, **kept}
    headline = {
        "speedup_min_uncoalesced": grid["speedup_min"],
        "per_block_us_uncoalesced": grid["per_block_us"],
    }
    return {"benchmark": "many_partitions", **saved, **headline, "uncoalesced": grid}


def summarize(
    times: dict[str, dict[str, float | None]],
    cells: list[Cell],
    runs: list[str],
    goals: dict[str, float],
) -> dict[str, Any]:
    """``speedup_min`` over every cell and pyshuffle run, per run the per-reducer and
    per-block costs beyond Spark's (None where the grid lacks the cells they need), and
    ``speedup_ceiling_min``: the smallest ratio of Spark's time to the Python tasks' floor."""
    speedups = [
        _speedup(times[SPARK][cell.name], times[run][cell.name]) for cell in cells for run in runs
    ]
    maps = sorted({cell.maps for cell in cells})
    reducers = sorted({cell.reducers for cell in cells})
    overhead: dict[str, float | None] = {}
    per_block: dict[str, float | None] = {}
    for run in runs:
        overhead[run] = None
        if len(reducers) >= 2:
            fewer, more = f"{maps[0]}x{reducers[-2]}", f"{maps[0]}x{reducers[-1]}"
            extra = _growth_beyond_spark(times, run, fewer, more)
            if extra is not None:
                overhead[run] = 1e3 * extra / (reducers[-1] - reducers[-2])
        per_block[run] = None
        if len(maps) >= 2:
            fewer, more = f"{maps[-2]}x{reducers[-1]}", f"{maps[-1]}x{reducers[-1]}"
            extra = _growth_beyond_spark(times, run, fewer, more)
            if extra is not None:
                per_block[run] = 1e6 * extra / ((maps[-1] - maps[-2]) * reducers[-1])
    known = [speedup for speedup in speedups if speedup is not None]
    ceilings = [_speedup(times[SPARK][cell.name], times[FLOOR][cell.name]) for cell in cells]
    known_ceilings = [ceiling for ceiling in ceilings if ceiling is not None]
    return {
        "speedup_min": min(known) if known else None,
        "speedup_ceiling_min": min(known_ceilings) if known_ceilings else None,
        "reduce_task_overhead_ms": overhead,
        "per_block_us": per_block,
        "goals": goals,
    }


def _growth_beyond_spark(
    times: dict[str, dict[str, float | None]], run: str, fewer: str, more: str
) -> float | None:
    """How much more pyshuffle's time grew from cell ``fewer`` to cell ``more`` than Spark's
    did (None if a time is missing)."""
    ours = times[run].get(fewer), times[run].get(more)
    spark = times[SPARK].get(fewer), times[SPARK].get(more)
    if ours[0] is None or ours[1] is None or spark[0] is None or spark[1] is None:
        return None
    return (ours[1] - ours[0]) - (spark[1] - spark[0])


def _row(cell: Cell, times: dict[str, dict[str, float | None]], runs: list[str]) -> str:
    spark = times[SPARK][cell.name]
    floor = times[FLOOR][cell.name]
    row = f"{cell.name:>10} {cell.rows:>11,} {_seconds(spark):>8} {_seconds(floor):>8}"
    for run in runs:
        ours = times[run][cell.name]
        row += f"{_seconds(ours):>18} ({_ratio(spark, ours)})"
    return row


def _speedup(spark: float | None, ours: float | None) -> float | None:
    """Spark's time over pyshuffle's; 0 when pyshuffle failed, None when Spark did."""
    if spark is None:
        return None
    return 0.0 if ours is None else spark / ours


def _seconds(value: float | None) -> str:
    return "failed" if value is None else f"{value:.1f} s"


def _ratio(spark: float | None, ours: float | None) -> str:
    speedup = _speedup(spark, ours)
    return "-" if speedup is None else f"{speedup:.2f}x"


def _summary_lines(summary: dict[str, Any]) -> str:
    def shown(value: float | None, unit: str) -> str:
        return "n/a" if value is None else f"{value:.2f}{unit}"

    goals = summary["goals"]
    lines = [
        f"\nspeedup_min {shown(summary['speedup_min'], 'x')} (goal >= {goals['speedup_min']};"
        f" the Python tasks' floor allows {shown(summary['speedup_ceiling_min'], 'x')})"
    ]
    for run, value in summary["reduce_task_overhead_ms"].items():
        goal = goals.get("reduce_task_overhead_ms")
        lines.append(
            f"reduce_task_overhead_ms {run}: {shown(value, ' ms')}"
            + ("" if goal is None else f" (goal <= {goal})")
        )
    for run, value in summary["per_block_us"].items():
        lines.append(f"per_block_us {run}: {shown(value, ' us')} (goal <= {goals['per_block_us']})")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
