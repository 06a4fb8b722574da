"""What a second replica costs: the same PySpark repartition on the external service (two
worker daemons on 127.0.0.1, reads through the workers) with `replication-factor` 1 and 2,
rounds alternating, in one run. Prints seconds per round and the bytes on the workers' stores.

    .venv/bin/python benchmarks/replication_cost.py [--rows N] [--repeat K]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import machine, save_results

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from external_shuffle.local_cluster import LocalCluster
from pyspark_shuffle import SparkShuffle
from pyspark_shuffle.spark.local import local_spark_session

RESULTS = Path(__file__).parent / "results" / "replication_cost.json"
FACTORS = (1, 2)


def stored_bytes(cluster: LocalCluster, workers: int) -> int:
    return sum(
        path.stat().st_size
        for index in range(workers)
        for path in cluster.worker_store(index).rglob("*")
        if path.is_file()
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    spark = local_spark_session("replication-cost", cores=2)
    rounds: dict[int, list[dict[str, Any]]] = {factor: [] for factor in FACTORS}
    try:
        frame = spark.range(0, args.rows, 1, 8).selectExpr(
            "id", "id % 1000 as k", "rand(7) as x", "sha2(cast(id as string), 256) as s"
        )
        frame = frame.cache()
        input_rows = frame.count()
        with (
            tempfile.TemporaryDirectory() as directory,
            LocalCluster(Path(directory), workers=2) as cluster,
        ):
            # Round -1 warms up (Python workers, the daemons' first streams): not counted.
            for round_number in range(-1, args.repeat):
                for factor in FACTORS:
                    config = cluster.client_config(
                        **{
                            "external-shuffle.replication-factor": factor,
                            "external-shuffle.client.read-from-store": False,
                            "pyspark-shuffle.progress.interval": 0,
                        }
                    )
                    with SparkShuffle(spark, config=config) as shuffle:
                        started = time.perf_counter()
                        result = shuffle.repartition(frame, "k", num_partitions=8)
                        mapped = time.perf_counter() - started
                        on_disk = stored_bytes(cluster, 2)
                        rows = result.count()
                        total = time.perf_counter() - started
                    assert rows == input_rows, (rows, input_rows)
                    if round_number < 0:
                        continue
                    figures = {"map_s": mapped, "total_s": total, "stored_bytes": on_disk}
                    rounds[factor].append(figures)
                    print(
                        f"round {round_number} replication {factor}: map stage {mapped:.2f} s,"
                        f" map + reduce {total:.2f} s, {on_disk / 1e6:.0f} MB on the workers"
                    )
    finally:
        spark.stop()
    summary = {
        factor: {
            key: statistics.median(figures[key] for figures in rounds[factor])
            for key in ("map_s", "total_s", "stored_bytes")
        }
        for factor in FACTORS
    }
    print(f"\nmedian of {args.repeat}, {args.rows:,} rows:")
    for factor, figures in summary.items():
        print(
            f"  replication {factor}: map stage {figures['map_s']:.2f} s, map + reduce"
            f" {figures['total_s']:.2f} s, {figures['stored_bytes'] / 1e6:.0f} MB stored"
        )
    print(f"  ratio 2 / 1 (map + reduce): {summary[2]['total_s'] / summary[1]['total_s']:.2f}")
    save_results(
        RESULTS,
        {
            "machine": machine(),
            "rows": args.rows,
            "rounds": {str(factor): figures for factor, figures in rounds.items()},
            "median": {str(factor): figures for factor, figures in summary.items()},
        },
    )


if __name__ == "__main__":
    main()
