"""One worker daemon under load and abuse at once: ``--idle`` push streams opened and left
silent (each sends its first message, then nothing), while ``--jobs`` jobs of ``--writers``
writers each push a partition and read it back, on a worker with a ``--budget`` memory budget.
A job's writer refused because the worker has as many streams as it takes retries as a task
would (a new attempt, after a backoff).

Printed and saved: the worst and 99th-percentile health-check latency (checked every 0.1 s
throughout), whether every job read back exactly its rows, the worker's peak RSS beside its
budget + 256 MiB, its most threads, the refusals and the seconds.

    .venv/bin/python benchmarks/external_load.py
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
from common import machine, save_results
from grpc_health.v1 import health_pb2, health_pb2_grpc

from external_shuffle.local_cluster import LocalCluster
from external_shuffle.options import WORKER_MEMORY_BUDGET
from external_shuffle.wire.errors import TooManyStreamsError
from external_shuffle.wire.messages import key_of
from external_shuffle.wire.stubs import pb, pb_grpc
from shuffle_api import (
    Configuration,
    IntermediateResultPartitionID,
    ResultPartitionID,
    ShuffleDescriptor,
    SubpartitionRange,
    new_id,
)
from shuffle_api.testing import ConformanceHarness, ShuffleScenario, make_batches
from shuffle_api.testing.harness import route

RESULTS = Path(__file__).parent / "results" / "external_load.json"
SUBPARTITIONS = 4
RSS_ALLOWANCE = 256 << 20


def _proc_status(pid: int) -> tuple[int, int]:
    """(RSS bytes, threads) of a process, from /proc."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["Threads"])


class _Watch(threading.Thread):
    """Health latency and the worker's RSS and threads, sampled until stopped."""

    def __init__(self, cluster: LocalCluster) -> None:
        super().__init__(daemon=True)
        self._cluster = cluster
        self.stop = threading.Event()
        self.latencies: list[float] = []
        self.failed_checks = 0
        self.peak_rss = 0
        self.peak_threads = 0

    def run(self) -> None:
        pid = self._cluster.worker_pid(0)
        with grpc.insecure_channel(self._cluster.worker_target(0)) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while not self.stop.wait(0.1):
                started = time.monotonic()
                try:
                    health.Check(health_pb2.HealthCheckRequest(), timeout=5)
                    self.latencies.append(time.monotonic() - started)
                except grpc.RpcError:
                    self.failed_checks += 1
                rss, threads = _proc_status(pid)
                self.peak_rss = max(self.peak_rss, rss)
                self.peak_threads = max(self.peak_threads, threads)


def _idle_pushes(
    cluster: LocalCluster, count: int, stop: threading.Event
) -> list[grpc.Future[pb.PushDataResponse]]:
    token = cluster.token_file.read_text().strip()
    channel = grpc.insecure_channel(cluster.worker_target(0))
    stub = pb_grpc.WorkerStub(channel)

    def silent() -> Iterator[pb.PushDataRequest]:
        partition = ResultPartitionID(
            IntermediateResultPartitionID("idle-" + new_id(), 0), "attempt-" + new_id()
        )
        yield pb.PushDataRequest(partition=key_of(partition), sequence=0, data=b"x" * 1024)
        stop.wait()

    return [
        stub.PushData.future(silent(), metadata=[("authorization", f"Bearer {token}")])
        for _ in range(count)
    ]


def _refused(call: grpc.Future[pb.PushDataResponse]) -> bool:
    error = call.exception() if call.done() else None
    return isinstance(error, grpc.Call) and error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def _job(
    cluster: LocalCluster, writers: int, rows: int, refusals: list[int], exact: list[bool]
) -> None:
    config = Configuration.load(
        cluster.client_config(
            **{
                "external-shuffle.client.read-from-store": False,
                "external-shuffle.client.sort-buffer.size": "1m",
            }
        ),
        environ={},
    )
    with ShuffleScenario.open(ConformanceHarness(config)) as scenario:
        batches = make_batches(rows, batch_rows=2_000)
        written: list[ShuffleDescriptor | None] = [None] * writers

        def write(index: int) -> None:
            descriptor = scenario.partition_descriptor(
                index, partitions=writers, subpartitions=SUBPARTITIONS
            )
            backoff = 0.2
            while True:
                try:
                    shuffle_descriptor, writer = scenario.new_writer(descriptor)
                    with writer:
                        for batch in batches[index::writers]:
                            writer.write(batch, route(batch, SUBPARTITIONS))
                        writer.finish()
                    written[index] = shuffle_descriptor
                    return
                except TooManyStreamsError:
                    refusals.append(1)
                    time.sleep(backoff)
                    backoff = min(backoff * 2, 2.0)

        threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        descriptors = [descriptor for descriptor in written if descriptor is not None]
        table = scenario.read(
            scenario.consumer, descriptors, SubpartitionRange(0, SUBPARTITIONS - 1)
        )
        expected = sorted(r for b in batches for r in b.column("row").to_pylist())
        exact.append(sorted(table.column("row").to_pylist()) == expected)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--rows", type=int, default=200_000, help="rows per job")
    parser.add_argument("--budget", default="1m", help="the worker's memory budget")
    parser.add_argument("--idle-timeout", type=float, default=10.0)
    args = parser.parse_args()
    budget = Configuration.load({WORKER_MEMORY_BUDGET.key: args.budget}, environ={}).get(
        WORKER_MEMORY_BUDGET
    )
    settings = {
        "external-shuffle.worker.memory-budget": args.budget,
        "external-shuffle.worker.stream-idle-timeout": args.idle_timeout,
    }
    with (
        tempfile.TemporaryDirectory() as directory,
        LocalCluster(Path(directory), workers=1, store_shared=False, settings=settings) as cluster,
    ):
        watch = _Watch(cluster)
        watch.start()
        stop = threading.Event()
        started = time.monotonic()
        idle = _idle_pushes(cluster, args.idle, stop)
        refusals: list[int] = []
        exact: list[bool] = []
        jobs = [
            threading.Thread(target=_job, args=(cluster, args.writers, args.rows, refusals, exact))
            for _ in range(args.jobs)
        ]
        for job in jobs:
            job.start()
        for job in jobs:
            job.join()
        seconds = time.monotonic() - started
        stop.set()
        idle_refused = sum(_refused(call) for call in idle)
        watch.stop.set()
        watch.join()
    latencies = sorted(watch.latencies)
    figures = {
        "idle_streams": args.idle,
        "idle_streams_refused_at_once": idle_refused,
        "jobs": args.jobs,
        "writers_per_job": args.writers,
        "jobs_exact": sum(exact),
        "writer_refusals_retried": len(refusals),
        "health_checks": len(latencies),
        "health_checks_failed": watch.failed_checks,
        "health_max_seconds": round(latencies[-1], 3),
        "health_p99_seconds": round(latencies[int(len(latencies) * 0.99) - 1], 3),
        "memory_budget_bytes": budget,
        "peak_rss_bytes": watch.peak_rss,
        "rss_limit_bytes": budget + RSS_ALLOWANCE,
        "peak_threads": watch.peak_threads,
        "seconds": round(seconds, 1),
    }
    width = max(map(len, figures))
    for name, value in figures.items():
        print(f"{name:<{width}}  {value}")
    checks = {
        "health within 1 s": watch.failed_checks == 0 and latencies[-1] <= 1.0,
        "every job exact": sum(exact) == args.jobs,
        "peak RSS within budget + 256 MiB": watch.peak_rss <= budget + RSS_ALLOWANCE,
    }
    for name, held in checks.items():
        print(f"{name}: {'yes' if held else 'NO'}")
    save_results(RESULTS, {"machine": machine(), "figures": figures, "checks": checks})


if __name__ == "__main__":
    main()
