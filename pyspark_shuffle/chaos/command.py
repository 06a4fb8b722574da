"""``pyshuffle chaos``: N randomized jobs on ``local-cluster[2,1,1024]``, each with 1-3 faults
at random moments (an executor's JVM or a Python worker killed, an executor or a daemon paused,
a daemon killed, stopped or restarted, a daemon's connections dropped, a store filled), each
checked against Spark's own result, the stores empty after it, no daemon crashed. Run K is seed
``--seed + K``: ``--seed S --runs 1`` repeats a run exactly as planned.

Dropped connections need ``ss -K`` to work (root), full stores a ``tmpfs`` of their own (root,
and a service whose stores are directories of their own: the external one); where the host
refuses either, runs do not draw it, and the summary says which kinds a service drew from.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import tempfile
from pathlib import Path
from typing import Any

from pyspark_shuffle.chaos.connections import can_abort_connections
from pyspark_shuffle.chaos.disks import SmallDisk, SmallDisks
from pyspark_shuffle.chaos.plans import ChaosSummary, fault_kinds, plan_run
from pyspark_shuffle.chaos.runner import SESSION_SETTINGS, ChaosRunner
from pyspark_shuffle.spark.local import local_cluster_session
from shuffle_api.plugins import LOCAL_DEPLOYMENTS, Command, load_plugin, plugins
from shuffle_api.testing import LocalDeployment, LocalDeploymentFactory

__all__ = ["COMMAND", "main"]

_SERVICES = ("netty_like", "external_shuffle")
# Room for the largest run's files (a few MB) many times over; a fault fills it to the brim.
_SMALL_DISK_BYTES = 256 << 20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pyshuffle chaos", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="randomized runs (default 10)")
    parser.add_argument("--seed", type=int, default=1, help="the first run's seed (default 1)")
    parser.add_argument(
        "--services",
        default=",".join(_SERVICES),
        help="comma-separated services to draw from (default: %(default)s)",
    )
    parser.add_argument(
        "--output", type=Path, help="write the summary as JSON here (after every run)"
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="go on from --output's summary: its runs count toward --runs, seeds follow its last",
    )
    parser.add_argument(
        "--work", type=Path, help="directory for Spark's and the daemons' files (default: temp)"
    )
    parser.add_argument(
        "--label", default="", help="recorded with this run's stretch of seeds (a commit, say)"
    )
    args = parser.parse_args(argv)
    if args.resume and args.output is None:
        parser.error("--resume goes on from --output's summary: name it")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    services = tuple(name.strip() for name in args.services.split(",") if name.strip())
    with contextlib.ExitStack() as resources:
        work = args.work or Path(resources.enter_context(tempfile.TemporaryDirectory()))
        summary = _run(args, services, work, resources)
    print(json.dumps({k: v for k, v in summary.items() if k != "failures"}, indent=1))
    sound = not (summary["wrong_results"] or summary["files_left"] or summary["daemon_crashes"])
    return 0 if sound and not summary["failed_runs"] else 1


def _run(
    args: argparse.Namespace, services: tuple[str, ...], work: Path, resources: contextlib.ExitStack
) -> dict[str, object]:
    disks = resources.enter_context(SmallDisks(_SMALL_DISK_BYTES))
    # The default service's stores are in Spark's local directory, which local-cluster's
    # driver shares: filling it fails Spark's own files (PySpark's broadcasts), a fault of the
    # driver's disk, not of a store. So only stores of their own are filled.
    small_disks: dict[str, list[SmallDisk]] = {}
    # Spark's JVM first, before any gRPC channel has threads: PySpark forks it.
    spark = local_cluster_session("pyshuffle-chaos", work, SESSION_SETTINGS)
    resources.callback(spark.stop)
    deployments: dict[str, LocalDeployment] = {}
    for service in services:
        if service in plugins(LOCAL_DEPLOYMENTS):
            factory: LocalDeploymentFactory = load_plugin(LOCAL_DEPLOYMENTS, service)
            deployment = factory(work / service, {})
            stores = [disks.mount(store) for store in deployment.store_directories().values()]
            if stores and all(stores):
                small_disks[service] = [store for store in stores if store is not None]
            deployments[service] = resources.enter_context(deployment)
    runner = ChaosRunner(spark, work, deployments, small_disks)
    droppable = can_abort_connections()
    kinds = {
        service: fault_kinds(
            service in deployments,
            connections_droppable=droppable,
            stores_fillable=service in small_disks,
        )
        for service in services
    }
    previous = _previous(args)
    summary = ChaosSummary() if previous is None else ChaosSummary.from_json(previous)
    first = args.seed if summary.last_seed is None else summary.last_seed + 1
    segments = [] if previous is None else list(previous.get("segments", []))
    segments.append({"first_seed": first, "runs": 0, "label": args.label, "fault_kinds": kinds})
    found: dict[str, object] = {**summary.to_json(), "fault_kinds": kinds, "segments": segments}
    for seed in range(first, first + max(0, args.runs - summary.runs)):
        plan = plan_run(seed, kinds)
        outcome = runner.run(plan)
        summary.add(outcome)
        segments[-1].update(last_seed=seed, runs=int(segments[-1]["runs"]) + 1)
        found = {**summary.to_json(), "fault_kinds": kinds, "segments": segments}
        if args.output is not None:  # after each run: a long run stopped keeps what it found
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(json.dumps(found, indent=1) + "\n")
        faults = ", ".join(f"{f.kind} {f.target or '(none)'} in {f.phase}" for f in outcome.faults)
        print(
            f"run {seed}: {plan.service} {plan.operation} {plan.rows} rows"
            f" {plan.map_tasks}x{plan.reducers} replicas {plan.replicas}: {outcome.result}"
            f" ({outcome.seconds} s, files left {outcome.files_left}, crashed"
            f" {list(outcome.crashed_daemons)}) faults: {faults}",
            flush=True,
        )
    return found


def _previous(args: argparse.Namespace) -> dict[str, Any] | None:
    """The summary a resumed run goes on from (none yet: it starts afresh)."""
    if not args.resume or not args.output.exists():
        return None
    document: dict[str, Any] = json.loads(args.output.read_text())
    return document


COMMAND = Command("randomized jobs with faults at random moments, checked against Spark", main)
