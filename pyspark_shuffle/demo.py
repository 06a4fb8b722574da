"""``pyshuffle demo``: a Python user's PySpark pipeline, through pyshuffle and through Spark.

Generated events (user, time, amount, category) and a users dimension are written to Parquet
first. The pipeline: sessions per user (a Python function: a new session after 30 idle
minutes), joined with the users, totals per segment and per category (Python functions), and
every session in a global order by amount, written to Parquet.

pyshuffle reads the Parquet files in its tasks, runs each step fused into the next and writes
Parquet from its reduce tasks: no data row crosses between the JVM and Python. Beside it runs
the same pipeline as a Python user writes it in Spark: the same functions through
``applyInArrow``, then that code again, unchanged, after ``pyspark_shuffle.enable(spark)``
(its grouped maps through pyshuffle, its join and sort Spark's). ``--verify`` also runs it in
Spark's own SQL (window functions) and checks that all agree.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as sf

from pyspark_shuffle.driver import progress
from pyspark_shuffle.driver.dropin import enable
from pyspark_shuffle.driver.session import SparkShuffle
from pyspark_shuffle.options import KEEP_RESULTS
from pyspark_shuffle.spark.local import local_connect_server, local_spark_session
from shuffle_api.options import SHUFFLE_SERVICE_FACTORY_CLASS
from shuffle_api.plugins import Command

__all__ = ["COMMAND", "main"]

T = TypeVar("T")

CATEGORIES: Final = ("books", "games", "garden", "music", "sports", "travel")
SEGMENTS: Final = ("new", "regular", "vip")
COUNTRIES: Final = ("de", "fr", "in", "jp", "us")
SESSION_GAP_SECONDS: Final = 30 * 60
# One evening of traffic: a user's events fall into a few sessions, not one each.
_WINDOW_SECONDS: Final = 4 * 3_600
_START_SECONDS: Final = 1_793_556_000  # 2026-11-01T18:00:00Z

SESSIONS_SCHEMA: Final = (
    "user long, session long, start timestamp, end timestamp, events long, amount double"
)
SEGMENTS_SCHEMA: Final = "segment string, sessions long, events long, amount double"
CATEGORIES_SCHEMA: Final = "category string, events long, users long, amount double"


def generate(
    spark: SparkSession, rows: int, users: int, partitions: int
) -> tuple[DataFrame, DataFrame]:
    """Deterministic events and users (hashes of the row id, no randomness)."""

    def pick(values: Sequence[str], salt: int, column: str = "id") -> Any:
        choices = sf.array(*[sf.lit(value) for value in values])
        return sf.element_at(
            choices,
            (sf.pmod(sf.xxhash64(sf.col(column), sf.lit(salt)), sf.lit(len(values))) + 1).cast(
                "int"
            ),
        )

    events = spark.range(0, rows, 1, partitions).select(
        sf.pmod(sf.xxhash64("id", sf.lit(1)), sf.lit(users)).alias("user"),
        sf.timestamp_seconds(
            sf.lit(_START_SECONDS) + sf.pmod(sf.xxhash64("id", sf.lit(2)), sf.lit(_WINDOW_SECONDS))
        ).alias("time"),
        (sf.pmod(sf.xxhash64("id", sf.lit(3)), sf.lit(20_000)) / 100).alias("amount"),
        pick(CATEGORIES, 4).alias("category"),
    )
    dimension = spark.range(0, users, 1, max(1, partitions // 4)).select(
        sf.col("id").alias("user"),
        pick(SEGMENTS, 5).alias("segment"),
        pick(COUNTRIES, 6).alias("country"),
    )
    return events, dimension


def sessionize(events: pa.Table) -> pa.Table:
    """One user's events -> one row per session (a gap of 30 minutes starts a new one)."""
    ordered = events.sort_by("time")
    micros = pc.cast(ordered.column("time"), pa.int64()).to_numpy()
    starts = np.flatnonzero(np.diff(micros, prepend=micros[0]) > SESSION_GAP_SECONDS * 1_000_000)
    starts = np.concatenate(([0], starts))
    ends = np.append(starts[1:], len(micros))
    # UTC whatever the input's zone: what Spark's applyInArrow wants back.
    time_type = pa.timestamp("us", tz="UTC")
    return pa.table(
        {
            "user": np.full(len(starts), ordered.column("user")[0].as_py()),
            "session": np.arange(len(starts)),
            "start": pa.array(micros[starts], time_type),
            "end": pa.array(micros[ends - 1], time_type),
            "events": ends - starts,
            "amount": np.round(np.add.reduceat(ordered.column("amount").to_numpy(), starts), 2),
        }
    )


def _totals_by(key: str, distinct: str | None) -> Callable[[pa.Table], pa.Table]:
    def totals(table: pa.Table) -> pa.Table:
        counted = "events" if "events" in table.column_names else "amount"
        aggregates: list[tuple[str, str]] = [
            (counted, "sum" if counted == "events" else "count"),
            ("amount", "sum"),
        ]
        if distinct is not None:
            aggregates.append((distinct, "count_distinct"))
        else:
            aggregates.append((key, "count"))
        done = table.group_by(key, use_threads=False).aggregate(aggregates)
        events = done.column(f"{counted}_{'sum' if counted == 'events' else 'count'}")
        amount = pc.round(done.column("amount_sum"), 2)
        if distinct is not None:
            return pa.table(
                {
                    key: done.column(key),
                    "events": events,
                    "users": done.column(f"{distinct}_count_distinct"),
                    "amount": amount,
                }
            )
        return pa.table(
            {
                key: done.column(key),
                "sessions": done.column(f"{key}_count"),
                "events": events,
                "amount": amount,
            }
        )

    return totals


_ROWS_NOTED: dict[str, tuple[int, int]] = {}
"""Per note file: its descriptor and the rows noted so far (by this Python worker)."""


def _note_rows(notes: Path, rows: int) -> None:
    """Add ``rows`` to this process's count under ``notes`` (module level: a Python worker
    keeps one count across its tasks)."""
    path = str(notes / str(os.getpid()))
    descriptor, noted = _ROWS_NOTED.get(path) or (os.open(path, os.O_WRONLY | os.O_CREAT), 0)
    noted += rows
    os.pwrite(descriptor, f"{noted:>20}".encode(), 0)
    _ROWS_NOTED[path] = descriptor, noted


def counting_rows(function: Callable[[pa.Table], pa.Table], notes: Path) -> Callable[..., Any]:
    """``function``, noting the rows of every call under ``notes`` (the demo's Spark is local:
    its Python workers share this machine's disk); :func:`rows_counted` sums them."""

    def counted(table: pa.Table) -> pa.Table:
        _note_rows(notes, table.num_rows)
        return function(table)

    return counted


def rows_counted(notes: Path) -> int:
    return sum(int(path.read_text()) for path in notes.iterdir())


@dataclass(frozen=True)
class Outcome:
    """A pipeline's answers: sessions in their global order, totals per segment and category."""

    sessions: pa.Table
    segments: pa.Table
    categories: pa.Table


def run_with_pyshuffle(
    shuffle: SparkShuffle, events_path: str, users_path: str, out: str, notes: Path
) -> tuple[Outcome, list[str]]:
    """The pipeline; ``notes``: where the sessions function notes the events it sees."""
    events = shuffle.read_parquet(events_path)
    users = shuffle.read_parquet(users_path)
    sessions = shuffle.group_apply(
        events, "user", counting_rows(sessionize, notes), SESSIONS_SCHEMA
    )
    enriched = shuffle.join(sessions, users, "user", "inner")
    segments = shuffle.group_apply(
        enriched, "segment", _totals_by("segment", None), SEGMENTS_SCHEMA
    )
    categories = shuffle.group_apply(
        events, "category", _totals_by("category", "user"), CATEGORIES_SCHEMA
    )
    ordered = shuffle.sort(enriched, ["amount", "user", "session"], ascending=[False, True, True])
    shuffle.write_parquet(ordered, out, mode="overwrite")
    outcome = Outcome(pq.read_table(out), shuffle.to_arrow(segments), shuffle.to_arrow(categories))
    lines = []
    for name, result in (
        ("sessions (group-apply)", sessions),
        ("join with users", enriched),
        ("totals per segment", segments),
        ("totals per category", categories),
        ("sessions by amount", ordered),
    ):
        stats = shuffle.statistics(result)
        source = "fused" if stats.fused_inputs else "Parquet"
        kept = ", rows kept" if stats.kept else ""
        lines.append(
            f"  {name:<22} {stats.map_tasks:>4} maps -> {stats.reducers:>3} reducers"
            f" {stats.rows_written:>12,} rows {stats.bytes_written / 1e6:>9,.1f} MB"
            f"  map {stats.map_seconds:6.2f} s  input: {source}{kept}"
        )
    return outcome, lines


def run_with_spark_udfs(
    spark: SparkSession, events_path: str, users_path: str, out: str
) -> Outcome:
    """The same pipeline as a Python user writes it in Spark: the same functions, per group,
    through ``applyInArrow``; Spark's join and sort."""
    events = spark.read.parquet(events_path)
    users = spark.read.parquet(users_path)
    sessions = events.groupBy("user").applyInArrow(sessionize, SESSIONS_SCHEMA)
    enriched = sessions.join(users, on="user", how="inner")
    segments = enriched.groupBy("segment").applyInArrow(
        _totals_by("segment", None), SEGMENTS_SCHEMA
    )
    categories = events.groupBy("category").applyInArrow(
        _totals_by("category", "user"), CATEGORIES_SCHEMA
    )
    ordered = enriched.orderBy(sf.col("amount").desc(), "user", "session")
    ordered.write.mode("overwrite").parquet(out)
    return Outcome(pq.read_table(out), segments.toArrow(), categories.toArrow())


def run_unchanged_with_switch(
    spark: SparkSession, events_path: str, users_path: str, out: str, config: Path | None
) -> tuple[Outcome, list[str]]:
    """:func:`run_with_spark_udfs`, unchanged, after ``enable(spark)``; and the path each of
    its calls took."""
    with enable(spark, config_file=config) as switch:
        outcome = run_with_spark_udfs(spark, events_path, users_path, out)
    switch.close()  # its answers are collected: nothing is left in the store
    return outcome, [f"{call.api} through {call.path}: {call.reason}" for call in switch.calls]


def run_with_spark_sql(spark: SparkSession, events_path: str, users_path: str) -> Outcome:
    """The same pipeline in Spark's own SQL: window functions instead of the Python ones."""
    events = spark.read.parquet(events_path)
    users = spark.read.parquet(users_path)
    by_user = Window.partitionBy("user").orderBy("time")
    starts = events.withColumn(
        "new_session",
        sf.coalesce(
            (
                sf.unix_seconds("time") - sf.unix_seconds(sf.lag("time").over(by_user))
                > SESSION_GAP_SECONDS
            ).cast("long"),
            sf.lit(0),
        ),
    ).withColumn(
        "session", sf.sum("new_session").over(by_user.rowsBetween(Window.unboundedPreceding, 0))
    )
    sessions = starts.groupBy("user", "session").agg(
        sf.min("time").alias("start"),
        sf.max("time").alias("end"),
        sf.count("*").alias("events"),
        sf.round(sf.sum("amount"), 2).alias("amount"),
    )
    enriched = sessions.join(users, on="user", how="inner")
    segments = enriched.groupBy("segment").agg(
        sf.count("*").alias("sessions"),
        sf.sum("events").alias("events"),
        sf.round(sf.sum("amount"), 2).alias("amount"),
    )
    categories = events.groupBy("category").agg(
        sf.count("*").alias("events"),
        sf.countDistinct("user").alias("users"),
        sf.round(sf.sum("amount"), 2).alias("amount"),
    )
    ordered = enriched.orderBy(sf.col("amount").desc(), "user", "session")
    return Outcome(ordered.toArrow(), segments.toArrow(), categories.toArrow())


def _in_order(sessions: pa.Table) -> bool:
    """Amount descending, then user and session ascending, by the rows' own values (two
    pipelines may round a sum of floats differently in the last cent)."""
    keys = zip(
        (-amount for amount in sessions.column("amount").to_pylist()),
        sessions.column("user").to_pylist(),
        sessions.column("session").to_pylist(),
        strict=True,
    )
    return all(before <= after for before, after in itertools.pairwise(keys))


def _rows(table: pa.Table, names: Sequence[str]) -> list[tuple[Any, ...]]:
    """The rows of ``names``, sorted; times as UTC microseconds (the pipelines type them with
    and without a time zone), floats last so that a last-cent difference cannot pair rows
    differently."""
    columns = []
    for name in names:
        column = table.column(name)
        if pa.types.is_timestamp(column.type):
            column = column.cast(pa.timestamp("us")).cast(pa.int64())
        columns.append(column.to_pylist())
    rows = [
        tuple(value for value in row if not isinstance(value, float))
        + tuple(value for value in row if isinstance(value, float))
        for row in zip(*columns, strict=True)
    ]
    return sorted(rows)


def _same_rows(got: pa.Table, want: pa.Table) -> bool:
    """The same rows in any order (the columns of ``want``), floats within a cent."""
    names = want.column_names
    mine, theirs = _rows(got, names), _rows(want, names)
    return len(mine) == len(theirs) and all(
        all(
            math.isclose(a, b, abs_tol=0.011) if isinstance(a, float) else a == b
            for a, b in zip(left, right, strict=True)
        )
        for left, right in zip(mine, theirs, strict=True)
    )


def _agree(ours: Outcome, references: Sequence[Outcome]) -> dict[str, bool]:
    """Per answer: equal to every reference pipeline's; and ours in its global order."""
    return {
        "sessions": all(_same_rows(ours.sessions, other.sessions) for other in references),
        "segments": all(_same_rows(ours.segments, other.segments) for other in references),
        "categories": all(_same_rows(ours.categories, other.categories) for other in references),
        "global order": _in_order(ours.sessions),
    }


def _write_inputs(
    spark: SparkSession, work: Path, rows: int, users: int, cores: int
) -> tuple[str, str]:
    events, dimension = generate(spark, rows, users, cores * 4)
    events_path, users_path = str(work / "events"), str(work / "users")
    events.write.parquet(events_path)
    dimension.write.parquet(users_path)
    return events_path, users_path


def _start_python_workers(spark: SparkSession, cores: int) -> None:
    """Start Spark's Python workers (and their pyarrow) before any timing, so neither pipeline
    pays for it on the other's behalf."""
    spark.range(0, cores, 1, cores).mapInArrow(lambda batches: batches, "id long").count()


def _timed(run: Callable[[], T]) -> tuple[T, float]:
    started = time.perf_counter()
    value = run()
    return value, time.perf_counter() - started


def _print_outcome(outcome: Outcome) -> None:
    print(f"{outcome.sessions.num_rows:,} sessions; totals per segment:")
    for row in sorted(outcome.segments.to_pylist(), key=lambda row: row["segment"]):
        print(
            f"  {row['segment']:<8} {row['sessions']:>10,} sessions"
            f" {row['events']:>12,} events {row['amount']:>16,.2f}"
        )
    print("totals per category:")
    for row in sorted(outcome.categories.to_pylist(), key=lambda row: row["category"]):
        print(
            f"  {row['category']:<8} {row['events']:>10,} events"
            f" {row['users']:>8,} users {row['amount']:>16,.2f}"
        )
    print("top sessions by amount:")
    for row in outcome.sessions.slice(0, 5).to_pylist():
        print(f"  user {row['user']:>8} session {row['session']:>3}: {row['amount']:>10,.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pyshuffle demo", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="events to generate")
    parser.add_argument("--users", type=int, default=50_000, help="users in the dimension")
    parser.add_argument("--cores", type=int, default=2, help="local Spark cores")
    parser.add_argument("--config", help="pyshuffle TOML config file")
    parser.add_argument(
        "--work", type=Path, help="directory for the Parquet files (kept); default: a temporary one"
    )
    parser.add_argument(
        "--verify", action="store_true", help="also run Spark's own SQL and check all agree"
    )
    parser.add_argument(
        "--connect",
        action="store_true",
        help="run as a Spark Connect client, of a local Connect server started for it",
    )
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as resources:
        return _run(args, resources)


def _session(args: argparse.Namespace, resources: contextlib.ExitStack) -> SparkSession:
    if not args.connect:
        return local_spark_session("pyshuffle-demo", cores=args.cores, driver_memory="4g")
    url = resources.enter_context(local_connect_server(cores=args.cores, driver_memory="4g"))
    return SparkSession.builder.remote(url).getOrCreate()


def _run(args: argparse.Namespace, resources: contextlib.ExitStack) -> int:
    # The library logs; the command shows its warnings, and the map stages' progress lines.
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    logging.getLogger(progress.__name__).setLevel(logging.INFO)

    spark, seconds = _timed(lambda: _session(args, resources))
    kind = "through Spark Connect" if args.connect else "classic"
    print(f"Spark {spark.version} local[{args.cores}] ({kind}) started in {seconds:.1f} s")
    work = args.work or Path(tempfile.mkdtemp(prefix="pyshuffle-demo-"))
    try:
        events, users = _write_inputs(spark, work, args.rows, args.users, args.cores)
        print(f"wrote {args.rows:,} events of {args.users:,} users as Parquet under {work}")
        _start_python_workers(spark, args.cores)
        with SparkShuffle(spark, config_file=args.config) as shuffle:
            factory = shuffle.configuration.get(SHUFFLE_SERVICE_FACTORY_CLASS)
            keeping = shuffle.configuration.get(KEEP_RESULTS)
            print(f"shuffle service: {factory}")
            notes = Path(tempfile.mkdtemp(prefix="sessions-function-rows-", dir=work))
            (outcome, lines), ours_seconds = _timed(
                lambda: run_with_pyshuffle(
                    shuffle, events, users, str(work / "pyshuffle-out"), notes
                )
            )
        print("shuffle statistics per result:")
        print("\n".join(lines))
        sessionized = rows_counted(notes)
        print(
            f"the sessions function ran on {sessionized:,} events"
            f" ({sessionized / args.rows:.2f} times each)"
        )
        _print_outcome(outcome)
        spark_outcome, spark_seconds = _timed(
            lambda: run_with_spark_udfs(spark, events, users, str(work / "spark-out"))
        )
        print(f"pipeline through pyshuffle:                      {ours_seconds:6.1f} s")
        ratio = spark_seconds / ours_seconds
        versus = f"{ratio:.1f}x faster" if ratio >= 1 else f"{1 / ratio:.1f}x slower"
        print(
            f"the same functions through Spark's applyInArrow: {spark_seconds:6.1f} s"
            f"  (pyshuffle {versus})"
        )
        (unchanged_outcome, calls), unchanged_seconds = _timed(
            lambda: run_unchanged_with_switch(
                spark, events, users, str(work / "unchanged-out"), args.config
            )
        )
        print(
            f"that code unchanged, after enable(spark):        {unchanged_seconds:6.1f} s"
            f"  ({spark_seconds / unchanged_seconds:.1f}x Spark's speed)"
        )
        print("\n".join(f"  {call}" for call in calls))
        references = [spark_outcome, unchanged_outcome]
        if args.verify:
            sql_outcome, sql_seconds = _timed(lambda: run_with_spark_sql(spark, events, users))
            print(f"the same in Spark's own SQL (window functions):  {sql_seconds:6.1f} s")
            references.append(sql_outcome)
        checks = _agree(outcome, references)
        if keeping:  # else each reader of the sessions runs the function again
            checks["sessions function once per event"] = sessionized == args.rows
        for name, same in checks.items():
            print(f"verified {name}: {'OK' if same else 'MISMATCH'}")
        return 0 if all(checks.values()) else 1
    finally:
        spark.stop()
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


COMMAND = Command("run the PySpark demo pipeline on the configured shuffle service", main)
