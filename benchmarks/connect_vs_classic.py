"""pipeline_vs_spark.py's pyshuffle pipeline from a Spark Connect client beside a classic
session, in one run on the same Parquet files (the Connect path must not be slower by more
than 10 %).

Each session runs in a process of its own (a Connect client cannot share one with a classic
session): the classic one writes the data (``--rows`` events of ``--users`` users), then each
session runs the pipeline once to warm up and ``--repeat`` times timed; the kinds alternate
``--rounds`` times, and each figure is the median of all of its runs. The Connect server is
``local_connect_server`` (``local[cores]`` on 127.0.0.1), the classic session
``local_spark_session``: the same Spark, cores and driver memory. Printed, and saved as JSON
(``--output``, default ``benchmarks/results/connect_vs_classic.json``)::

    python benchmarks/connect_vs_classic.py
    python benchmarks/connect_vs_classic.py --rows 1000000 --users 10000 --repeat 1 --rounds 1
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pipeline_vs_spark import through_pyshuffle, write_data
from pyspark.sql import SparkSession

from pyspark_shuffle import SparkShuffle
from pyspark_shuffle.spark.local import local_connect_server, local_spark_session

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results" / "connect_vs_classic.json"
DRIVER_MEMORY = "6g"


def _session(kind: str, cores: int, resources: contextlib.ExitStack) -> SparkSession:
    if kind == "classic":
        return local_spark_session("connect-vs-classic", cores=cores, driver_memory=DRIVER_MEMORY)
    url = resources.enter_context(local_connect_server(cores=cores, driver_memory=DRIVER_MEMORY))
    return SparkSession.builder.remote(url).getOrCreate()


def run_session(args: argparse.Namespace) -> None:
    """One session's runs; prints their seconds as a JSON list."""
    with contextlib.ExitStack() as resources:
        spark = _session(args.session, args.cores, resources)
        try:
            events, dimension = str(args.work / "events"), str(args.work / "users")
            if args.write:
                write_data(spark, args.work, args.rows, args.users)
                return
            out = str(args.work / f"out-{args.session}")
            config = {"pyspark-shuffle.progress.interval": 0}
            with SparkShuffle(spark, config=config) as shuffle:
                through_pyshuffle(shuffle, events, dimension, out)  # warm-up: workers, imports
                seconds = []
                for _ in range(args.repeat):
                    started = time.perf_counter()
                    through_pyshuffle(shuffle, events, dimension, out)
                    seconds.append(time.perf_counter() - started)
            print(json.dumps(seconds))
        finally:
            spark.stop()


def _child(args: argparse.Namespace, session: str, *, write: bool = False) -> list[float]:
    command = [
        sys.executable,
        __file__,
        "--session",
        session,
        "--work",
        str(args.work),
        *("--rows", str(args.rows), "--users", str(args.users)),
        *("--cores", str(args.cores), "--repeat", str(args.repeat)),
        *(["--write"] if write else []),
    ]
    # The pipeline's functions live in pipeline_vs_spark: Spark's Python workers import it.
    here = str(Path(__file__).resolve().parent)
    inherited = os.environ.get("PYTHONPATH")
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [here, inherited]))}
    ran = subprocess.run(command, capture_output=True, text=True, env=environment, check=False)
    if ran.returncode != 0:
        raise SystemExit(f"the {session} session failed:\n{ran.stderr[-3000:]}")
    shown = ran.stdout
    if write:
        return []
    seconds: list[float] = json.loads(shown.strip().splitlines()[-1])
    print(f"{session:>8}: {', '.join(f'{each:.1f} s' for each in seconds)}", flush=True)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--work", type=Path, default=None, help="directory for the files")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--session", choices=["classic", "connect"], help=argparse.SUPPRESS)
    parser.add_argument("--write", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.session is not None:
        run_session(args)
        return

    made = args.work is None
    args.work = args.work or Path(tempfile.mkdtemp(prefix="connect-vs-classic-"))
    try:
        _child(args, "classic", write=True)
        runs: dict[str, list[float]] = {"classic": [], "connect": []}
        for _ in range(args.rounds):
            for session in runs:
                runs[session] += _child(args, session)
    finally:
        if made:
            shutil.rmtree(args.work, ignore_errors=True)
    classic, connect = (statistics.median(runs[kind]) for kind in ("classic", "connect"))
    results = {
        "rows": args.rows,
        "users": args.users,
        "cores": args.cores,
        "runs": runs,
        "classic_seconds": round(classic, 2),
        "connect_seconds": round(connect, 2),
        "connect_over_classic": round(connect / classic, 3),
        "goal": "connect_over_classic <= 1.10",
    }
    print(
        f"pipeline through pyshuffle: classic {classic:.1f} s, Connect {connect:.1f} s"
        f" ({connect / classic:.2f}x classic's time)"
    )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    print(f"saved {args.output}")


if __name__ == "__main__":
    main()
