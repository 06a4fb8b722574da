"""pyspark_shuffle vs Spark's own operators, side by side in one run on the same cached data.

Data: ``--rows`` rows (default 10M) of an int64 ``key`` with ``--keys`` distinct values (default
100k), a float64 ``value`` and a ~20-byte string ``text``, generated in Spark, cached and counted
before any timing. Every workload ends in a ``noop`` write (every row computed, nothing
collected), so Spark cannot prune the shuffled columns. pyshuffle runs on the configured
factory (default: the in-process netty_like service).

1. group-apply of a small Arrow function per key vs ``groupBy().applyInArrow`` and
   ``groupBy().applyInPandas`` (the same function in pandas). Goals: 4x and 15x faster.
2. hash repartition into ``--partitions`` feeding a ``mapInArrow`` consumer (``repartition_map``:
   the consumer runs in the reduce tasks) vs ``repartition(n, key)`` + the same consumer in
   ``mapInArrow``. Goal: 1.5x faster.
3. join with a ``--keys``-row dimension, and a global sort by ``value`` (ratios only).

References, measured in the same run: the **input pass** (``mapInArrow`` of the cached data
into Python, counting rows: the JVM's conversion that any Python-side shuffle's map stage pays),
the **per-group function** alone (seconds a call, times ``--keys`` calls, over the cores) and
the **gathers** no hash shuffle of Arrow data skips, timed in this process on one map task's
share of rows and scaled to all of them, over the cores: the map side's (hash the key, bring
each partition's rows together) and group-apply's reduce side (bring each key's rows
together). The printed *ceilings* are the speed-ups of a shuffle costing nothing beyond them:
Spark's time over the input pass plus the map gather (repartition), or over the input pass,
the function and both gathers (group-apply). Writing, compressing and reading the shuffled
data, and Spark's scheduling of a second stage, are left out: the ceilings are above what
any implementation can reach.

Each figure is the median of ``--repeat`` runs (applyInPandas: one run, it takes minutes).
Printed, and saved as JSON (``--output``, default ``benchmarks/results/pyspark_vs_spark.json``)::

    python benchmarks/pyspark_vs_spark.py
    python benchmarks/pyspark_vs_spark.py --rows 1000000 --repeat 1 --skip-pandas
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from common import machine, save_results
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf

from pyspark_shuffle import SparkShuffle
from pyspark_shuffle.kernels.operations import group_ids
from pyspark_shuffle.kernels.partitioners import HashPartitioner
from pyspark_shuffle.spark.local import local_spark_session
from shuffle_api.options import TARGET_BATCH_SIZE
from shuffle_runtime.batches import chop, reorder_by_subpartition

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results" / "pyspark_vs_spark.json"
SUMMARY_SCHEMA = "key long, total double, rows long"
CONSUMER_SCHEMA = "rows long, total double"


def summarize_arrow(table: pa.Table) -> pa.Table:
    """The small per-group function: rows and total value of one key."""
    return pa.table(
        {
            "key": pa.array([table.column("key")[0].as_py()], pa.int64()),
            "total": pa.array([pc.sum(table.column("value")).as_py()], pa.float64()),
            "rows": pa.array([table.num_rows], pa.int64()),
        }
    )


def summarize_pandas(frame: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame(
        {"key": [frame["key"].iloc[0]], "total": [frame["value"].sum()], "rows": [len(frame)]}
    )


def consume(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The mapInArrow consumer after a repartition: touches every row, returns one row."""
    rows, total = 0, 0.0
    for batch in batches:
        rows += batch.num_rows
        total += pc.sum(batch.column("value")).as_py() or 0.0
        pc.utf8_length(batch.column("text"))
    yield pa.record_batch(
        {"rows": pa.array([rows], pa.int64()), "total": pa.array([total], pa.float64())}
    )


def generate(spark: SparkSession, rows: int, keys: int, partitions: int) -> DataFrame:
    data = spark.range(0, rows, 1, partitions).select(
        sf.pmod(sf.xxhash64("id"), sf.lit(keys)).alias("key"),
        (sf.pmod(sf.xxhash64("id", sf.lit(7)), sf.lit(1_000_000)) / 1000.0).alias("value"),
        sf.concat(sf.lit("item-"), sf.lpad(sf.col("id").cast("string"), 15, "0")).alias("text"),
    )
    data = data.cache()
    data.count()
    return data


def noop(frame: DataFrame) -> None:
    frame.write.format("noop").mode("overwrite").save()


def count_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield pa.record_batch({"rows": pa.array([sum(batch.num_rows for batch in batches)])})


def warm_up(data: DataFrame) -> None:
    """One untimed pass of the cached data into Python: the JVM compiles its Arrow path in
    the first job that takes it, which would otherwise count against the first workload."""
    noop(data.mapInArrow(count_rows, "rows long"))


def sample_table(rows: int, keys: int) -> pa.Table:
    """``rows`` rows shaped as the generated data (keys drawn at random from ``keys``), built
    in this process."""
    return pa.table(
        {
            "key": pa.array(np.random.default_rng(rows).integers(0, keys, rows)),
            "value": pa.array([float(index) for index in range(rows)]),
            "text": pa.array([f"item-{index:015d}" for index in range(rows)]),
        }
    )


def function_seconds_per_call(keys: int, rows_per_group: int, calls: int = 10_000) -> float:
    """Seconds of one call of ``summarize_arrow`` on a group of ``rows_per_group`` rows, in this
    process: its cost is mostly per call, which every implementation pays once per group."""
    groups = sample_table(rows_per_group * calls, keys)
    tables = [groups.slice(call * rows_per_group, rows_per_group) for call in range(calls)]
    started = time.perf_counter()
    for table in tables:
        summarize_arrow(table)
    return (time.perf_counter() - started) / calls


def gather_seconds(rows: int, keys: int, partitions: int) -> tuple[float, float]:
    """Seconds, in this process, of the map side's gather of ``rows`` rows (hash each key, bring
    each of ``partitions`` partitions' rows together, batch by batch as a map task does) and
    of the reduce side's (bring each key's rows together, reducer by reducer): timed on one
    map task's share, a reducer's share of the keys, and scaled to ``rows``."""
    share = max(1, rows // partitions)
    table = sample_table(share, max(1, keys // partitions))
    [whole] = table.combine_chunks().to_batches()
    partitioner = HashPartitioner(("key",), partitions)
    started = time.perf_counter()
    for batch in chop(whole, TARGET_BATCH_SIZE.default):
        reorder_by_subpartition(batch, partitioner.subpartitions(batch), partitions)
    map_side = time.perf_counter() - started
    started = time.perf_counter()
    ids, groups = group_ids(table, ["key"])
    reorder_by_subpartition(whole, ids, groups)
    reduce_side = time.perf_counter() - started
    return map_side * rows / share, reduce_side * rows / share


def nothing(_: DataFrame) -> None:
    """What a Spark run leaves to release: nothing."""


def timed(runs: int, make: Callable[[], DataFrame], after: Callable[[DataFrame], None]) -> float:
    """Median seconds of building ``make()`` (pyshuffle runs its map stage there) and
    writing it out; ``after`` releases what a run left."""
    seconds = []
    for _ in range(runs):
        started = time.perf_counter()
        frame = make()
        noop(frame)
        seconds.append(time.perf_counter() - started)
        after(frame)
    return statistics.median(seconds)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=8, help="input and shuffle partitions")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-pandas", action="store_true", help="skip applyInPandas")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    return parser.parse_args()


def measure_references(
    spark: SparkSession, data: DataFrame, args: argparse.Namespace
) -> tuple[dict[str, float], float, float]:
    """The references as saved, and the floors of group-apply and repartition they make."""
    # What no implementation avoids, as a reference: the JVM turning the cached rows into
    # Arrow for Python (any Python-side shuffle's map stage does it), the per-group function's
    # own cost (one call per key) and the gathers of a hash shuffle, on ``cores`` cores.
    input_pass = timed(args.repeat, lambda: data.mapInArrow(count_rows, "rows long"), nothing)
    per_call = function_seconds_per_call(args.keys, max(1, args.rows // args.keys))
    map_gather, group_gather = gather_seconds(args.rows, args.keys, args.partitions)
    cores = spark.sparkContext.defaultParallelism
    function_floor = per_call * args.keys / cores
    print(
        f"reference: input pass {input_pass:.2f} s; per-group function {per_call * 1e6:.0f} us"
        f" a call, {function_floor:.2f} s for {args.keys:,} groups on {cores} cores;"
        f" gathers {map_gather / cores:.2f} s map side, {group_gather / cores:.2f} s by key",
        flush=True,
    )
    references = {
        "input_pass_seconds": round(input_pass, 3),
        "function_seconds_per_call": round(per_call, 7),
        "function_seconds_on_all_cores": round(function_floor, 3),
        "map_gather_seconds_on_all_cores": round(map_gather / cores, 3),
        "group_gather_seconds_on_all_cores": round(group_gather / cores, 3),
    }
    group_apply_floor = input_pass + function_floor + (map_gather + group_gather) / cores
    repartition_floor = input_pass + map_gather / cores
    return references, group_apply_floor, repartition_floor


def compare(
    spark: SparkSession,
    data: DataFrame,
    dimension: DataFrame,
    args: argparse.Namespace,
    *,
    group_apply_floor: float,
    repartition_floor: float,
) -> dict[str, dict[str, float]]:
    """Each workload through pyshuffle and Spark: the seconds and speed-ups, by workload."""
    results: dict[str, dict[str, float]] = {}

    def record(workload: str, ours: float, theirs: dict[str, float]) -> None:
        entry = {"pyshuffle_seconds": round(ours, 3)}
        for name, seconds in theirs.items():
            entry[f"{name}_seconds"] = round(seconds, 3)
            entry[f"speedup_vs_{name}"] = round(seconds / ours, 2)
        results[workload] = entry
        shown = ", ".join(
            f"{name} {seconds:.2f} s ({seconds / ours:.2f}x)" for name, seconds in theirs.items()
        )
        print(f"{workload:<14} pyshuffle {ours:.2f} s | {shown}", flush=True)

    runs = args.repeat
    with SparkShuffle(spark, {"pyspark-shuffle.progress.interval": 0}) as shuffle:
        ours = timed(
            runs,
            lambda: shuffle.group_apply(data, "key", summarize_arrow, SUMMARY_SCHEMA),
            shuffle.release,
        )
        theirs = {
            "applyInArrow": timed(
                runs,
                lambda: data.groupBy("key").applyInArrow(summarize_arrow, SUMMARY_SCHEMA),
                nothing,
            )
        }
        if not args.skip_pandas:
            theirs["applyInPandas"] = timed(
                1,
                lambda: data.groupBy("key").applyInPandas(summarize_pandas, SUMMARY_SCHEMA),
                nothing,
            )
        record("group-apply", ours, theirs)
        results["group-apply"]["ceiling_vs_applyInArrow"] = round(
            theirs["applyInArrow"] / group_apply_floor, 2
        )

        ours = timed(
            runs,
            lambda: shuffle.repartition_map(
                data, "key", consume, CONSUMER_SCHEMA, num_partitions=args.partitions
            ),
            shuffle.release,
        )
        spark_repartition = timed(
            runs,
            lambda: data.repartition(args.partitions, "key").mapInArrow(consume, CONSUMER_SCHEMA),
            nothing,
        )
        record("repartition", ours, {"spark": spark_repartition})
        results["repartition"]["ceiling_vs_spark"] = round(spark_repartition / repartition_floor, 2)
        print(
            "ceilings (a shuffle costing nothing beyond the references):"
            f" group-apply {results['group-apply']['ceiling_vs_applyInArrow']:.2f}x,"
            f" repartition {results['repartition']['ceiling_vs_spark']:.2f}x",
            flush=True,
        )

        ours = timed(runs, lambda: shuffle.join(data, dimension, "key"), shuffle.release)
        record("join", ours, {"spark": timed(runs, lambda: data.join(dimension, "key"), nothing)})

        ours = timed(runs, lambda: shuffle.sort(data, "value"), shuffle.release)
        record("sort", ours, {"spark": timed(runs, lambda: data.orderBy("value"), nothing)})
    return results


def main() -> None:
    args = parse_args()
    spark = local_spark_session(
        "pyshuffle-benchmark",
        driver_memory="6g",
        conf={"spark.sql.shuffle.partitions": str(args.partitions)},
    )
    data = generate(spark, args.rows, args.keys, args.partitions)
    dimension = spark.range(0, args.keys, 1, 2).select(
        sf.col("id").alias("key"), sf.concat(sf.lit("label-"), sf.col("id")).alias("label")
    )
    dimension = dimension.cache()
    dimension.count()
    warm_up(data)
    print(f"{args.rows:,} rows, {args.keys:,} keys, {args.partitions} partitions, local[2]")
    references, group_apply_floor, repartition_floor = measure_references(spark, data, args)
    results = compare(
        spark,
        data,
        dimension,
        args,
        group_apply_floor=group_apply_floor,
        repartition_floor=repartition_floor,
    )
    document = {
        "benchmark": "pyspark_vs_spark",
        "date": time.strftime("%Y-%m-%d"),
        "environment": machine(spark=spark.version),
        "rows": args.rows,
        "keys": args.keys,
        "partitions": args.partitions,
        "repeat": args.repeat,
        "references": references,
        "results": results,
    }
    save_results(args.output, document)
    spark.stop()


if __name__ == "__main__":
    main()
