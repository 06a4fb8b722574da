"""Jobs on ``local-cluster[2,1,1024]``: two executor JVMs, each with its own store (its Spark
local directory), reading each other's partitions over their data ports (the default
service's over TLS), as two hosts would; or both on one object store (moto's S3 server
standing in for S3), which outlives them.

Run as ``python -m tests.integration.cluster_jobs WORK_DIR PLAN`` (``netty_like``, the
default service; ``external_shuffle``: a coordinator and two worker daemons;
``dynamic_allocation``: the default service on the object store, with Spark's dynamic
allocation): a SparkContext per process, so each application runs in a process of its own
(the test module's session is a ``local[2]`` one). Prints one JSON object: what the tests
assert.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from external_shuffle.local_cluster import LocalCluster
from pyspark_shuffle import SparkShuffle
from pyspark_shuffle.spark.local import (
    executor_pids,
    local_cluster_session,
    wait_for_two_executors,
)
from tests.integration.spark_rows import multiset
from tests.s3_stand_in import objects_under, running_stand_in
from tests.tls_files import write_tls_files

ROWS = 40_000
# Seconds each map task of the slow input sleeps: the stage lasts long enough to kill an
# executor in the middle of it.
SLOW_SECONDS = 1.5
OBJECT_STORE_BUCKET = "pyshuffle-cluster"
ON_OBJECT_STORE: Mapping[str, object] = {
    "netty-like.storage.url": f"s3://{OBJECT_STORE_BUCKET}/shuffle"
}


DYNAMIC_ALLOCATION = {
    "spark.dynamicAllocation.enabled": "true",
    # Spark's own way without an external shuffle service: executors holding shuffle data
    # stay; pyshuffle's partitions on an object store hold none.
    "spark.dynamicAllocation.shuffleTracking.enabled": "true",
    "spark.dynamicAllocation.minExecutors": "0",
    # One at a time: each executor is a JVM to start, on CI's two busy cores.
    "spark.dynamicAllocation.initialExecutors": "1",
    "spark.dynamicAllocation.maxExecutors": "1",
    "spark.dynamicAllocation.executorIdleTimeout": "2s",
    "spark.dynamicAllocation.schedulerBacklogTimeout": "1s",
}
"""The session of the ``dynamic_allocation`` plan."""


def cluster_session(work: Path, conf: Mapping[str, str] | None = None) -> SparkSession:
    return local_cluster_session("pyshuffle-cluster-tests", work, conf)


def stored_files(roots: list[Path]) -> list[str]:
    """Every file or directory under the pyshuffle stores below ``roots`` (the executors'
    local directories, or the external service's worker stores), ids aside."""
    stores = [store for root in roots for store in [root, *root.glob("**/pyshuffle")]]
    return sorted(
        str(path)
        for store in stores
        if store.name in ("pyshuffle",) or store.name.endswith("-store")
        for path in store.rglob("*")
        if not path.name.startswith(".")
    )


def stored_objects(settings: Mapping[str, object]) -> list[str]:
    """Every object under the object store a step's ``settings`` name (none if they name
    none)."""
    url = settings.get("netty-like.storage.url")
    return [] if url is None else objects_under(str(url))


def without_stack_frames(message: str) -> str:
    """A Py4J error's message with its JVM stack frames left out: what failed, and each
    ``Caused by``, within what a test prints."""
    kept = (line for line in message.splitlines() if not line.lstrip().startswith("at "))
    return "\n".join(kept)[:4000]


Kill = Callable[[], int]
"""Kills one victim (an executor's JVM, or a worker daemon); returns its pid."""


def executor_killer(spark: SparkSession) -> Kill:
    def kill() -> int:
        pids = executor_pids(spark.sparkContext.applicationId)
        pid = pids[min(pids)]
        os.kill(pid, signal.SIGKILL)
        return pid

    return kill


def kill_after(kill: Kill, seconds: float, killed: list[int]) -> threading.Thread:
    def later() -> None:
        time.sleep(seconds)
        killed.append(kill())

    thread = threading.Thread(target=later, daemon=True)
    thread.start()
    return thread


def data(spark: SparkSession) -> DataFrame:
    frame: DataFrame = spark.range(0, ROWS, 1, 8).selectExpr(
        "id",
        "case when id % 11 = 0 then null else id % 97 end as k",
        "cast(id % 13 as double) * (case when id % 2 = 0 then -1.0 else 1.0 end) as x",
        "concat('v', id) as s",
    )
    return frame


def slow(spark: SparkSession) -> DataFrame:
    """``data`` behind a Python pass that sleeps in each task."""

    def sleepy(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        time.sleep(SLOW_SECONDS)
        yield from batches

    frame = data(spark)
    return frame.mapInArrow(sleepy, frame.schema)


CORE_OPERATIONS = ("repartition", "group_apply", "join_inner_shuffled", "to_arrow")
"""The external service's: its workers serve every executor alike, so what differs between two
executors and one is what the default service's data ports carry."""
DATA_PORT_OPERATIONS = (
    *CORE_OPERATIONS,
    "join_inner",
    "join_right_broadcast_left",
    "parquet_round_trip",
)
"""The default service's: each way a reduce task reads across executors (``to_arrow`` sorts,
broadcasts' rows, chosen or forced, reach every executor, a parquet source's map tasks read
files)."""


def operations(
    spark: SparkSession,
    shuffle: SparkShuffle,
    kill: Kill,
    stores: list[Path],
    only: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Each operation's result beside Spark's (``only`` these, if given)."""
    frame = data(spark).cache()
    dimension = spark.range(0, 120, 1, 3).selectExpr("id % 110 as k", "id * 10 as w").cache()

    def per_group(table: pa.Table) -> pa.Table:
        return pa.table({"k": table.column("k").slice(0, 1), "n": pa.array([table.num_rows])})

    checks: dict[str, Callable[[], bool]] = {
        "repartition": lambda: multiset(shuffle.repartition(frame, "k")) == multiset(frame),
        "group_apply": lambda: (
            multiset(shuffle.group_apply(frame, "k", per_group, "k long, n long"))
            == multiset(frame.groupBy("k").count().withColumnRenamed("count", "n"))
        ),
    }

    def join_equal(how: str, broadcast: str) -> bool:
        ours = shuffle.join(frame, dimension, "k", how, broadcast=broadcast)
        return multiset(ours) == multiset(frame.join(dimension, "k", how))

    # The dimension is small: auto broadcasts it to both executors (every join type's rows are
    # checked in local mode, test_pyspark_operations.py and test_pyspark_broadcast_join.py).
    checks["join_inner"] = functools.partial(join_equal, "inner", "auto")
    checks["join_inner_shuffled"] = functools.partial(join_equal, "inner", "none")
    checks["join_right_broadcast_left"] = functools.partial(join_equal, "right", "left")
    files = Path(tempfile.mkdtemp(prefix="pyshuffle-parquet-"))
    try:

        def parquet_round_trip() -> bool:
            frame.write.partitionBy("k").parquet(str(files / "in"))
            # Read by the map tasks, written by the reduce tasks of both executors.
            source = shuffle.read_parquet(str(files / "in"), columns=["k", "x"])
            grouped = shuffle.group_apply(source, "k", per_group, "k long, n long")
            shuffle.write_parquet(grouped, str(files / "out"))
            expected = frame.groupBy("k").count().withColumnRenamed("count", "n")
            return multiset(spark.read.parquet(str(files / "out"))) == multiset(expected)

        checks["parquet_round_trip"] = parquet_round_trip
        checks["to_arrow"] = lambda: (
            shuffle.to_arrow(shuffle.sort(frame, ["x", "id"])).to_pylist()
            == frame.orderBy("x", "id").toArrow().to_pylist()
        )
        results = {name: check() for name, check in checks.items() if not only or name in only}
    finally:
        shutil.rmtree(files, ignore_errors=True)
    return {"equal": results}


def kill_during_map(
    spark: SparkSession, shuffle: SparkShuffle, kill: Kill, stores: list[Path]
) -> dict[str, Any]:
    frame = slow(spark)
    killed: list[int] = []
    # After the first map tasks finished on it: their partitions go with it.
    killing = kill_after(kill, 2 * SLOW_SECONDS + 2.0, killed)
    result = shuffle.repartition(frame, "k", num_partitions=4)
    equal = multiset(result) == multiset(data(spark))
    killing.join()  # a late kill would land in the application's next step
    [exchange] = shuffle.exchanges(result)
    return {
        "killed": killed,
        "equal": equal,
        # statistics() first: it registers the map tasks Spark reran inside the action.
        "map_tasks_rerun": shuffle.statistics(result).map_tasks_rerun,
        "runs": exchange.runs.per_map,
        "held_by_spark": exchange.on_executors,
    }


def kill_during_reduce(
    spark: SparkSession, shuffle: SparkShuffle, kill: Kill, stores: list[Path]
) -> dict[str, Any]:
    frame = data(spark).cache()
    frame.count()

    def sleepy(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        time.sleep(SLOW_SECONDS)
        yield from batches

    result = shuffle.repartition_map(frame, "k", sleepy, frame.schema, num_partitions=8)
    [exchange] = shuffle.exchanges(result)
    killed: list[int] = []
    killing = kill_after(kill, SLOW_SECONDS + 1.0, killed)
    error = ""
    try:
        equal = multiset(result) == multiset(frame)
    except Exception as failure:  # the action failed: the user's remedy is recover()
        error = without_stack_frames(str(failure))
        equal = multiset(shuffle.recover(result)) == multiset(frame)
    killing.join()
    return {
        "killed": killed,
        "equal": equal,
        "action_error": error,
        # statistics() first: it registers the map tasks Spark reran inside the action.
        "map_tasks_rerun": shuffle.statistics(result).map_tasks_rerun,
        "runs": exchange.runs.per_map,
        "held_by_spark": exchange.on_executors,
    }


def live_executors(spark: SparkSession) -> int:
    return len(spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()) - 1  # driver


def executors_leave_between_stages(
    spark: SparkSession, shuffle: SparkShuffle, kill: Kill, stores: list[Path]
) -> dict[str, Any]:
    """Dynamic allocation removes the idle executor once the map stage wrote to the object
    store; the reduce stage's new one reads it all, and no map task runs again."""
    result = shuffle.repartition(data(spark), "k", num_partitions=4)
    [exchange] = shuffle.exchanges(result)
    deadline = time.monotonic() + 60.0
    while live_executors(spark) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = live_executors(spark)
    return {
        "executors_between_stages": left,
        "equal": multiset(result) == multiset(data(spark)),
        "executors_after": live_executors(spark),
        # statistics() first: it registers the map tasks Spark reran inside the action.
        "map_tasks_rerun": shuffle.statistics(result).map_tasks_rerun,
        "runs": exchange.runs.per_map,
        "held_by_spark": exchange.on_executors,
    }


Scenario = Callable[[SparkSession, SparkShuffle, Kill, list[Path]], dict[str, Any]]

SCENARIOS: dict[str, Scenario] = {
    "data_port_operations": functools.partial(operations, only=DATA_PORT_OPERATIONS),
    "core_operations": functools.partial(operations, only=CORE_OPERATIONS),
    "kill_during_map": kill_during_map,
    "kill_during_reduce": kill_during_reduce,
    "executors_leave_between_stages": executors_leave_between_stages,
}


@dataclass(frozen=True)
class Step:
    """One scenario of an application, under ``label``, with options over the app's own."""

    label: str
    scenario: str
    settings: Mapping[str, object] = field(default_factory=dict)


# One application per service runs its steps in turn: an application on four JVMs costs half
# a minute to start on a quiet machine, a minute on CI's two busy cores. The operations come
# first (no executor or worker lost yet); each later step starts with two live victims.
PLANS: dict[str, tuple[Step, ...]] = {
    "netty_like": (
        Step("operations", "data_port_operations"),
        Step("kill_during_map", "kill_during_map"),
        Step("kill_during_reduce", "kill_during_reduce"),
        Step("object_store_kill_during_map", "kill_during_map", ON_OBJECT_STORE),
        Step("object_store_kill_during_reduce", "kill_during_reduce", ON_OBJECT_STORE),
    ),
    "external_shuffle": (
        Step("operations", "core_operations"),
        Step("kill_during_reduce", "kill_during_reduce"),
        Step(
            "kill_during_reduce_one_replica",
            "kill_during_reduce",
            {"external-shuffle.replication-factor": 1},
        ),
    ),
    "dynamic_allocation": (
        Step("executors_leave_between_stages", "executors_leave_between_stages", ON_OBJECT_STORE),
    ),
}


def run_step(
    spark: SparkSession, step: Step, config: Mapping[str, object], stores: list[Path], kill: Kill
) -> dict[str, Any]:
    started = time.monotonic()
    try:
        with SparkShuffle(spark, config={**config, **step.settings}) as shuffle:
            outcome = SCENARIOS[step.scenario](spark, shuffle, kill, stores)
            outcome["files_before_close"] = len(
                stored_files(stores) + stored_objects(step.settings)
            )
        outcome["files_after_close"] = stored_files(stores) + stored_objects(step.settings)
        outcome["seconds"] = round(time.monotonic() - started, 1)
    except Exception as error:  # one step's failure must not hide the others' outcomes
        outcome = {"error": without_stack_frames(f"{type(error).__name__}: {error}")}
    finally:
        # Cached blocks left on one executor would draw the next step's tasks there.
        spark.catalog.clearCache()
    return outcome


def main() -> int:
    """``WORK_DIR netty_like|external_shuffle``: runs the service's plan in one application
    and prints ``RESULT`` and a JSON object of each step's outcome under its label."""
    work, service = Path(sys.argv[1]), sys.argv[2]
    config: dict[str, object] = {"pyspark-shuffle.progress.interval": "0"}
    plan = PLANS[service]
    with contextlib.ExitStack() as stack:
        if any(step.settings is ON_OBJECT_STORE for step in plan):
            object_store = stack.enter_context(running_stand_in())
            object_store.make_bucket(OBJECT_STORE_BUCKET)
            os.environ.update(object_store.environment())
        # Spark's JVM first, before any gRPC channel has threads: PySpark forks it with a
        # preexec_fn, and a fork among gRPC's threads sometimes lost the child
        # (JAVA_GATEWAY_EXITED after gRPC's "epoll_wait error: Bad file descriptor").
        spark = cluster_session(
            work, DYNAMIC_ALLOCATION if service == "dynamic_allocation" else None
        )
        try:
            outcomes = _run_plan(spark, plan, work, service, config)
        finally:
            spark.stop()
    print("RESULT " + json.dumps(outcomes, default=str))
    return 0


def _run_plan(
    spark: SparkSession,
    plan: tuple[Step, ...],
    work: Path,
    service: str,
    config: dict[str, object],
) -> dict[str, dict[str, Any]]:
    if service != "external_shuffle":
        if service == "netty_like":
            # Every data port and its clients (executors' processes, their hosts, the driver)
            # over TLS, set as a job sets it: the executors read it from the job's settings.
            files = write_tls_files(work / "tls")
            config = {
                **config,
                "netty-like.tls.cert-file": files.cert_file,
                "netty-like.tls.key-file": files.key_file,
                "netty-like.tls.ca-file": files.ca_file,
            }
        return _run_steps(
            spark,
            plan,
            config,
            [work / "local"],
            kill=executor_killer(spark),
            # Dynamic allocation's executors come and go as the tasks need them.
            two_victims=(
                (lambda: None)
                if service == "dynamic_allocation"
                else lambda: wait_for_two_executors(spark)
            ),
        )
    with LocalCluster(work / "cluster", workers=2) as cluster:

        def kill_worker() -> int:
            cluster.kill_worker(0)
            return 0

        def restart_killed_worker() -> None:
            if not cluster.worker_running(0):
                cluster.start_worker(0)
                cluster.wait_for_workers({cluster.worker_target(0)})

        stores = [cluster.worker_store(index) for index in range(2)]
        # As on separate hosts: reads go to the workers, never to their stores' files.
        client = {
            **config,
            **cluster.client_config(),
            "external-shuffle.client.read-from-store": False,
        }
        return _run_steps(
            spark, plan, client, stores, kill=kill_worker, two_victims=restart_killed_worker
        )


def _run_steps(
    spark: SparkSession,
    plan: tuple[Step, ...],
    config: Mapping[str, object],
    stores: list[Path],
    *,
    kill: Kill,
    two_victims: Callable[[], None],
) -> dict[str, dict[str, Any]]:
    """Each step in turn, once ``two_victims`` made sure both executors or workers run."""
    outcomes: dict[str, dict[str, Any]] = {}
    for step in plan:
        two_victims()
        outcomes[step.label] = run_step(spark, step, config, stores, kill)
    return outcomes


if __name__ == "__main__":
    sys.exit(main())
