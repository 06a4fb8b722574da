"""The daemon's Prometheus metrics (one registry per daemon process, served over HTTP)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

__all__ = ["DaemonMetrics"]


class DaemonMetrics:
    """What the roles of one daemon count; both roles of ``--role all`` share it."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.bytes_in = Counter(
            "pyshuffle_bytes_in", "Partition bytes pushed to this worker", registry=self.registry
        )
        self.bytes_out = Counter(
            "pyshuffle_bytes_out",
            "Partition bytes fetched from this worker",
            registry=self.registry,
        )
        self.duplicates_dropped = Counter(
            "pyshuffle_duplicate_pushes_dropped",
            "Pushed messages dropped because their sequence number was already received",
            registry=self.registry,
        )
        self.errors = Counter(
            "pyshuffle_errors",
            "Calls that failed, by method and status code",
            ["method", "code"],
            registry=self.registry,
        )
        self.partitions = Gauge(
            "pyshuffle_partitions",
            "Committed partitions on this worker (worker) or tracked (coordinator)",
            ["role"],
            registry=self.registry,
        )
        self.stored_bytes = Gauge(
            "pyshuffle_stored_bytes", "Bytes of committed partitions", registry=self.registry
        )
        self.memory_in_use = Gauge(
            "pyshuffle_memory_in_use_bytes",
            "Pushed bytes held in memory, waiting to be written",
            registry=self.registry,
        )
        self.applications = Gauge(
            "pyshuffle_applications", "Registered applications", registry=self.registry
        )
        self.workers_alive = Gauge(
            "pyshuffle_workers_alive", "Workers whose heartbeats arrive", registry=self.registry
        )

    def serve(self, host: str, port: int) -> int:
        """Serve ``/metrics`` on ``host:port`` (0: a free port); returns the port."""
        server, _ = start_http_server(port, addr=host, registry=self.registry)
        return int(server.server_port)
