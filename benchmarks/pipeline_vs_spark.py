"""A Python user's pipeline through pyshuffle (fused, Parquet in and out) vs the same pipeline in
Spark, side by side in one run on the same Parquet files.

Data (written first, by Spark): ``--rows`` events (default 10M) of a ``user`` with ``--users``
values (default 100k), a timestamp ``at``, a float64 ``amount``, a ``category`` string (8
values) and a ~20-byte ``text``; and a ``--users``-row dimension of ``user`` -> ``segment``.

Pipeline: per user, a Python function summarizes each category of the user's events (rows,
amount, first and last time) -> join with the dimension -> totals per segment and category ->
global sort by amount -> Parquet.

- pyshuffle: ``read_parquet`` (both inputs), ``group_apply`` (the function), ``join``,
  ``group_apply`` (totals), ``sort``, ``write_parquet``: every stage fused into the next.
- Spark, as a Python user writes it: ``spark.read.parquet``, ``groupBy().applyInArrow`` with
  the same function (and once ``applyInPandas`` with its pandas twin), Spark's join,
  ``groupBy().agg``, ``orderBy``, ``write.parquet``.

Besides the times and ratios it prints the data that crossed between the JVM and Python in
pyshuffle's run, read from Spark's own SQL metrics (the Python nodes' "data sent to Python
workers", "data returned from Python workers" and the rows in and out of them, from Spark's
REST API): the tasks' own control rows (task descriptions in, one metadata row per task out)
apart from data rows. Both pipelines' outputs are read back and compared. Last, it times
``summarize`` alone on every user's events: no engine that calls it once per group can take
less than that over the cores, which caps the ratio any engine could reach
(``ceiling_speedup_vs_arrow``, ``ceiling_speedup_vs_pandas``).

Then single operations, Parquet in and out, each beside Spark's own on the same files: the join
of all event columns with the dimension (inner and left; both sides broadcast the dimension)
and a global sort of the events by amount (``speedup_join``: the slower of the two joins'
ratios; ``speedup_sort``). Their outputs are compared by row count, totals and, for the sort,
the order of amounts. ``--skip-operations`` leaves them out.

Each figure is the median of ``--repeat`` runs (applyInPandas: one run). Printed, and saved as
JSON (``--output``, default ``benchmarks/results/pipeline_vs_spark.json``)::

    python benchmarks/pipeline_vs_spark.py
    python benchmarks/pipeline_vs_spark.py --rows 1000000 --users 10000 --repeat 1 --skip-pandas
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import re
import shutil
import statistics
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from common import machine, save_results
from pyspark.sql import SparkSession
from pyspark.sql import functions as sf

from pyspark_shuffle import SparkShuffle
from pyspark_shuffle.spark.local import local_spark_session
from shuffle_runtime.ports import free_ports

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results" / "pipeline_vs_spark.json"
UTC = pa.timestamp("us", tz="UTC")
CATEGORIES = 8
SEGMENTS = 10
SUMMARY_SCHEMA = (
    "user long, category string, events long, amount double, first_at timestamp, last_at timestamp"
)
TOTALS_SCHEMA = "segment string, category string, users long, events long, amount double"
# The columns of pyshuffle's control frames: each row is one task's description.
CONTROL_COLUMNS = frozenset({"row_groups", "reducer", "result_id", "map_index", "producer"})


def summarize(table: pa.Table) -> pa.Table:
    """One user's events: rows, amount and first and last time per category."""
    grouped = table.group_by("category").aggregate(
        [("amount", "count"), ("amount", "sum"), ("at", "min"), ("at", "max")]
    )
    return pa.table(
        {
            "user": pa.array([table["user"][0].as_py()] * grouped.num_rows, pa.int64()),
            "category": grouped["category"],
            "events": grouped["amount_count"],
            "amount": grouped["amount_sum"],
            # Spark's applyInArrow wants UTC timestamps back, whatever the session's time zone.
            "first_at": grouped["at_min"].cast(UTC),
            "last_at": grouped["at_max"].cast(UTC),
        }
    )


def summarize_pandas(frame: pd.DataFrame) -> pd.DataFrame:
    grouped = frame.groupby("category", sort=False).agg(
        events=("amount", "count"),
        amount=("amount", "sum"),
        first_at=("at", "min"),
        last_at=("at", "max"),
    )
    grouped = grouped.reset_index()
    grouped.insert(0, "user", frame["user"].iloc[0])
    return grouped[["user", "category", "events", "amount", "first_at", "last_at"]]


def totals(table: pa.Table) -> pa.Table:
    """One segment and category: users, events and amount."""
    return pa.table(
        {
            "segment": table["segment"][:1],
            "category": table["category"][:1],
            "users": pa.array([table.num_rows], pa.int64()),
            "events": pa.array([pc.sum(table["events"]).as_py()], pa.int64()),
            "amount": pa.array([pc.sum(table["amount"]).as_py()], pa.float64()),
        }
    )


def write_data(spark: SparkSession, root: Path, rows: int, users: int) -> tuple[str, str]:
    events, dimension = str(root / "events"), str(root / "users")
    spark.range(0, rows, 1, 16).selectExpr(
        f"cast(pmod(xxhash64(id), {users}) as long) as user",
        "timestamp_seconds(1700000000 + id % 2592000) as at",
        "rand(7) * 100 as amount",
        f"concat('category-', cast(pmod(xxhash64(id, 1), {CATEGORIES}) as string)) as category",
        "substr(concat('note ', sha2(cast(id % 1000 as string), 256)), 1, 20) as text",
    ).write.parquet(events)
    spark.range(0, users, 1, 2).selectExpr(
        "id as user", f"concat('segment-', cast(id % {SEGMENTS} as string)) as segment"
    ).write.parquet(dimension)
    return events, dimension


def through_pyshuffle(shuffle: SparkShuffle, events: str, dimension: str, out: str) -> None:
    source = shuffle.read_parquet(events, columns=["user", "at", "amount", "category"])
    users = shuffle.read_parquet(dimension)
    summary = shuffle.group_apply(source, "user", summarize, SUMMARY_SCHEMA)
    joined = shuffle.join(summary, users, "user")
    per_segment = shuffle.group_apply(joined, ["segment", "category"], totals, TOTALS_SCHEMA)
    ranked = shuffle.sort(per_segment, ["amount"], ascending=False)
    shuffle.write_parquet(ranked, out, mode="overwrite")


def through_spark(spark: SparkSession, events: str, dimension: str, out: str, pandas: bool) -> None:
    source = spark.read.parquet(events).select("user", "at", "amount", "category")
    grouped = source.groupBy("user")
    summary = (
        grouped.applyInPandas(summarize_pandas, SUMMARY_SCHEMA)
        if pandas
        else grouped.applyInArrow(summarize, SUMMARY_SCHEMA)
    )
    joined = summary.join(spark.read.parquet(dimension), "user")
    per_segment = joined.groupBy("segment", "category").agg(
        sf.count("*").alias("users"),
        sf.sum("events").alias("events"),
        sf.sum("amount").alias("amount"),
    )
    per_segment.orderBy(sf.desc("amount")).write.mode("overwrite").parquet(out)


def function_floor(events: str, cores: int) -> float:
    """Seconds that calling ``summarize`` on every user's events takes by itself, spread evenly
    over ``cores``: a floor under any engine that calls it once per group, as both pipelines do
    (groups sliced beforehand, in the driver, outside the timing)."""
    table = pq.read_table(events, columns=["user", "at", "amount", "category"])
    table = table.take(pc.sort_indices(table, [("user", "ascending")]))
    counts = pc.value_counts(table["user"]).field("counts").to_numpy()
    offsets = [0, *counts.cumsum().tolist()]
    groups = [table.slice(start, end - start) for start, end in itertools.pairwise(offsets)]
    started = time.process_time()
    for group in groups:
        summarize(group)
    return (time.process_time() - started) / cores


def join_through_pyshuffle(
    shuffle: SparkShuffle, events: str, dimension: str, out: str, how: str
) -> None:
    joined = shuffle.join(
        shuffle.read_parquet(events), shuffle.read_parquet(dimension), "user", how
    )
    shuffle.write_parquet(joined, out, mode="overwrite")


def join_through_spark(
    spark: SparkSession, events: str, dimension: str, out: str, how: str
) -> None:
    joined = spark.read.parquet(events).join(spark.read.parquet(dimension), "user", how)
    joined.write.mode("overwrite").parquet(out)


def sort_through_pyshuffle(shuffle: SparkShuffle, events: str, out: str) -> None:
    ordered = shuffle.sort(shuffle.read_parquet(events), ["amount"])
    shuffle.write_parquet(ordered, out, mode="overwrite")


def sort_through_spark(spark: SparkSession, events: str, out: str) -> None:
    spark.read.parquet(events).orderBy("amount").write.mode("overwrite").parquet(out)


def same_join(ours: str, theirs: str) -> bool:
    """Equal rows, totals and rows per segment (nulls for the left join's unmatched)."""
    mine, spark = (pq.read_table(path, columns=["amount", "segment"]) for path in (ours, theirs))
    per_segment = [
        sorted(pc.value_counts(table["segment"]).to_pylist(), key=lambda row: str(row["values"]))
        for table in (mine, spark)
    ]
    return (
        mine.num_rows == spark.num_rows
        and abs(pc.sum(mine["amount"]).as_py() - pc.sum(spark["amount"]).as_py()) < 1e-3
        and per_segment[0] == per_segment[1]
    )


def same_order(ours: str, theirs: str) -> bool:
    """The files, read in order, give the same amounts in the same (ascending) order."""
    mine, spark = (pq.read_table(path, columns=["amount"])["amount"] for path in (ours, theirs))
    return mine.equals(spark) and bool(pc.all(pc.less_equal(mine[:-1], mine[1:])).as_py())


def timed(runs: int, run: Callable[[], None]) -> float:
    seconds = []
    for _ in range(runs):
        started = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def output_rows(path: str) -> Counter[tuple[Any, ...]]:
    """The rows written, amounts rounded (sums in another order differ in the last bits)."""
    table = pq.read_table(path, columns=["segment", "category", "users", "events", "amount"])
    return Counter(
        (row["segment"], row["category"], row["users"], row["events"], round(row["amount"], 3))
        for row in table.to_pylist()
    )


# -- Spark's own metrics ---------------------------------------------------------------------

PYTHON_BYTES = ("data sent to Python workers", "data returned from Python workers")


def _rest(spark: SparkSession, path: str) -> Any:
    context = spark.sparkContext
    url = f"{context.uiWebUrl}/api/v1/applications/{context.applicationId}/{path}"
    with urllib.request.urlopen(url) as reply:
        return json.load(reply)


def _total(value: str) -> float:
    """A metric as the UI prints it (``1,234``, ``976.0 B``, or ``total (min, ...)\n1.2 MiB
    (...)``): its total, in bytes for sizes."""
    line = value.split("\n")[1] if value.startswith("total") else value
    match = re.match(r"\s*([\d.,]+)\s*(B|KiB|MiB|GiB|TiB)?", line)
    if match is None:
        return 0.0
    scale = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
    return float(match.group(1).replace(",", "")) * scale[match.group(2) or "B"]


def map_stage_rows(spark: SparkSession, after_stage: int) -> dict[str, float]:
    """pyshuffle's map stages run as RDD jobs, which have no SQL metrics: Spark's task metrics
    of their stages say what they read from storage (rows handed to Python) and what Python
    returned (the metadata rows they shuffle to the driver, one per task)."""
    found = {"map_stage_rows_read": 0.0, "map_stage_rows_from_python": 0.0, "map_tasks": 0.0}
    for stage in _rest(spark, "stages"):
        if stage["stageId"] <= after_stage or stage["status"] != "COMPLETE":
            continue
        if "pyshuffle: map stage" not in (stage.get("description") or ""):
            continue
        found["map_stage_rows_read"] += stage["inputRecords"]
        if stage["shuffleWriteRecords"]:  # the stage of the map tasks, not the collect's
            found["map_stage_rows_from_python"] += stage["shuffleWriteRecords"]
            found["map_tasks"] += stage["numCompleteTasks"]
    return found


PYTHON_NODES = re.compile(r"^\(\d+\) (MapInArrow|FlatMapGroupsIn\w+|\w*Python\w*)$", re.MULTILINE)


def _python_inputs(plan: str) -> list[set[str]]:
    """The input columns of every Python node in a physical plan's description."""
    inputs = []
    for match in PYTHON_NODES.finditer(plan):
        section = plan[match.end() :].split("\n\n", 1)[0]
        line = re.search(r"^Input \[\d+\]: \[(.*)\]$", section, re.MULTILINE)
        inputs.append(set(re.findall(r"(\w+)#\d+", line.group(1))) if line else set())
    return inputs


def python_rows(spark: SparkSession, after_execution: int) -> dict[str, float]:
    """Rows Spark's scans fed into the SQL executions after ``after_execution`` that run
    Python: pyshuffle's control rows (every Python node's input is a task's description) or
    data rows (any other)."""
    found = {
        "control_rows_to_python": 0.0,
        "data_rows_to_python": 0.0,
        "bytes_to_python": 0.0,
        "bytes_from_python": 0.0,
    }
    for execution in _rest(spark, "sql?details=true&planDescription=true&length=100000"):
        inputs = _python_inputs(execution.get("planDescription", ""))
        if execution["id"] <= after_execution or not inputs:
            continue
        control = all(columns and columns <= CONTROL_COLUMNS for columns in inputs)
        rows = sum(
            _total(metric["value"])
            for node in execution["nodes"]
            if node["nodeName"].startswith(("Scan", "InMemoryTableScan", "Range", "LocalTableScan"))
            for metric in node["metrics"]
            if metric["name"] == "number of output rows"
        )
        found["control_rows_to_python" if control else "data_rows_to_python"] += rows
        for node in execution["nodes"]:
            for metric in node["metrics"]:
                if metric["name"] == PYTHON_BYTES[0]:
                    found["bytes_to_python"] += _total(metric["value"])
                elif metric["name"] == PYTHON_BYTES[1]:
                    found["bytes_from_python"] += _total(metric["value"])
    return found


def last_ids(spark: SparkSession) -> tuple[int, int]:
    """The last SQL execution and stage so far."""
    executions = _rest(spark, "sql?details=false&length=100000")
    stages = _rest(spark, "stages")
    return (
        max((execution["id"] for execution in executions), default=-1),
        max((stage["stageId"] for stage in stages), default=-1),
    )


def crossings(spark: SparkSession, since: tuple[int, int]) -> dict[str, float]:
    return {**map_stage_rows(spark, since[1]), **python_rows(spark, since[0])}


def single_operations(spark: SparkSession, runs: int, work: Path) -> dict[str, dict[str, Any]]:
    """The joins and the sort, each through pyshuffle and through Spark on the same files."""
    events, dimension = str(work / "events"), str(work / "users")
    found: dict[str, dict[str, Any]] = {}
    with SparkShuffle(spark, config={"pyspark-shuffle.progress.interval": 0}) as shuffle:
        for how in ("inner", "left"):
            ours, theirs = str(work / f"join-{how}-ours"), str(work / f"join-{how}-spark")
            found[f"join_{how}"] = _side_by_side(
                runs,
                functools.partial(join_through_pyshuffle, shuffle, events, dimension, ours, how),
                functools.partial(join_through_spark, spark, events, dimension, theirs, how),
                functools.partial(same_join, ours, theirs),
            )
        ours, theirs = str(work / "sort-ours"), str(work / "sort-spark")
        found["sort"] = _side_by_side(
            runs,
            lambda: sort_through_pyshuffle(shuffle, events, ours),
            lambda: sort_through_spark(spark, events, theirs),
            lambda: same_order(ours, theirs),
        )
    return found


def _side_by_side(
    runs: int, ours: Callable[[], None], theirs: Callable[[], None], equal: Callable[[], bool]
) -> dict[str, Any]:
    ours()  # warm-up of this operation's code in the workers
    pyshuffle_seconds = timed(runs, ours)
    spark_seconds = timed(runs, theirs)
    return {
        "pyshuffle_seconds": pyshuffle_seconds,
        "spark_seconds": spark_seconds,
        "speedup": spark_seconds / pyshuffle_seconds,
        "equal": equal(),
    }


def operation_results(operations: dict[str, dict[str, Any]]) -> dict[str, Any]:
    if not operations:
        return {}
    return {
        "operations": operations,
        "speedup_join": min(
            operations["join_inner"]["speedup"], operations["join_left"]["speedup"]
        ),
        "speedup_sort": operations["sort"]["speedup"],
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-pandas", action="store_true")
    parser.add_argument("--skip-operations", action="store_true")
    parser.add_argument("--work", type=Path, default=None, help="directory for the files")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="pipeline-vs-spark-"))
    spark = local_spark_session(
        "pipeline-vs-spark",
        cores=args.cores,
        driver_memory="6g",
        conf={"spark.ui.enabled": "true", "spark.ui.port": str(free_ports(1)[0])},
    )
    try:
        events, dimension = write_data(spark, work, args.rows, args.users)
        ours, arrow, pandas_out = (str(work / name) for name in ("ours", "arrow", "pandas"))
        config = {"pyspark-shuffle.progress.interval": 0}
        with SparkShuffle(spark, config=config) as shuffle:
            through_pyshuffle(shuffle, events, dimension, ours)  # warm-up: workers, imports
            since = last_ids(spark)
            pyshuffle_seconds = timed(
                args.repeat, lambda: through_pyshuffle(shuffle, events, dimension, ours)
            )
            crossed = crossings(spark, since)
        since = last_ids(spark)
        arrow_seconds = timed(
            args.repeat, lambda: through_spark(spark, events, dimension, arrow, pandas=False)
        )
        spark_crossed = crossings(spark, since)
        pandas_seconds = None
        if not args.skip_pandas:
            pandas_seconds = timed(
                1, lambda: through_spark(spark, events, dimension, pandas_out, pandas=True)
            )
        operations = {} if args.skip_operations else single_operations(spark, args.repeat, work)
        floor_seconds = function_floor(events, args.cores)
        same = output_rows(ours) == output_rows(arrow)
        if pandas_seconds is not None:
            same = same and output_rows(pandas_out) == output_rows(arrow)
    finally:
        spark.stop()
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)

    runs = args.repeat
    # Per run: the figures above add up every timed run of pyshuffle.
    per_run = {key: value / runs for key, value in crossed.items()}
    spark_per_run = {key: value / runs for key, value in spark_crossed.items()}
    results: dict[str, Any] = {
        "rows": args.rows,
        "users": args.users,
        "cores": args.cores,
        "repeat": runs,
        "pyshuffle_seconds": pyshuffle_seconds,
        "spark_arrow_seconds": arrow_seconds,
        "spark_pandas_seconds": pandas_seconds,
        "speedup_vs_arrow": arrow_seconds / pyshuffle_seconds,
        "speedup_vs_pandas": None if pandas_seconds is None else pandas_seconds / pyshuffle_seconds,
        # The best ratio any engine could reach with this per-group function on this machine.
        "function_floor_seconds": floor_seconds,
        "ceiling_speedup_vs_arrow": arrow_seconds / floor_seconds,
        "ceiling_speedup_vs_pandas": None
        if pandas_seconds is None
        else pandas_seconds / floor_seconds,
        "rows_crossing_jvm": per_run["data_rows_to_python"] + per_run["map_stage_rows_read"],
        "pyshuffle_jvm_python_crossing_per_run": per_run,
        "spark_arrow_jvm_python_crossing_per_run": {
            key: value for key, value in spark_per_run.items() if not key.startswith("map")
        },
        "outputs_equal": same,
        **operation_results(operations),
        "machine": machine(pyarrow=pa.__version__),
    }
    print_results(results)
    save_results(args.output, results)


def print_results(results: dict[str, Any]) -> None:
    pyshuffle_seconds = results["pyshuffle_seconds"]
    arrow_seconds = results["spark_arrow_seconds"]
    pandas_seconds = results["spark_pandas_seconds"]
    floor_seconds = results["function_floor_seconds"]
    per_run = results["pyshuffle_jvm_python_crossing_per_run"]
    spark_per_run = results["spark_arrow_jvm_python_crossing_per_run"]
    cores = results["cores"]
    print(f"pipeline on {results['rows']:,} events, {results['users']:,} users, local[{cores}]")
    print(f"  pyshuffle (fused, Parquet in/out)   {pyshuffle_seconds:7.2f} s")
    print(
        f"  Spark with applyInArrow            {arrow_seconds:7.2f} s   pyshuffle "
        f"{results['speedup_vs_arrow']:.2f}x faster"
    )
    if pandas_seconds is not None:
        print(
            f"  Spark with applyInPandas           {pandas_seconds:7.2f} s   pyshuffle "
            f"{results['speedup_vs_pandas']:.2f}x faster"
        )
    print(
        f"  summarize() alone, every user, over {cores} cores {floor_seconds:7.2f} s"
        f"   ceiling vs applyInArrow {results['ceiling_speedup_vs_arrow']:.2f}x"
        + (
            ""
            if pandas_seconds is None
            else f", vs applyInPandas {results['ceiling_speedup_vs_pandas']:.2f}x"
        )
    )
    print("  between the JVM and Python, per run (Spark's metrics):")
    for name, figures in (("pyshuffle", per_run), ("Spark applyInArrow", spark_per_run)):
        print(
            f"    {name:20s} data rows in {figures['data_rows_to_python']:>12,.0f}"
            f"  control rows in {figures['control_rows_to_python']:>8,.0f}"
            f"  bytes in {figures['bytes_to_python'] / 1e3:>11,.1f} kB"
            f"  bytes out {figures['bytes_from_python'] / 1e3:>11,.1f} kB"
        )
    print(
        f"    pyshuffle map stages: rows read from storage into Python"
        f" {per_run['map_stage_rows_read']:,.0f}, rows Python returned"
        f" {per_run['map_stage_rows_from_python']:,.0f} (one per map task:"
        f" {per_run['map_tasks']:,.0f} tasks)"
    )
    print(f"  outputs equal: {results['outputs_equal']}")
    for name, figures in results.get("operations", {}).items():
        print(
            f"  {name:<10} pyshuffle {figures['pyshuffle_seconds']:6.2f} s"
            f"  Spark {figures['spark_seconds']:6.2f} s"
            f"  pyshuffle {figures['speedup']:.2f}x faster  outputs equal: {figures['equal']}"
        )


if __name__ == "__main__":
    main()
