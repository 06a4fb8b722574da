"""The daemon's Prometheus metrics (one registry per daemon process, served over HTTP): each
role exports its own, and a process exports those of the roles it runs."""

from __future__ import annotations

from collections.abc import Collection
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

__all__ = ["COORDINATOR", "WORKER", "DaemonMetrics"]

COORDINATOR: Final = "coordinator"
WORKER: Final = "worker"
# Seconds a push or fetch stream lasts: from a small partition's milliseconds to the minutes
# of a large one on a busy disk.
_STREAM_SECONDS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class DaemonMetrics:
    """What the roles of one daemon count. A metric of a role the process does not run is
    still there to be updated, but not exported (``registry=None``)."""

    def __init__(self, roles: Collection[str] = (COORDINATOR, WORKER)) -> None:
        self.registry = CollectorRegistry()
        every = self.registry
        worker = every if WORKER in roles else None
        coordinator = every if COORDINATOR in roles else None
        self.errors = Counter(
            "pyshuffle_errors",
            "Calls refused or failed, by method and status code (each one is also logged)",
            ["method", "code"],
            registry=every,
        )
        self.auth_failures = Counter(
            "pyshuffle_auth_failures",
            "Calls refused for a missing or wrong token, by method (each one is also logged)",
            ["method"],
            registry=every,
        )
        self.partitions = Gauge(
            "pyshuffle_partitions",
            "Committed partitions on this worker (worker) or tracked (coordinator)",
            ["role"],
            registry=every,
        )
        self.bytes_in = Counter(
            "pyshuffle_bytes_in", "Partition bytes pushed to this worker", registry=worker
        )
        self.bytes_out = Counter(
            "pyshuffle_bytes_out", "Partition bytes fetched from this worker", registry=worker
        )
        self.duplicates_dropped = Counter(
            "pyshuffle_duplicate_pushes_dropped",
            "Pushed messages dropped because their sequence number was already received",
            registry=worker,
        )
        self.push_seconds = Histogram(
            "pyshuffle_push_seconds",
            "Seconds a push stream lasted, first message to last",
            buckets=_STREAM_SECONDS,
            registry=worker,
        )
        self.fetch_seconds = Histogram(
            "pyshuffle_fetch_seconds",
            "Seconds a fetch stream lasted, request to last message sent",
            buckets=_STREAM_SECONDS,
            registry=worker,
        )
        self.data_port_connections = Counter(
            "pyshuffle_data_port_connections",
            "Authenticated connections the data port served (each carries fetch after fetch)",
            registry=worker,
        )
        self.data_port_requests = Counter(
            "pyshuffle_data_port_requests",
            "Requests the data port answered or failed (a FETCH_BATCH names many partitions)",
            registry=worker,
        )
        self.open_streams = Gauge(
            "pyshuffle_open_streams", "Push and fetch streams open on this worker", registry=worker
        )
        self.stored_bytes = Gauge(
            "pyshuffle_stored_bytes", "Bytes of committed partitions", registry=worker
        )
        self.store_free_bytes = Gauge(
            "pyshuffle_store_free_bytes",
            "Bytes free on the file system of this worker's store (a local store only)",
            registry=worker,
        )
        self.memory_in_use = Gauge(
            "pyshuffle_memory_in_use_bytes",
            "Pushed bytes held in memory, waiting to be written",
            registry=worker,
        )
        self.applications = Gauge(
            "pyshuffle_applications", "Registered applications", registry=coordinator
        )
        self.workers_alive = Gauge(
            "pyshuffle_workers_alive", "Workers whose heartbeats arrive", registry=coordinator
        )

    def serve(self, host: str, port: int) -> int:
        """Serve ``/metrics`` on ``host:port`` (0: a free port); returns the port."""
        server, _ = start_http_server(port, addr=host, registry=self.registry)
        return int(server.server_port)
