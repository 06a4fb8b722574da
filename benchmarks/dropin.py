"""Unchanged PySpark code with and without ``pyspark_shuffle.enable(spark)``, side by side in one
run on the same Parquet files, beside the explicit API and the functions' own time.

Data (written first, by Spark, with pipeline_vs_spark.py's ``write_data``): ``--rows`` events
(default 10M) of a ``user`` with ``--users`` values (default 100k), a timestamp ``at``, a float64
``amount``, a ``category`` and a ``text``; and ``--price-rows`` prices (default a tenth of the
events) of a ``user``, a timestamp ``at`` and a float64 ``price``.

Workloads (``--workloads``, default all), each a user's code as written for Spark, ending in a
Parquet write (every row of the Python stage computed, nothing pruned):

- ``a``: pipeline_vs_spark.py's per-user summary, ``groupBy("user").applyInPandas``
  (``summarize_pandas``);
- ``b``: the same with ``applyInArrow`` (``summarize``);
- ``c``: per user an as-of join of the events with the prices,
  ``groupBy("user").cogroup(prices.groupBy("user")).applyInPandas`` (``pandas.merge_asof``);
- ``d``: a grouped-aggregate pandas UDF, ``groupBy("user").agg(mean_udf("amount"))``.

Per workload: Spark's time (the switch off), the time with the switch on (the path each call
took, from ``DropIn.calls``), the explicit API's time on the same functions
(``SparkShuffle.group_apply`` / ``cogroup_apply`` with ``pandas_function``; for ``d``, which
the explicit API has no form for, a pandas function per user that calls the UDF's own function:
slower than the switch's own route, so its ``vs_explicit`` says little) and the functions' own
time: every group through the function in this process, with the conversions it needs (per
group Arrow to pandas, and the result back to Arrow), groups sliced beforehand, in processor
seconds (as pipeline_vs_spark.py's floor); and the function itself, its input converted
beforehand: that time over ``--cores`` is a floor under any engine that calls the function once
per group, so ``ceiling`` = Spark / (function itself / cores) is the most any could gain. Ratios:
``speedup`` = Spark / enabled, ``vs_explicit`` = enabled / explicit, ``vs_function`` = enabled /
(function with conversions / cores); goals are printed beside them. The switch's floor
(``floor_s``): the same code with a function that returns a group's first row, enabled; its
work but that function's own (``floor_function_s``, with its conversions, measured as the
functions' own time is) adds to the function's on the same cores, so ``vs_function`` cannot come
under ``vs_function_bound`` = (floor - floor function / cores + function / cores) / (function /
cores).

Every output is compared with Spark's (rows, and per column its sum and nulls): the run stops
with an error at the first that differs. A warm-up first runs every path once on a small copy
of the data (Python workers, imports) and checks its outputs the same way.

Each figure is the median of ``--repeat`` runs. Printed, and saved as JSON (``--output``,
default ``benchmarks/results/dropin.json``)::

    python benchmarks/dropin.py
    python benchmarks/dropin.py --rows 200000 --users 20000 --repeat 1 --workloads a,c
    python benchmarks/dropin.py --rows 10000 --users 100 \
        --set pyspark-shuffle.dropin.min-input-size=0

The switch leaves a small input to Spark (``pyspark-shuffle.dropin.min-input-size``); ``--set``
gives it, and any other pyshuffle option, for the switch and the explicit API.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import math
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from common import format_rows, key_value, machine, positive, save_results
from pipeline_vs_spark import SUMMARY_SCHEMA, summarize, summarize_pandas, timed, write_data
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.functions import pandas_udf
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import DoubleType

import pyspark_shuffle
from pyspark_shuffle import DropIn, SparkShuffle, pandas_function
from pyspark_shuffle.spark.local import local_spark_session

BENCHMARKS = Path(__file__).resolve().parent
DEFAULT_OUTPUT = BENCHMARKS / "results" / "dropin.json"
CONFIG = {"pyspark-shuffle.progress.interval": 0}
SUMMARY_COLUMNS = ("user", "at", "amount", "category")
ASOF_SCHEMA = "user long, at timestamp, amount double, price double"
MEAN_SCHEMA = "user long, mean_amount double"
WARM_ROWS = 20_000
WARM_USERS = 2_000
GOAL_VS_EXPLICIT = 1.10
GOAL_VS_FUNCTION = 1.15
TIMESTAMP_BASE = 1_700_000_000  # seconds: keeps sums of timestamps small


# -- the users' functions ----------------------------------------------------------------------


def asof(events: pd.DataFrame, prices: pd.DataFrame) -> pd.DataFrame:
    """One user's events, each with the user's last price at or before it (none before the
    first). Prices of equal times are ordered by price, so that the one taken never depends
    on the order rows arrive in."""
    if prices.empty:  # a side without rows may come with columns of no dtype
        return events.assign(price=float("nan"))[["user", "at", "amount", "price"]]
    if events.empty:
        return events.assign(price=pd.Series(dtype="float64"))[["user", "at", "amount", "price"]]
    joined = pd.merge_asof(
        events.sort_values("at"),
        prices[["at", "price"]].sort_values(["at", "price"]),
        on="at",
        direction="backward",
    )
    return joined[["user", "at", "amount", "price"]]


# DoubleType() rather than "double": a type string is parsed at once, by a running session.
# (PySpark's stubs type the form told by hints through pandas' types, which mypy lacks here.)
@pandas_udf(DoubleType())  # type: ignore[call-overload, untyped-decorator]
def mean_udf(v: pd.Series) -> float:
    return float(v.mean())


MEAN = mean_udf.func
"""The UDF's own function (what Spark's worker calls per group)."""


def mean_per_user(key: tuple[Any, ...], frame: pd.DataFrame) -> pd.DataFrame:
    """The grouped-aggregate UDF as a pandas function of one user's rows, for the explicit
    API (which has no grouped aggregates)."""
    return pd.DataFrame({"user": [key[0]], "mean_amount": [MEAN(frame["amount"])]})


# -- functions that do next to nothing, for the engine's floor --------------------------------
# Same inputs and output schemas as the users' functions: one row a group out of its first.


def first_summary_pandas(frame: pd.DataFrame) -> pd.DataFrame:
    first = frame.iloc[:1]
    return pd.DataFrame(
        {
            "user": first["user"],
            "category": first["category"],
            "events": 1,
            "amount": first["amount"],
            "first_at": first["at"],
            "last_at": first["at"],
        }
    )


def first_summary(table: pa.Table) -> pa.Table:
    first = table.slice(0, 1)
    return pa.table(
        {
            "user": first["user"],
            "category": first["category"],
            "events": pa.array([1], pa.int64()),
            "amount": first["amount"],
            "first_at": first["at"].cast(pa.timestamp("us", tz="UTC")),
            "last_at": first["at"].cast(pa.timestamp("us", tz="UTC")),
        }
    )


def first_asof(events: pd.DataFrame, prices: pd.DataFrame) -> pd.DataFrame:
    return events.iloc[:1].assign(price=float("nan"))[["user", "at", "amount", "price"]]


@pandas_udf(DoubleType())  # type: ignore[call-overload, untyped-decorator]
def zero_udf(v: pd.Series) -> float:
    return 0.0


ZERO = zero_udf.func


# -- the users' code, unchanged whether the switch is on or not -----------------------------


@dataclass(frozen=True, slots=True)
class Inputs:
    events: str
    prices: str


def events_frame(spark: SparkSession, inputs: Inputs, columns: Sequence[str]) -> DataFrame:
    return spark.read.parquet(inputs.events).select(*columns)


def write(frame: DataFrame, out: str) -> None:
    frame.write.mode("overwrite").parquet(out)


def summary_pandas_code(spark: SparkSession, inputs: Inputs, out: str) -> None:
    events = events_frame(spark, inputs, SUMMARY_COLUMNS)
    write(events.groupBy("user").applyInPandas(summarize_pandas, SUMMARY_SCHEMA), out)


def summary_arrow_code(spark: SparkSession, inputs: Inputs, out: str) -> None:
    events = events_frame(spark, inputs, SUMMARY_COLUMNS)
    write(events.groupBy("user").applyInArrow(summarize, SUMMARY_SCHEMA), out)


def asof_code(spark: SparkSession, inputs: Inputs, out: str) -> None:
    events = events_frame(spark, inputs, ("user", "at", "amount"))
    prices = spark.read.parquet(inputs.prices)
    cogrouped = events.groupBy("user").cogroup(prices.groupBy("user"))
    write(cogrouped.applyInPandas(asof, ASOF_SCHEMA), out)


def mean_code(spark: SparkSession, inputs: Inputs, out: str) -> None:
    events = events_frame(spark, inputs, ("user", "amount"))
    write(events.groupBy("user").agg(mean_udf("amount").alias("mean_amount")), out)


def summary_pandas_floor(spark: SparkSession, inputs: Inputs, out: str) -> None:
    events = events_frame(spark, inputs, SUMMARY_COLUMNS)
    write(events.groupBy("user").applyInPandas(first_summary_pandas, SUMMARY_SCHEMA), out)


def summary_arrow_floor(spark: SparkSession, inputs: Inputs, out: str) -> None:
    events = events_frame(spark, inputs, SUMMARY_COLUMNS)
    write(events.groupBy("user").applyInArrow(first_summary, SUMMARY_SCHEMA), out)


def asof_floor(spark: SparkSession, inputs: Inputs, out: str) -> None:
    events = events_frame(spark, inputs, ("user", "at", "amount"))
    prices = spark.read.parquet(inputs.prices)
    cogrouped = events.groupBy("user").cogroup(prices.groupBy("user"))
    write(cogrouped.applyInPandas(first_asof, ASOF_SCHEMA), out)


def mean_floor(spark: SparkSession, inputs: Inputs, out: str) -> None:
    events = events_frame(spark, inputs, ("user", "amount"))
    write(events.groupBy("user").agg(zero_udf("amount").alias("mean_amount")), out)


# -- the same functions through the explicit API -------------------------------------------


def summary_pandas_explicit(
    spark: SparkSession, shuffle: SparkShuffle, inputs: Inputs, out: str
) -> None:
    events = events_frame(spark, inputs, SUMMARY_COLUMNS)
    function = pandas_function(summarize_pandas)
    write(shuffle.group_apply(events, "user", function, SUMMARY_SCHEMA), out)


def summary_arrow_explicit(
    spark: SparkSession, shuffle: SparkShuffle, inputs: Inputs, out: str
) -> None:
    events = events_frame(spark, inputs, SUMMARY_COLUMNS)
    write(shuffle.group_apply(events, "user", summarize, SUMMARY_SCHEMA), out)


def asof_explicit(spark: SparkSession, shuffle: SparkShuffle, inputs: Inputs, out: str) -> None:
    events = events_frame(spark, inputs, ("user", "at", "amount"))
    prices = spark.read.parquet(inputs.prices)
    function: Any = pandas_function(asof)
    write(shuffle.cogroup_apply(events, prices, "user", function, ASOF_SCHEMA), out)


def mean_explicit(spark: SparkSession, shuffle: SparkShuffle, inputs: Inputs, out: str) -> None:
    events = events_frame(spark, inputs, ("user", "amount"))
    function = pandas_function(mean_per_user)
    write(shuffle.group_apply(events, "user", function, MEAN_SCHEMA), out)


# -- the functions alone -----------------------------------------------------------------------


def groups_of(table: pa.Table, key: str) -> dict[Any, pa.Table]:
    """``table``'s rows by ``key``, each group a slice of one sorted copy."""
    ordered = table.take(pc.sort_indices(table, [(key, "ascending")]))
    counts = pc.value_counts(ordered[key])  # in order of appearance: the keys' order
    ends = itertools.accumulate(counts.field("counts").to_pylist())
    groups: dict[Any, pa.Table] = {}
    start = 0
    for value, end in zip(counts.field("values").to_pylist(), ends, strict=True):
        groups[value] = ordered.slice(start, end - start)
        start = end
    return groups


def cpu_seconds(function: Callable[..., object], calls: Iterable[tuple[pa.Table, ...]]) -> float:
    """Processor seconds of ``function(*arguments)`` for each of ``calls``."""
    started = time.process_time()
    for arguments in calls:
        function(*arguments)
    return time.process_time() - started


def arrow_schema_of(spark: SparkSession, ddl: str) -> pa.Schema:
    return to_arrow_schema(spark.createDataFrame([], ddl).schema, timezone="UTC")


def summary_pandas_alone(
    spark: SparkSession, inputs: Inputs, function: Callable[..., Any]
) -> tuple[float, float]:
    groups = groups_of(pq.read_table(inputs.events, columns=list(SUMMARY_COLUMNS)), "user")
    schema = arrow_schema_of(spark, SUMMARY_SCHEMA)

    def one(group: pa.Table) -> pa.Table:
        result = function(group.to_pandas())
        return pa.Table.from_pandas(result, schema=schema, preserve_index=False)

    frames = [(group.to_pandas(),) for group in groups.values()]
    converting = cpu_seconds(one, ((group,) for group in groups.values()))
    return converting, cpu_seconds(function, frames)


def summary_arrow_alone(
    spark: SparkSession, inputs: Inputs, function: Callable[..., Any]
) -> tuple[float, float]:
    groups = groups_of(pq.read_table(inputs.events, columns=list(SUMMARY_COLUMNS)), "user")
    seconds = cpu_seconds(function, ((group,) for group in groups.values()))
    return seconds, seconds  # Arrow in, Arrow out: nothing to convert


def asof_alone(
    spark: SparkSession, inputs: Inputs, function: Callable[..., Any]
) -> tuple[float, float]:
    events = groups_of(pq.read_table(inputs.events, columns=["user", "at", "amount"]), "user")
    prices = groups_of(pq.read_table(inputs.prices), "user")
    schema = arrow_schema_of(spark, ASOF_SCHEMA)
    no_events = next(iter(events.values())).slice(0, 0)
    no_prices = next(iter(prices.values())).slice(0, 0)
    pairs = [
        (events.get(key, no_events), prices.get(key, no_prices))
        for key in sorted(events.keys() | prices.keys())
    ]

    def one(left: pa.Table, right: pa.Table) -> pa.Table:
        result = function(left.to_pandas(), right.to_pandas())
        return pa.Table.from_pandas(result, schema=schema, preserve_index=False)

    frames = [(left.to_pandas(), right.to_pandas()) for left, right in pairs]
    return cpu_seconds(one, pairs), cpu_seconds(function, frames)


def mean_alone(
    spark: SparkSession, inputs: Inputs, function: Callable[..., Any]
) -> tuple[float, float]:
    groups = groups_of(pq.read_table(inputs.events, columns=["user", "amount"]), "user")
    means: list[float] = []

    def one(group: pa.Table) -> None:
        means.append(function(group["amount"].to_pandas()))

    seconds = cpu_seconds(one, ((group,) for group in groups.values()))
    started = time.process_time()
    pa.table({"user": list(groups), "mean_amount": pa.array(means, pa.float64())})
    series = [(group["amount"].to_pandas(),) for group in groups.values()]
    return seconds + time.process_time() - started, cpu_seconds(function, series)


# -- the workloads -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    title: str
    goal_speedup: float
    code: Callable[[SparkSession, Inputs, str], None]
    explicit: Callable[[SparkSession, SparkShuffle, Inputs, str], None]
    function: Callable[..., Any]
    """The users' function, as Spark's worker calls it per group."""
    alone: Callable[[SparkSession, Inputs, Callable[..., Any]], tuple[float, float]]
    """Processor seconds of a function (``function``, ``floor_function``) over every group:
    with the conversions it needs, and of the function itself (its input converted
    beforehand)."""
    floor: Callable[[SparkSession, Inputs, str], None]
    """The same code with a function that does next to nothing (a group's first row)..."""
    floor_function: Callable[..., Any]
    """... this one (``alone`` measures it too)."""


WORKLOADS = {
    workload.name: workload
    for workload in (
        Workload(
            "a",
            "per-user summary, applyInPandas",
            3.0,
            summary_pandas_code,
            summary_pandas_explicit,
            summarize_pandas,
            summary_pandas_alone,
            summary_pandas_floor,
            first_summary_pandas,
        ),
        Workload(
            "b",
            "per-user summary, applyInArrow",
            1.5,
            summary_arrow_code,
            summary_arrow_explicit,
            summarize,
            summary_arrow_alone,
            summary_arrow_floor,
            first_summary,
        ),
        Workload(
            "c",
            "as-of join, cogroup.applyInPandas",
            3.0,
            asof_code,
            asof_explicit,
            asof,
            asof_alone,
            asof_floor,
            first_asof,
        ),
        Workload(
            "d",
            "grouped-aggregate pandas UDF",
            1.5,
            mean_code,
            mean_explicit,
            MEAN,
            mean_alone,
            mean_floor,
            ZERO,
        ),
    )
}


# -- outputs -----------------------------------------------------------------------------------

Checksum = dict[str, float | int]


def checksum(path: str) -> Checksum:
    """Rows, and per column its nulls and its sum (integers and timestamps exactly, in whole
    seconds from a base; floats as floats; strings by their lengths)."""
    table = pq.read_table(path)
    found: Checksum = {"rows": table.num_rows}
    for name in sorted(table.column_names):
        column = table[name]
        found[f"{name}.nulls"] = column.null_count
        if pa.types.is_timestamp(column.type):
            seconds = pc.cast(pc.cast(column, pa.timestamp("s"), safe=False), pa.int64())
            column = pc.subtract(seconds, TIMESTAMP_BASE)
        elif pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            column = pc.utf8_length(column)
        total = pc.sum(column).as_py()
        found[f"{name}.sum"] = 0 if total is None else total
    return found


def differences(expected: Checksum, found: Checksum) -> list[str]:
    wrong = []
    for key in sorted(expected.keys() | found.keys()):
        want, got = expected.get(key), found.get(key)
        if want is None or got is None:
            wrong.append(f"{key}: {want} != {got}")
        elif isinstance(want, float) or isinstance(got, float):
            if not math.isclose(want, got, rel_tol=1e-9, abs_tol=1e-6):
                wrong.append(f"{key}: {want!r} != {got!r}")
        elif want != got:
            wrong.append(f"{key}: {want} != {got}")
    return wrong


def check_same(workload: Workload, spark_out: str, others: dict[str, str]) -> int:
    """Rows Spark wrote; raises ``SystemExit`` naming what differs if another path's output
    differs from Spark's."""
    expected = checksum(spark_out)
    for label, path in others.items():
        wrong = differences(expected, checksum(path))
        if wrong:
            raise SystemExit(
                f"workload {workload.name} ({workload.title}): the {label} output differs from"
                f" Spark's: {'; '.join(wrong)}"
            )
    return int(expected["rows"])


# -- running -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Taken:
    path: str
    reason: str


def path_taken(switch: DropIn, seen: int) -> Taken:
    """The path of the calls the switch saw after its first ``seen``: one, or ``mixed``."""
    calls = switch.calls[seen:]
    if not calls:
        return Taken("spark", "the switch saw no call")
    paths = sorted({call.path for call in calls})
    reasons = sorted({f"{call.api}: {call.reason}" for call in calls})
    return Taken(paths[0] if len(paths) == 1 else "mixed", "; ".join(reasons))


def run_enabled(
    spark: SparkSession, config: Mapping[str, object], run: Callable[[], None]
) -> tuple[Taken, float]:
    with pyspark_shuffle.enable(spark, config) as switch:
        seen = len(switch.calls)
        started = time.perf_counter()
        run()
        return path_taken(switch, seen), time.perf_counter() - started


def warm_up(
    spark: SparkSession,
    shuffle: SparkShuffle,
    workloads: list[Workload],
    inputs: Inputs,
    out: Path,
    *,
    config: Mapping[str, object],
) -> None:
    """Every path of every workload once on small data, outputs checked."""
    for workload in workloads:
        outs = {label: str(out / f"warm-{workload.name}-{label}") for label in PATHS}
        workload.code(spark, inputs, outs["spark"])
        run = functools.partial(workload.code, spark, inputs, outs["enabled"])
        run_enabled(spark, config, run)
        workload.explicit(spark, shuffle, inputs, outs["explicit"])
        check_same(workload, outs["spark"], {k: v for k, v in outs.items() if k != "spark"})


PATHS = ("spark", "enabled", "explicit")


def measure(
    spark: SparkSession,
    shuffle: SparkShuffle,
    workload: Workload,
    inputs: Inputs,
    out: Path,
    *,
    config: Mapping[str, object],
    repeat: int,
    cores: int,
) -> dict[str, Any]:
    outs = {label: str(out / f"{workload.name}-{label}") for label in PATHS}
    spark_s = timed(repeat, lambda: workload.code(spark, inputs, outs["spark"]))
    taken: list[Taken] = []
    enabled: list[float] = []
    for _ in range(repeat):
        path, seconds = run_enabled(
            spark, config, lambda: workload.code(spark, inputs, outs["enabled"])
        )
        taken.append(path)
        enabled.append(seconds)
    explicit_s = timed(repeat, lambda: workload.explicit(spark, shuffle, inputs, outs["explicit"]))
    rows = check_same(workload, outs["spark"], {k: v for k, v in outs.items() if k != "spark"})
    floor_out = str(out / f"{workload.name}-floor")
    floor_s = statistics.median(
        run_enabled(spark, config, lambda: workload.floor(spark, inputs, floor_out))[1]
        for _ in range(repeat)
    )
    function_s, itself_s = workload.alone(spark, inputs, workload.function)
    floor_function_s, _ = workload.alone(spark, inputs, workload.floor_function)
    enabled_s = statistics.median(enabled)
    function_wall_s = function_s / cores
    return {
        "title": workload.title,
        "spark_s": spark_s,
        "enabled_s": enabled_s,
        "explicit_s": explicit_s,
        "function_s": function_s,
        "speedup": spark_s / enabled_s,
        "vs_explicit": enabled_s / explicit_s,
        "vs_function": enabled_s / function_wall_s,
        # The switch's own floor: the same code and data with a function that does next to
        # nothing. Its work but that function's (and the conversions it needs, which
        # function_s counts) adds to the function's on the same cores, so vs_function cannot
        # come under this bound.
        "floor_s": floor_s,
        "floor_function_s": floor_function_s,
        "vs_function_bound": (floor_s - floor_function_s / cores + function_wall_s)
        / function_wall_s,
        "function_itself_s": itself_s,
        # What no engine that calls the function once per group can beat: Spark's time over
        # the function's own (its input converted for free), on every core.
        "ceiling_speedup": spark_s / (itself_s / cores),
        "path": taken[-1].path,
        "reason": taken[-1].reason,
        "rows_out": rows,
        "goal_speedup": workload.goal_speedup,
    }


def write_prices(spark: SparkSession, root: Path, rows: int, users: int) -> str:
    prices = str(root / "prices")
    spark.range(0, rows, 1, 4).selectExpr(
        f"cast(pmod(xxhash64(id, 2), {users}) as long) as user",
        "timestamp_seconds(1700000000 + pmod(xxhash64(id, 3), 2592000)) as at",
        "rand(11) * 100 as price",
    ).write.parquet(prices)
    return prices


def write_inputs(spark: SparkSession, root: Path, rows: int, users: int, prices: int) -> Inputs:
    events, _ = write_data(spark, root, rows, users)
    return Inputs(events, write_prices(spark, root, prices, users))


# -- command line --------------------------------------------------------------------------


def workload_list(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names or any(name not in WORKLOADS for name in names):
        raise argparse.ArgumentTypeError(
            f"workloads are a comma-separated subset of {','.join(WORKLOADS)}"
        )
    return list(dict.fromkeys(names))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=positive, default=10_000_000)
    parser.add_argument("--users", type=positive, default=100_000)
    parser.add_argument(
        "--price-rows", type=positive, default=None, help="default: a tenth of --rows"
    )
    parser.add_argument("--cores", type=positive, default=2)
    parser.add_argument("--repeat", type=positive, default=3)
    parser.add_argument("--workloads", type=workload_list, default=list(WORKLOADS))
    parser.add_argument("--work", type=Path, default=None, help="directory for the files")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument(
        "--set",
        type=key_value,
        action="append",
        default=[],
        help="KEY=VALUE, a pyshuffle option for the switch and the explicit API (e.g."
        " pyspark-shuffle.dropin.min-input-size=0: every call through pyshuffle)",
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    # The Python workers unpickle functions of pipeline_vs_spark.py by reference.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(BENCHMARKS), os.environ.get("PYTHONPATH")])
    )
    work = args.work or Path(tempfile.mkdtemp(prefix="dropin-"))
    price_rows = args.price_rows or max(1, args.rows // 10)
    workloads = [WORKLOADS[name] for name in args.workloads]
    spark = local_spark_session("dropin", cores=args.cores, driver_memory="6g")
    figures: dict[str, dict[str, Any]] = {}
    try:
        inputs = write_inputs(spark, work / "data", args.rows, args.users, price_rows)
        warm = write_inputs(
            spark,
            work / "warm",
            min(args.rows, WARM_ROWS),
            min(args.users, WARM_USERS),
            min(price_rows, WARM_ROWS // 10),
        )
        config = {**CONFIG, **dict(args.set)}
        with SparkShuffle(spark, config=config) as shuffle:
            warm_up(spark, shuffle, workloads, warm, work, config=config)
            for workload in workloads:
                figures[workload.name] = measure(
                    spark,
                    shuffle,
                    workload,
                    inputs,
                    work,
                    config=config,
                    repeat=args.repeat,
                    cores=args.cores,
                )
                print_row(workload.name, figures[workload.name], args.cores)
    finally:
        spark.stop()
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    results: dict[str, Any] = {
        "rows": args.rows,
        "users": args.users,
        "price_rows": price_rows,
        "cores": args.cores,
        "repeat": args.repeat,
        "settings": dict(args.set),
        "goals": {
            "speedup": {name: WORKLOADS[name].goal_speedup for name in WORKLOADS},
            "vs_explicit": GOAL_VS_EXPLICIT,
            "vs_function": GOAL_VS_FUNCTION,
        },
        "workloads": figures,
        "machine": machine(pyarrow=pa.__version__, pandas=pd.__version__),
    }
    print_results(results)
    save_results(args.output, results)


def print_row(name: str, row: dict[str, Any], cores: int) -> None:
    print(
        f"{name}: {row['title']}: Spark {row['spark_s']:.2f} s, enabled {row['enabled_s']:.2f} s"
        f" ({row['path']}), explicit {row['explicit_s']:.2f} s,"
        f" function alone / {cores} {row['function_s'] / cores:.2f} s",
        flush=True,
    )


def _against(value: float, goal: float, *, at_least: bool) -> str:
    met = value >= goal if at_least else value <= goal
    return f"{value:.2f} ({'>=' if at_least else '<='}{goal:.2f} {'ok' if met else 'MISSED'})"


def print_results(results: dict[str, Any]) -> None:
    cores = results["cores"]
    print(
        f"\nunchanged PySpark code, pyspark_shuffle.enable on and off: {results['rows']:,} events,"
        f" {results['users']:,} users, {results['price_rows']:,} prices, local[{cores}],"
        f" median of {results['repeat']}"
    )
    headers = [
        "workload",
        "path",
        "Spark s",
        "enabled s",
        "explicit s",
        f"function/{cores} s",
        "speedup (goal)",
        "ceiling",
        "vs explicit (goal)",
        "vs function (goal)",
        "floor s",
        "vs function bound",
    ]
    rows = []
    for name, row in results["workloads"].items():
        rows.append(
            [
                f"{name} {row['title']}",
                row["path"],
                f"{row['spark_s']:.2f}",
                f"{row['enabled_s']:.2f}",
                f"{row['explicit_s']:.2f}",
                f"{row['function_s'] / cores:.2f}",
                _against(row["speedup"], row["goal_speedup"], at_least=True),
                f"{row['ceiling_speedup']:.2f}",
                _against(row["vs_explicit"], GOAL_VS_EXPLICIT, at_least=False),
                _against(row["vs_function"], GOAL_VS_FUNCTION, at_least=False),
                f"{row['floor_s']:.2f}",
                f"{row['vs_function_bound']:.2f}",
            ]
        )
    print(format_rows(headers, rows))
    print("paths, as the switch recorded them:")
    for name, row in results["workloads"].items():
        print(f"  {name}: {row['path']}: {row['reason']}")


if __name__ == "__main__":
    main()
