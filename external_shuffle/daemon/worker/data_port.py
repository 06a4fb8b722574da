"""The worker's data port: fetches over a plain TCP connection, each run sent from the page cache
with sendfile(2). gRPC copies every message in user space at least twice on each side; here the
worker's process never touches the bytes, and the client reads each run into one buffer.

The frames are ``data_frames``'. The port holds what the gRPC port holds: the token proves the
peer (the handshake of :mod:`shuffle_runtime.sockets`: the cluster's secret, or an application's
credential, named by its public part, which then reads that application's partitions only), a
fetch is a worker stream (the same caps,
per client and in all, and the same idle timeout), and errors reach the client as the same
ShuffleError classes. With TLS on, it speaks TLS with the gRPC port's certificate; the runs are
then read by the worker's process to be encrypted (no sendfile).
"""

from __future__ import annotations

import contextlib
import io
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from google.protobuf.message import DecodeError

from external_shuffle.daemon.worker.service import WorkerService
from external_shuffle.ops.metrics import DaemonMetrics
from external_shuffle.wire.credentials import Credential, CredentialCheck
from external_shuffle.wire.data_frames import (
    END,
    FAILED,
    FETCH,
    FETCH_BATCH,
    MANIFEST,
    MAX_REQUEST_SIZE,
    RUN,
    RUN_HEADER,
)
from external_shuffle.wire.errors import error_to_pb, short, status_for
from external_shuffle.wire.stubs import pb
from shuffle_api import AuthenticationError, SerializationError, ShuffleError, TransportError
from shuffle_runtime.connections import SERVER_KEEP_ALIVE_SECONDS
from shuffle_runtime.sockets import (
    MAX_BATCH,
    AuthenticatedListener,
    frame_bytes,
    read_frame,
    wait_readable,
    write_frame,
)

__all__ = ["WorkerDataPort", "WorkerDataPortLimits"]

logger = logging.getLogger(__name__)

# Bytes of small sends gathered into one (see _GatheredSends).
_GATHERED_BYTES: Final = 16 << 10
# The metric label of errors reported on the data port.
_METHOD: Final = "DataPort.Fetch"
# Connections beyond the worker's stream cap, so that a client over it hears
# TooManyStreamsError (retried by the task) rather than a refused connection.
_SPARE_CONNECTIONS: Final = 16
# How often a connection waiting for its next fetch checks whether the port drains meanwhile.
_DRAIN_POLL_SECONDS: Final = 0.2


@dataclass(frozen=True, slots=True)
class WorkerDataPortLimits:
    max_streams: int
    """The worker's stream cap; connections are capped a little above it."""
    max_streams_per_peer: int
    """Its cap per client host; so are connections from one host."""
    handshake_timeout: float
    idle_timeout: float
    """For the request to arrive whole, and for each send to progress (a client that stops
    reading)."""
    piece_size: int
    """Bytes sent between two marks of progress (the idle timeout counts from the last)."""


class WorkerDataPort:
    """Listens on ``host:port`` (0: any free port) from construction; serves fetches from
    :meth:`start` until :meth:`stop`."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        credentials: CredentialCheck,
        limits: WorkerDataPortLimits,
        metrics: DaemonMetrics,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self._limits = limits
        self._metrics = metrics
        self._credentials = credentials
        self._worker: WorkerService | None = None
        self._draining = threading.Event()
        self._listener = AuthenticatedListener(
            host,
            port,
            secret=b"",  # keyed by the identity each client names
            keys=credentials.data_port_key,
            max_connections=limits.max_streams + _SPARE_CONNECTIONS,
            max_connections_per_peer=limits.max_streams_per_peer + _SPARE_CONNECTIONS,
            handshake_timeout=limits.handshake_timeout,
            serve=self._serve,
            name="worker data port",
            on_refused=lambda peer: metrics.auth_failures.labels(method=_METHOD).inc(),
            tls=tls,
        )

    @property
    def port(self) -> int:
        return self._listener.port

    def start(self, worker: WorkerService) -> None:
        self._worker = worker
        self._listener.start()

    def stop_accepting(self) -> None:
        """Take no new fetch (draining); those under way go on, and idle connections end."""
        self._draining.set()
        self._listener.stop_accepting()

    def wait_for_fetches(self, deadline: float) -> None:
        """Until ``deadline`` (``time.monotonic()``), wait for open connections to end."""
        while self._listener.connection_count and time.monotonic() < deadline:
            time.sleep(0.05)

    def stop(self) -> None:
        self._draining.set()
        self._listener.stop()

    def _serve(self, sock: socket.socket, peer: str) -> None:
        """Fetch after fetch, until the client hangs up or idles."""
        self._metrics.data_port_connections.inc()
        running = _Running(
            self._credentials.data_port_caller(self._listener.identity_of(sock)), _grpc_peer(sock)
        )
        try:
            first = True
            while (frame := self._next_request(sock, peer, first=first)) is not None:
                sock.settimeout(self._limits.idle_timeout)  # read_frame shortened it
                self._fetch(sock, frame, running)
                first = False
        except ShuffleError as error:
            if isinstance(error, AuthenticationError):
                self._metrics.auth_failures.labels(method=_METHOD).inc()
            else:
                self._metrics.errors.labels(method=_METHOD, code=status_for(error).name).inc()
            logger.warning("%s from %s failed: %s", _METHOD, peer, short(str(error)))
            if not running.mid_run:  # else the client is reading run bytes: it sees the hang-up
                with contextlib.suppress(OSError):
                    write_frame(sock, FAILED, error_to_pb(error).SerializeToString())

    def _next_request(
        self, sock: socket.socket, peer: str, *, first: bool
    ) -> tuple[int, memoryview] | None:
        """The next request, or None: the client hung up, sent nothing in time, or (after its
        first fetch, idle) the port drains."""
        idle_timeout = self._limits.idle_timeout
        if not first:
            idle_timeout = min(idle_timeout, SERVER_KEEP_ALIVE_SECONDS)
            deadline = time.monotonic() + idle_timeout
            while not wait_readable(sock, _DRAIN_POLL_SECONDS):
                if self._draining.is_set() or time.monotonic() >= deadline:
                    return None
        try:
            return read_frame(sock, MAX_REQUEST_SIZE, time.monotonic() + idle_timeout)
        except TimeoutError:
            logger.info("closing idle data port connection from %s", peer)
            return None

    def _fetch(self, sock: socket.socket, frame: tuple[int, memoryview], running: _Running) -> None:
        """Answer a FETCH, or each fetch of a FETCH_BATCH in turn."""
        self._metrics.data_port_requests.inc()
        frame_type, body = frame
        try:
            if frame_type == FETCH:
                requests = [pb.FetchDataRequest.FromString(bytes(body))]
            elif frame_type == FETCH_BATCH:
                requests = list(pb.FetchBatchRequest.FromString(bytes(body)).fetches)
            else:
                raise TransportError(
                    f"the data port takes FETCH and FETCH_BATCH frames, not type {frame_type}"
                )
        except DecodeError as error:
            raise SerializationError(f"{_METHOD}: the request does not decode: {error}") from None
        if not 0 < len(requests) <= MAX_BATCH:
            raise SerializationError(
                f"{_METHOD}: a batch of {len(requests)} fetches, outside 1..{MAX_BATCH}"
            )
        sends, cancel = _GatheredSends(sock), _hang_up(sock)
        try:
            for request in requests:
                self._fetch_one(sends, cancel, request, running)
        except ShuffleError:
            if not running.mid_run:
                with contextlib.suppress(OSError):
                    sends.flush()  # what was served goes before the error
            raise
        sends.flush()

    def _fetch_one(
        self,
        sends: _GatheredSends,
        cancel: Callable[[], None],
        request: pb.FetchDataRequest,
        running: _Running,
    ) -> None:
        assert self._worker is not None, "started with its worker"
        # An idle fetch (a client that stopped reading) is ended by the worker's reaper.
        with self._worker.open_fetch(request, running.peer, cancel, running.caller) as fetch:
            reader = fetch.reader
            reader.check_data_file()
            sends.sendall(frame_bytes(MANIFEST, reader.manifest_to_send))
            for run in reader.runs(fetch.subpartitions):
                header = frame_bytes(RUN, RUN_HEADER.pack(run.length, run.checksum))
                running.mid_run = True
                reader.send_run(
                    sends, header, run, piece_size=self._limits.piece_size, sent=fetch.sent
                )
                running.mid_run = False
            sends.sendall(frame_bytes(END, b""))


class _GatheredSends:
    """A connection as a batch of fetches sends on it: small sends are gathered and made as
    one once they reach :data:`_GATHERED_BYTES`, before a send from a file, and at the end. A
    reducer's batch of a thousand small blocks took two sends a block."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._pending: list[bytes | memoryview] = []
        self._pending_bytes = 0

    def sendall(self, data: bytes | memoryview, /) -> None:
        self._pending.append(data)
        self._pending_bytes += len(data)
        if self._pending_bytes >= _GATHERED_BYTES:
            self.flush()

    def sendfile(self, file: io.FileIO, offset: int = 0, count: int | None = None) -> int:
        self.flush()
        return self._sock.sendfile(file, offset, count)

    def flush(self) -> None:
        if self._pending:
            pending = self._pending
            self._pending, self._pending_bytes = [], 0
            self._sock.sendall(pending[0] if len(pending) == 1 else b"".join(pending))


@dataclass
class _Running:
    caller: Credential  # who the connection's client proved to be
    peer: str
    """As gRPC names it (:func:`_grpc_peer`), so a client's streams count once per host."""
    mid_run: bool = False


def _grpc_peer(sock: socket.socket) -> str:
    """The peer as gRPC's ``context.peer()`` gives it (``ipv4:host:port``, ``ipv6:[host]:port``)."""
    host, port = sock.getpeername()[:2]
    return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"


def _hang_up(sock: socket.socket) -> Callable[[], None]:
    """A callable ending the connection (the send or read under way fails)."""

    def hang_up() -> None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)

    return hang_up
