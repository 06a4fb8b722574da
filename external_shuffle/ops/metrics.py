"""The daemon's Prometheus metrics (one registry per daemon process, served over HTTP with the
probes' /healthz and /readyz): each role exports its own, and a process exports those of the
roles it runs."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Collection, Iterable
from typing import Any, Final
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import (
    PLATFORM_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    ProcessCollector,
    make_wsgi_app,
)
from prometheus_client.exposition import ThreadingWSGIServer

from external_shuffle.ops.health import PROBE_HEADERS, Readiness, probe_answer
from shuffle_api import ConfigError
from shuffle_runtime.package_version import package_version

__all__ = ["COORDINATOR", "WORKER", "DaemonMetrics"]

COORDINATOR: Final = "coordinator"
WORKER: Final = "worker"
# Seconds a push or fetch stream lasts: from a small partition's milliseconds to the minutes
# of a large one on a busy disk.
_STREAM_SECONDS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

logger = logging.getLogger(__name__)

_StartResponse = Callable[[str, list[tuple[str, str]]], Any]
_WsgiApp = Callable[[dict[str, Any], _StartResponse], Iterable[bytes]]


class _QuietHandler(WSGIRequestHandler):
    """Requests at debug level (a scrape every few seconds is no news), not on stderr. A
    connection idle or half-sent for 10 s is closed: its thread does not wait for ever."""

    timeout = 10

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug(format, *args)


def _with_probes(metrics: _WsgiApp, readiness: Readiness) -> _WsgiApp:
    """``metrics``, with the probes' paths answered first."""

    def app(environ: dict[str, Any], start_response: _StartResponse) -> Iterable[bytes]:
        answer = probe_answer(environ.get("PATH_INFO", ""), readiness)
        if answer is None:
            return metrics(environ, start_response)
        headers = [*PROBE_HEADERS.items(), ("Content-Length", str(len(answer.body)))]
        start_response(f"{answer.status.value} {answer.status.phrase}", headers)
        return [answer.body]

    return app


class DaemonMetrics:
    """What the roles of one daemon count. A metric of a role the process does not run is
    still there to be updated, but not exported (``registry=None``)."""

    def __init__(self, roles: Collection[str] = (COORDINATOR, WORKER)) -> None:
        self.registry = CollectorRegistry()
        every = self.registry
        # process_*: CPU seconds, resident memory, open descriptors, start time; python_info.
        ProcessCollector(registry=every)
        every.register(PLATFORM_COLLECTOR)
        Info("pyshuffle_build", "The pyshuffle this daemon runs", registry=every).info(
            {"version": package_version(), "roles": ",".join(sorted(roles))}
        )
        self._add_shared_metrics(every)
        self._add_worker_metrics(every if WORKER in roles else None)
        self._add_coordinator_metrics(every if COORDINATOR in roles else None)

    def _add_shared_metrics(self, every: CollectorRegistry) -> None:
        """The metrics of every role."""
        self.errors = Counter(
            "pyshuffle_errors",
            "Calls refused or failed, by method and status code (each one is also logged)",
            ["method", "code"],
            registry=every,
        )
        self.auth_failures = Counter(
            "pyshuffle_auth_failures",
            "Calls refused for a missing, wrong or expired credential, or one that may not make"
            " them, by method (each one is also logged)",
            ["method"],
            registry=every,
        )
        self.partitions = Gauge(
            "pyshuffle_partitions",
            "Committed partitions on this worker (worker) or tracked (coordinator)",
            ["role"],
            registry=every,
        )

    def _add_worker_metrics(self, worker: CollectorRegistry | None) -> None:
        """The worker's metrics, exported to ``worker`` (None: not exported)."""
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
            "Seconds a push lasted: a stream, first message to last, or a PushPartition call",
            buckets=_STREAM_SECONDS,
            registry=worker,
        )
        self.fetch_seconds = Histogram(
            "pyshuffle_fetch_seconds",
            "Seconds a fetch stream lasted, request to last message sent",
            buckets=_STREAM_SECONDS,
            registry=worker,
        )
        self.bytes_moved_to_tier = Counter(
            "pyshuffle_bytes_moved_to_tier",
            "Partition bytes this worker moved to its tier store",
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

    def _add_coordinator_metrics(self, coordinator: CollectorRegistry | None) -> None:
        """The coordinator's metrics, exported to ``coordinator`` (None: not exported)."""
        self.applications = Gauge(
            "pyshuffle_applications", "Registered applications", registry=coordinator
        )
        self.workers_alive = Gauge(
            "pyshuffle_workers_alive", "Workers whose heartbeats arrive", registry=coordinator
        )

    def serve(self, host: str, port: int, readiness: Readiness) -> int:
        """Serve ``/metrics``, ``/healthz`` and ``/readyz`` (of ``readiness``) on ``host:port``
        (0: a free port) in threads of their own; returns the port."""
        # An IPv6 host ("::") needs an IPv6 socket, which the server class does not pick.
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)

        class Server(ThreadingWSGIServer):
            address_family = found[0][0]

        app = _with_probes(make_wsgi_app(self.registry), readiness)
        try:
            server = make_server(host, port, app, Server, handler_class=_QuietHandler)
        except OSError as error:
            raise ConfigError(f"cannot serve the metrics on {host}:{port}: {error}") from error
        threading.Thread(target=server.serve_forever, name="pyshuffle-metrics", daemon=True).start()
        return int(server.server_port)
