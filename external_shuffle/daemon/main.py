"""``pyshuffle daemon --role coordinator|worker|all --config FILE``.

Each role serves its own gRPC port with the token interceptor, message limits, optional TLS and
the gRPC health service (SERVING once all the process's ports are up); one HTTP endpoint serves
the process's Prometheus metrics and the probes' ``/healthz`` and ``/readyz``. SIGTERM (or
SIGINT) drains: health turns NOT_SERVING (and ``/readyz`` 503), a worker takes no new
partitions, in-flight streams get ``external-shuffle.daemon.shutdown-grace`` seconds to finish,
then the process exits.
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from external_shuffle.allocator import keep_message_buffers
from external_shuffle.daemon.coordinator.service import CoordinatorService
from external_shuffle.daemon.interceptors import (
    RequestDecodingInterceptor,
    TokenInterceptor,
    WireVersionInterceptor,
)
from external_shuffle.daemon.logs import configure_logging
from external_shuffle.daemon.streams import OpenStreamLimits
from external_shuffle.daemon.worker.data_port import WorkerDataPort, WorkerDataPortLimits
from external_shuffle.daemon.worker.registration import heartbeat_loop
from external_shuffle.daemon.worker.service import WorkerService
from external_shuffle.ops.health import Readiness
from external_shuffle.ops.metrics import COORDINATOR, WORKER, DaemonMetrics
from external_shuffle.ops.status_page import StatusPage
from external_shuffle.options import (
    APPLICATION_CREDENTIAL_LIFETIME,
    APPLICATION_TIMEOUT,
    BIND_HOST,
    COORDINATOR_ADDRESS,
    COORDINATOR_PORT,
    COORDINATOR_STATUS_PORT,
    DAEMON_OPTIONS,
    LOG_FORMAT,
    LOG_LEVEL,
    LOG_LEVELS,
    MAX_MESSAGE_SIZE,
    METRICS_PORT,
    PLACEMENT,
    SHUTDOWN_GRACE,
    WORKER_ADVERTISED_HOST,
    WORKER_APPLICATION_QUOTA,
    WORKER_DATA_PORT,
    WORKER_HEARTBEAT_INTERVAL,
    WORKER_MAX_STREAMS,
    WORKER_MAX_STREAMS_PER_PEER,
    WORKER_MEMORY_BUDGET,
    WORKER_MEMORY_BUDGET_TIMEOUT,
    WORKER_PORT,
    WORKER_STORE_SHARED,
    WORKER_STORE_URL,
    WORKER_STREAM_IDLE_TIMEOUT,
    WORKER_TIER_HIGH_WATER,
    WORKER_TIER_URL,
    WORKER_TIMEOUT,
    coordinator_addresses,
    message_chunk_size,
    message_data_limit,
)
from external_shuffle.wire.auth import data_port_server_tls, load_token, server_credentials
from external_shuffle.wire.channels import ChannelPool, ClientSettings, channel_options
from external_shuffle.wire.credentials import CredentialCheck
from external_shuffle.wire.framing import worker_rpc_handler
from external_shuffle.wire.stubs import pb_grpc
from scheduling.placement import new_placement_strategy
from shuffle_api import ConfigError, Configuration, ShuffleError
from shuffle_api.options import CORE_OPTIONS
from shuffle_api.plugins import Command
from shuffle_runtime.cli import DAEMON, validate_for_role
from shuffle_runtime.package_version import package_version
from shuffle_runtime.store import Store

__all__ = ["COMMAND", "ROLES", "Daemon", "load_configuration", "main"]

logger = logging.getLogger(__name__)

ROLES: Final = ("coordinator", "worker", "all")
# The roles each --role runs (and whose metrics the process exports).
ROLES_SERVED: Final = {
    "coordinator": (COORDINATOR,),
    "worker": (WORKER,),
    "all": (COORDINATOR, WORKER),
}
# Handler threads beyond the streams a worker admits (each open stream holds one): health
# checks, commits and status calls always find one. Calls past threads + queue are refused.
_UNARY_THREADS: Final = 16
_QUEUED_CALLS_PER_THREAD: Final = 4
# The data port's time for a peer to prove it holds the token.
_HANDSHAKE_TIMEOUT: Final = 10.0
# Seconds between a worker's checks of what to move to its tier store.
_TIER_CHECK_PERIOD: Final = 1.0


def _coordinator_port(configuration: Configuration) -> int:
    """The port the coordinator role listens on."""
    port = configuration.get(COORDINATOR_PORT)
    if port:
        return port
    addresses = coordinator_addresses(configuration)
    if len(addresses) > 1:
        raise ConfigError(
            f"{COORDINATOR_ADDRESS.key} names {len(addresses)} coordinators: set"
            f" {COORDINATOR_PORT.key} to the port this one listens on"
        )
    return int(addresses[0].rpartition(":")[2])


@dataclass
class _Served:
    server: grpc.Server
    port: int
    health: health.HealthServicer


class Daemon(Readiness):
    """The roles of one daemon process, started and stopped together."""

    def __init__(self, configuration: Configuration, role: str) -> None:
        if role not in ROLES:
            raise ConfigError(f"unknown role {role!r}; choose one of {', '.join(ROLES)}")
        validate_for_role(configuration, DAEMON, [*CORE_OPTIONS, *DAEMON_OPTIONS])
        self._config = configuration
        self._role = role
        self._token = load_token(configuration)
        self._credentials_check = CredentialCheck(self._token)
        self._credentials = server_credentials(configuration)
        self._bind = configuration.get(BIND_HOST)
        self.metrics = DaemonMetrics(ROLES_SERVED[role])
        self._peers = ChannelPool(ClientSettings.from_configuration(configuration))
        self._served: list[_Served] = []
        self.coordinator: CoordinatorService | None = None
        self.worker: WorkerService | None = None
        self.data_port: WorkerDataPort | None = None
        self.metrics_port: int | None = None
        self._status_page: StatusPage | None = None
        self.status_port: int | None = None
        self._stop_background = threading.Event()  # heartbeats and the worker's reaper
        self._heartbeats: list[threading.Thread] = []
        self._known_by: list[threading.Event] = []  # per coordinator: it knows this worker
        self._reaper: threading.Thread | None = None
        self._started = False
        self._stopping = False

    def _new_server(self, port: int, streams: int = 0) -> _Served:
        threads = streams + _UNARY_THREADS
        server = grpc.server(
            ThreadPoolExecutor(threads, thread_name_prefix="pyshuffle-rpc"),
            interceptors=[
                TokenInterceptor(self._credentials_check, self.metrics),
                WireVersionInterceptor(self.metrics),
                RequestDecodingInterceptor(self.metrics),
            ],
            # Without SO_REUSEPORT (gRPC sets it): a second daemon on a port in use fails to
            # start instead of silently taking half of the first one's connections.
            options=[
                *channel_options(self._config.get(MAX_MESSAGE_SIZE)),
                ("grpc.so_reuseport", 0),
            ],
            maximum_concurrent_rpcs=threads * _QUEUED_CALLS_PER_THREAD,
        )
        address = f"{self._bind}:{port}"
        try:
            bound = (
                server.add_insecure_port(address)
                if self._credentials is None
                else server.add_secure_port(address, self._credentials)
            )
        except RuntimeError:  # grpcio raises where older versions returned 0
            bound = 0
        if bound == 0:
            raise ConfigError(f"cannot listen on {address} (port in use?)")
        health_servicer = health.HealthServicer()
        health_servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        served = _Served(server, bound, health_servicer)
        self._served.append(served)
        return served

    def start(self) -> None:
        """Serve the role's ports. If one cannot be served, stops those already serving (their
        gRPC threads would keep the process alive, answering nothing) and raises."""
        try:
            self._start_roles()
        except BaseException:
            self.stop()
            raise

    def _start_roles(self) -> None:
        config = self._config
        keep_message_buffers(config.get(MAX_MESSAGE_SIZE))
        if self._role in ("coordinator", "all"):
            self._start_coordinator()
        if self._role in ("worker", "all"):
            self._start_worker()
        metrics_port = config.get(METRICS_PORT)
        if metrics_port >= 0:
            self.metrics_port = self.metrics.serve(self._bind, metrics_port, self)
            logger.info("metrics serving", extra={"port": self.metrics_port})
        # Only now: a client that waits for SERVING finds every port of the process up.
        for served in self._served:
            served.health.set("", health_pb2.HealthCheckResponse.SERVING)
        self._started = True

    def _start_coordinator(self) -> None:
        """Serve the coordinator role's gRPC port, then its status page where configured."""
        config = self._config
        served = self._new_server(_coordinator_port(config))
        self.coordinator = CoordinatorService(
            placement=new_placement_strategy(config.get(PLACEMENT), config_key=PLACEMENT.key),
            worker_timeout=config.get(WORKER_TIMEOUT),
            application_timeout=config.get(APPLICATION_TIMEOUT),
            peers=self._peers,
            metrics=self.metrics,
            coordinators=coordinator_addresses(config),
            credentials=self._credentials_check,
            application_credential_lifetime=config.get(APPLICATION_CREDENTIAL_LIFETIME),
        )
        pb_grpc.add_CoordinatorServicer_to_server(self.coordinator, served.server)
        self.coordinator.start()
        served.server.start()
        logger.info("coordinator serving", extra={"port": served.port})
        status_port = config.get(COORDINATOR_STATUS_PORT)
        if status_port >= 0:
            self._status_page = StatusPage(
                self.coordinator.view, self._credentials_check, self.metrics, self
            )
            self.status_port = self._status_page.serve(self._bind, status_port)
            logger.info("status page serving", extra={"port": self.status_port})

    def _start_worker(self) -> None:
        """Serve the worker role's gRPC port and data port, start its background threads,
        then register it with the coordinators."""
        config = self._config
        limits = OpenStreamLimits(
            idle_timeout=config.get(WORKER_STREAM_IDLE_TIMEOUT),
            max_streams=config.get(WORKER_MAX_STREAMS),
            max_streams_per_peer=config.get(WORKER_MAX_STREAMS_PER_PEER),
        )
        served = self._new_server(config.get(WORKER_PORT), limits.max_streams)
        self.data_port = self._new_data_port(limits)
        worker = self.worker = self._new_worker(
            served.port, 0 if self.data_port is None else self.data_port.port, limits
        )
        served.server.add_generic_rpc_handlers((worker_rpc_handler(worker),))
        self._start_housekeeping(worker, limits)
        served.server.start()
        if self.data_port is not None:
            self.data_port.start(worker)
        self._start_heartbeats(worker)
        logger.info(
            "worker serving",
            extra={
                "port": served.port,
                "data_port": worker.address.data_port,
                "worker_id": worker.address.worker_id,
            },
        )

    def _new_worker(self, port: int, data_port: int, limits: OpenStreamLimits) -> WorkerService:
        config = self._config
        return WorkerService(
            # Never memory-mapped: a file truncated under a fetch must not kill the daemon.
            Store(config.get(WORKER_STORE_URL), memory_map=False),
            host=self._advertised_host(),
            port=port,
            data_port=data_port,
            store_shared=config.get(WORKER_STORE_SHARED),
            memory_budget=config.get(WORKER_MEMORY_BUDGET),
            budget_timeout=config.get(WORKER_MEMORY_BUDGET_TIMEOUT),
            chunk_size=message_chunk_size(config),
            message_data_limit=message_data_limit(config),
            metrics=self.metrics,
            stream_limits=limits,
            tier=Store(config.get(WORKER_TIER_URL)) if config.get(WORKER_TIER_URL) else None,
            application_quota=config.get(WORKER_APPLICATION_QUOTA),
            credentials=self._credentials_check,
        )

    def _start_housekeeping(self, worker: WorkerService, limits: OpenStreamLimits) -> None:
        """The worker's reaper of idle streams, and its mover to the tier store if it has one."""
        self._reaper = threading.Thread(
            target=self._reap_worker,
            args=(worker, min(1.0, limits.idle_timeout / 4)),
            name="worker-reaper",
            daemon=True,
        )
        self._reaper.start()
        if worker.state.tier is not None:
            threading.Thread(
                target=self._move_to_tier,
                args=(worker, self._config.get(WORKER_TIER_HIGH_WATER)),
                name="worker-tier-mover",
                daemon=True,
            ).start()

    def _start_heartbeats(self, worker: WorkerService) -> None:
        """Registers the worker with each coordinator: any of them may place on it, and
        restart."""
        config = self._config
        for address in coordinator_addresses(config):
            known = threading.Event()
            self._known_by.append(known)
            heartbeats = threading.Thread(
                target=heartbeat_loop,
                args=(
                    worker,
                    pb_grpc.CoordinatorStub(self._peers.get(address)),
                    config.get(WORKER_HEARTBEAT_INTERVAL),
                    self._stop_background,
                    self._peers.settings.timeout,
                ),
                kwargs={"known": known},
                name=f"worker-heartbeats-{address}",
                daemon=True,
            )
            heartbeats.start()
            self._heartbeats.append(heartbeats)

    def not_ready(self) -> str | None:
        """Ready: started and not stopping; a worker also known to a coordinator and not
        draining."""
        if self._stopping:
            return "shutting down"
        if not self._started:
            return "starting"
        if self.worker is not None:
            if self.worker.state.draining:
                return "the worker is decommissioning: it takes no new partitions"
            if not any(known.is_set() for known in self._known_by):
                return "the worker is registered with no coordinator"
        return None

    def _new_data_port(self, limits: OpenStreamLimits) -> WorkerDataPort | None:
        port = self._config.get(WORKER_DATA_PORT)
        if port < 0:
            return None
        try:
            return WorkerDataPort(
                self._bind,
                port,
                credentials=self._credentials_check,
                limits=WorkerDataPortLimits(
                    max_streams=limits.max_streams,
                    max_streams_per_peer=limits.max_streams_per_peer,
                    handshake_timeout=_HANDSHAKE_TIMEOUT,
                    idle_timeout=limits.idle_timeout,
                    piece_size=message_chunk_size(self._config),
                ),
                metrics=self.metrics,
                tls=data_port_server_tls(self._config),
            )
        except OSError as error:
            raise ConfigError(
                f"cannot listen on {self._bind}:{port} ({WORKER_DATA_PORT.key}): {error}"
            ) from error

    def _reap_worker(self, worker: WorkerService, period: float) -> None:
        while not self._stop_background.wait(period):
            worker.reap()

    def _move_to_tier(self, worker: WorkerService, high_water: int) -> None:
        while not self._stop_background.wait(_TIER_CHECK_PERIOD):
            worker.move_to_tier(high_water)

    def _advertised_host(self) -> str:
        advertised = self._config.get(WORKER_ADVERTISED_HOST)
        if advertised:
            return advertised
        return socket.gethostname() if self._bind in ("0.0.0.0", "::", "") else self._bind

    def stop(self) -> None:
        """Drain, then stop: in-flight streams get the shutdown grace to finish."""
        self._stopping = True
        for served in self._served:
            served.health.enter_graceful_shutdown()
        if self.worker is not None:
            self.worker.state.drain()
        if self.data_port is not None:
            self.data_port.stop_accepting()  # as gRPC takes no new call; fetches go on
        deadline = time.monotonic() + self._config.get(SHUTDOWN_GRACE)
        if self.worker is not None:
            # The server takes calls meanwhile: partitions pushed now get their commit in.
            self.worker.state.wait_for_pushes(deadline)
        grace = max(0.0, deadline - time.monotonic())
        stopped = [served.server.stop(grace) for served in self._served]
        if self.data_port is not None:
            self.data_port.wait_for_fetches(time.monotonic() + grace)
            self.data_port.stop()
        for event in stopped:
            event.wait()
        self._stop_background.set()
        for thread in [*self._heartbeats, *([self._reaper] if self._reaper else [])]:
            thread.join(timeout=5)
        if self._status_page is not None:
            self._status_page.stop()
        if self.coordinator is not None:
            self.coordinator.stop()
        self._peers.close()
        logger.info("stopped")


_STOP_SIGNALS: Final = frozenset({signal.SIGTERM, signal.SIGINT})


def load_configuration(config_file: str | None, log_level: str | None) -> Configuration:
    """The daemon's options: ``config_file``, ``PYSHUFFLE_*`` variables over it, and the
    ``--log-level`` flag (when given) over both."""
    flags = {} if log_level is None else {LOG_LEVEL.key: log_level}
    return Configuration.load(flags, toml_file=config_file)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pyshuffle daemon", description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=ROLES, default="all", help="what this process serves")
    parser.add_argument("--config", help="TOML file of options (PYSHUFFLE_* variables override)")
    parser.add_argument(
        "--log-level", choices=LOG_LEVELS, help=f"least level logged (wins over {LOG_LEVEL.key})"
    )
    args = parser.parse_args(argv)
    configuration = load_configuration(args.config, args.log_level)
    configure_logging(configuration.get(LOG_FORMAT), configuration.get(LOG_LEVEL))
    logger.info(
        "pyshuffle %s starting",
        package_version(),
        extra={
            "role": args.role,
            "config_file": args.config or "",
            "environment": sorted(configuration.environment),  # names only: no secret logged
        },
    )
    # Blocked in every thread (they inherit the mask) and taken by sigwait below: a Python
    # handler that sets an Event can deadlock on the Event's lock when the signal lands while
    # the main thread waits on that Event, and the daemon then ignores SIGTERM for good. A
    # signal sent during start stays pending until the wait, so it still drains.
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        daemon = Daemon(configuration, args.role)
        daemon.start()
    except ShuffleError as error:
        logger.error("cannot start: %s", error)
        print(f"pyshuffle daemon: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    received = signal.sigwait(_STOP_SIGNALS)
    logger.info("draining after %s", signal.Signals(received).name)
    daemon.stop()
    return 0


COMMAND = Command(
    "run the external shuffle service (coordinator, worker or both; needs pyshuffle[external])",
    main,
)

if __name__ == "__main__":
    sys.exit(main())
