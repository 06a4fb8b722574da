"""Memory at volume: the peak anonymous memory of PySpark's Python workers while a shuffle of
``--gib`` GiB goes through one executor (``local[2]``), on each service.

The map stage writes ``--gib`` GiB of Arrow rows (eight int64 columns, made by ``spark.range``
in ``--maps`` partitions) with a ``--budget`` MiB write budget (``netty-like.sort-buffer.size``
or ``external-shuffle.client.sort-buffer.size``); the reduce stage reads them all into
``--reducers`` reducers (``read``), whose rows a ``mapInArrow`` counts. A thread of this
process reads ``RssAnon`` of every Python worker (``/proc/<pid>/status``, every 20 ms) and
keeps the largest, write and read apart: the kernel keeps no peak of anonymous memory, and the
peak resident size (``VmHWM``) counts the pages of files a reader maps. Files mapped, the page
cache and the JVM are not the worker's heap.

Each task runs in a fresh worker (``spark.python.worker.reuse`` off), so a task's peak is its
own, not what an earlier task in the same process left allocated. Goal: each worker's peak
within the budget + 128 MiB, on write and on read (beside it, the peak of a task of almost no
rows: the worker with pyarrow and pyshuffle imported).

    python benchmarks/memory_budget.py                 # 2 GiB
    python benchmarks/memory_budget.py --gib 10
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
from common import key_value, machine, positive, save_results
from pyspark.sql import DataFrame, SparkSession

from external_shuffle.local_cluster import LocalCluster
from pyspark_shuffle import SparkShuffle
from pyspark_shuffle.spark.local import local_spark_session
from shuffle_runtime.ndarrays import longs

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results" / "memory_budget.json"
MIB = 1 << 20
HEADROOM_MIB = 128
COLUMNS = 8
ROW_BYTES = COLUMNS * 8
COUNT_SCHEMA = "rows long"
SERVICES = ("netty_like", "external_shuffle")
BUDGET_KEYS = {
    "netty_like": "netty-like.sort-buffer.size",
    "external_shuffle": "external-shuffle.client.sort-buffer.size",
}


def count_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    rows = 0
    for batch in batches:
        rows += batch.num_rows
    # Through buffers: pyarrow would import pandas to convert a list (27 MiB in the worker).
    yield pa.record_batch({"rows": longs([rows])})


def python_workers() -> list[int]:
    """The pids of PySpark's Python processes (the daemon and the workers it forked)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if b"pyspark.daemon" in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
    return pids


def anonymous_kib(pid: int) -> int | None:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return None


class PeakSampler:
    """The largest ``RssAnon`` of any Python worker since :meth:`start_phase`."""

    def __init__(self, interval: float = 0.02) -> None:
        self._interval = interval
        self._peak_kib = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            sizes = [anonymous_kib(pid) for pid in python_workers()]
            largest = max((size for size in sizes if size is not None), default=0)
            with self._lock:
                self._peak_kib = max(self._peak_kib, largest)

    def start_phase(self) -> None:
        with self._lock:
            self._peak_kib = 0

    def peak_mib(self) -> float:
        time.sleep(self._interval * 3)  # the last samples of the phase
        with self._lock:
            return self._peak_kib / 1024


def wide_rows(session: SparkSession, rows: int, maps: int) -> DataFrame:
    """``rows`` rows of eight int64 columns that compress little (multiplicative hashes)."""
    columns = ["id as k"] + [
        f"(id * {2654435761 + 40503 * index}) % 9223372036854775783 as c{index}"
        for index in range(COLUMNS - 1)
    ]
    return session.range(0, rows, 1, maps).selectExpr(*columns)


def measure(
    shuffle: SparkShuffle, data: DataFrame, rows: int, reducers: int, sampler: PeakSampler
) -> dict[str, Any]:
    sampler.start_phase()
    started = time.perf_counter()
    exchange = shuffle.hash_exchange(data, "k", num_partitions=reducers)
    write_seconds = time.perf_counter() - started
    write_peak = sampler.peak_mib()
    sampler.start_phase()
    started = time.perf_counter()
    counted = shuffle.read(exchange).mapInArrow(count_rows, COUNT_SCHEMA)
    rows_read = sum(row.rows for row in counted.collect())
    read_seconds = time.perf_counter() - started
    read_peak = sampler.peak_mib()
    read = shuffle.read(exchange)
    statistics = shuffle.statistics(read)
    shuffle.release(read)
    if rows_read != rows:
        raise SystemExit(f"{rows_read:,} rows arrived of {rows:,}")
    return {
        "write_seconds": round(write_seconds, 1),
        "read_seconds": round(read_seconds, 1),
        "bytes_written": statistics.bytes_written,
        "write_peak_anon_mib": round(write_peak, 1),
        "read_peak_anon_mib": round(read_peak, 1),
    }


def open_shuffle(
    stack: contextlib.ExitStack,
    session: SparkSession,
    service: str,
    budget: int,
    settings: list[tuple[str, str]],
) -> SparkShuffle:
    directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"memory-{service}-")))
    options: dict[str, Any] = {BUDGET_KEYS[service]: budget}
    if service == "netty_like":
        options["netty-like.storage.url"] = str(directory / "store")
    else:
        cluster = stack.enter_context(LocalCluster(directory, workers=1))
        options.update(cluster.client_config())
    options.update(settings)
    return stack.enter_context(SparkShuffle(session, options))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=2.0)
    parser.add_argument("--budget", type=positive, default=64, help="write budget, MiB")
    parser.add_argument("--maps", type=positive, default=16)
    parser.add_argument("--reducers", type=positive, default=16)
    parser.add_argument("--services", default=",".join(SERVICES), help="comma-separated")
    parser.add_argument(
        "--conf", type=key_value, action="append", default=[], help="KEY=VALUE, a pyshuffle option"
    )
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args()

    rows = int(args.gib * (1 << 30) / ROW_BYTES)
    budget = args.budget * MIB
    goal_mib = args.budget + HEADROOM_MIB
    results: dict[str, Any] = {}
    with PeakSampler() as sampler:
        for service in args.services.split(","):
            # A session of its own: Python workers that no other service's run has grown.
            session = local_spark_session(
                f"memory-budget-{service}",
                driver_memory="2g",
                conf={
                    "spark.sql.adaptive.enabled": "false",
                    # A fresh worker for each task: a task's peak is its own, not what an
                    # earlier task (a map task, before a reduce task) left allocated.
                    "spark.python.worker.reuse": "false",
                },
            )
            with contextlib.ExitStack() as stack:
                stack.callback(session.stop)
                shuffle = open_shuffle(stack, session, service, budget, args.conf)
                # What a task of almost no rows peaks at (pyarrow, pyshuffle imported).
                idle = measure(shuffle, wide_rows(session, 10_000, 2), 10_000, 2, sampler)

                print(f"{service}: {args.gib:g} GiB ({rows:,} rows), budget {args.budget} MiB")
                data = wide_rows(session, rows, args.maps)
                figures = measure(shuffle, data, rows, args.reducers, sampler)
            figures["idle_anon_mib"] = max(idle["write_peak_anon_mib"], idle["read_peak_anon_mib"])
            peak = max(figures["write_peak_anon_mib"], figures["read_peak_anon_mib"])
            figures["within_goal"] = peak <= goal_mib
            results[service] = figures
            print(
                f"  write {figures['write_seconds']} s, peak {figures['write_peak_anon_mib']} MiB;"
                f" read {figures['read_seconds']} s, peak {figures['read_peak_anon_mib']} MiB"
                f" (idle worker {figures['idle_anon_mib']} MiB; goal <= {goal_mib} MiB)"
            )
    save_results(
        args.output,
        {
            "benchmark": "memory_budget",
            "gib": args.gib,
            "rows": rows,
            "budget_mib": args.budget,
            "goal_mib": goal_mib,
            "maps": args.maps,
            "reducers": args.reducers,
            "results": results,
            "machine": machine(pyarrow=pa.__version__),
        },
    )


if __name__ == "__main__":
    main()
