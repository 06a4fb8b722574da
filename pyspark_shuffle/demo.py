"""``pyshuffle demo``: a PySpark pipeline whose every exchange goes through the shuffle service.

Generated events (user, time, amount, category) and a users dimension: sessions per user
(group-apply: a new session after 30 idle minutes), joined with the users, totals per segment
and per category, and every session in a global order by amount. ``--verify`` computes the
same with Spark's own operators and compares.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, Row, SparkSession, Window
from pyspark.sql import functions as sf

from pyspark_shuffle.local_spark import local_spark_session
from pyspark_shuffle.session import SparkShuffle
from shuffle_api.options import SHUFFLE_SERVICE_FACTORY_CLASS

__all__ = ["main"]

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
    time_type = ordered.schema.field("time").type
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


@dataclass
class Outcome:
    sessions: list[Row]
    segments: list[Row]
    categories: list[Row]
    ordered: list[Row]


def run_with_pyshuffle(
    shuffle: SparkShuffle, events: DataFrame, users: DataFrame
) -> tuple[Outcome, list[str]]:
    lines: list[str] = []

    def timed(name: str, result: DataFrame, action: Callable[[DataFrame], T]) -> T:
        started = time.perf_counter()
        rows = action(result)
        elapsed = time.perf_counter() - started
        stats = shuffle.statistics(result)
        lines.append(
            f"  {name:<22} {stats.map_tasks:>4} maps -> {stats.reducers:>3} reducers"
            f" {stats.rows_written:>12,} rows {stats.bytes_written / 1e6:>9,.1f} MB"
            f"  map {stats.map_seconds:6.2f} s  reduce+action {elapsed:6.2f} s"
        )
        return rows

    sessions = shuffle.group_apply(events, "user", sessionize, SESSIONS_SCHEMA).cache()
    session_rows = timed("sessions (group-apply)", sessions, lambda frame: frame.collect())
    enriched = shuffle.join(sessions, users, "user", "inner").cache()
    timed("join with users", enriched, lambda frame: frame.count())
    segments = shuffle.group_apply_sorted(
        enriched, "segment", _totals_by("segment", None), SEGMENTS_SCHEMA
    )
    segment_rows = timed("totals per segment", segments, lambda frame: frame.collect())
    categories = shuffle.group_apply_sorted(
        events, "category", _totals_by("category", "user"), CATEGORIES_SCHEMA
    )
    category_rows = timed("totals per category", categories, lambda frame: frame.collect())
    ordered = shuffle.sort(enriched, ["amount", "user", "session"], ascending=[False, True, True])
    ordered_rows = timed(
        "sessions by amount",
        ordered,
        lambda frame: frame.select("amount", "user", "session").collect(),
    )
    return Outcome(session_rows, segment_rows, category_rows, ordered_rows), lines


def run_with_spark(events: DataFrame, users: DataFrame) -> Outcome:
    """The same pipeline with Spark's own operators."""
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
    ordered = enriched.orderBy(sf.col("amount").desc(), "user", "session").select(
        "amount", "user", "session"
    )
    return Outcome(sessions.collect(), segments.collect(), categories.collect(), ordered.collect())


def _in_order(rows: Sequence[Row]) -> bool:
    """Amount descending, then user and session ascending, by the rows' own values (the two
    pipelines may round a sum of floats differently in the last cent)."""
    keys = [(-row["amount"], row["user"], row["session"]) for row in rows]
    return all(before <= after for before, after in itertools.pairwise(keys))


def _same_rows(got: Sequence[Row], want: Sequence[Row]) -> bool:
    """The same rows in any order, floats within a cent."""

    def normal(row: Row) -> tuple[Any, ...]:
        # Floats last: a last-cent difference must not change which rows are paired.
        exact = tuple(value for value in row if not isinstance(value, float))
        return exact + tuple(round(value, 2) for value in row if isinstance(value, float))

    mine, theirs = sorted(normal(row) for row in got), sorted(normal(row) for row in want)
    return len(mine) == len(theirs) and all(
        all(
            math.isclose(a, b, abs_tol=0.011) if isinstance(a, float) else a == b
            for a, b in zip(left, right, strict=True)
        )
        for left, right in zip(mine, theirs, strict=True)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pyshuffle demo", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="events to generate")
    parser.add_argument("--users", type=int, default=50_000, help="users in the dimension")
    parser.add_argument("--cores", type=int, default=2, help="local Spark cores")
    parser.add_argument("--config", help="pyshuffle TOML config file")
    parser.add_argument("--verify", action="store_true", help="compare with Spark's own operators")
    args = parser.parse_args(argv)
    # The library logs; the command shows its warnings, and the map stages' progress lines.
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    logging.getLogger("pyspark_shuffle.progress").setLevel(logging.INFO)

    started = time.perf_counter()
    spark = local_spark_session("pyshuffle-demo", cores=args.cores, driver_memory="4g")
    seconds = time.perf_counter() - started
    print(f"Spark {spark.version} local[{args.cores}] started in {seconds:.1f} s")
    events, users = generate(spark, args.rows, args.users, args.cores * 4)
    events = events.cache()
    events.count()
    print(f"generated {args.rows:,} events of {args.users:,} users")
    try:
        with SparkShuffle(spark, config_file=args.config) as shuffle:
            factory = shuffle.configuration.get(SHUFFLE_SERVICE_FACTORY_CLASS)
            print(f"shuffle service: {factory}")
            began = time.perf_counter()
            outcome, lines = run_with_pyshuffle(shuffle, events, users)
            pipeline_seconds = time.perf_counter() - began
        print("shuffle statistics per result:")
        print("\n".join(lines))
        print(f"pipeline through pyshuffle: {pipeline_seconds:.1f} s")
        print(f"{len(outcome.sessions):,} sessions; totals per segment:")
        for row in sorted(outcome.segments):
            print(
                f"  {row['segment']:<8} {row['sessions']:>10,} sessions"
                f" {row['events']:>12,} events {row['amount']:>16,.2f}"
            )
        print("totals per category:")
        for row in sorted(outcome.categories):
            print(
                f"  {row['category']:<8} {row['events']:>10,} events"
                f" {row['users']:>8,} users {row['amount']:>16,.2f}"
            )
        print("top sessions by amount:")
        for row in outcome.ordered[:5]:
            print(f"  user {row['user']:>8} session {row['session']:>3}: {row['amount']:>10,.2f}")
        if not args.verify:
            return 0
        began = time.perf_counter()
        expected = run_with_spark(events, users)
        print(f"the same with Spark's own operators: {time.perf_counter() - began:.1f} s")
        checks = {
            "sessions": _same_rows(outcome.sessions, expected.sessions),
            "segments": _same_rows(outcome.segments, expected.segments),
            "categories": _same_rows(outcome.categories, expected.categories),
            "global order": _in_order(outcome.ordered)
            and _same_rows(outcome.ordered, expected.ordered),
        }
        for name, same in checks.items():
            print(f"verified {name}: {'OK' if same else 'MISMATCH'}")
        return 0 if all(checks.values()) else 1
    finally:
        spark.stop()
