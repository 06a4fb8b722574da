"""The data port: serves partitions to consumers in other processes, and answers the control
requests of the driver (status, release) and, on an executor's host, of its writers.

One thread accepts; one thread per connection reads control frames; one thread per requested
channel sends, one BUFFER per credit. A consumer that disconnects releases its view, which frees
the producer's queued buffers.

Every connection first proves it holds the application's secret (:mod:`shuffle_runtime.sockets`).
Everything a peer can make this process hold is bounded: connections, channels per connection
and in all, the size of a frame read (allocated only as its bytes arrive), and time: the
handshake, an idle connection and a half-sent frame each time out.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

from netty_like.partition_manager import EncodedRun, ResultPartitionManager, SubpartitionView
from netty_like.protocol import (
    BUFFER_HEADER_SIZE,
    BufferHeader,
    FrameType,
    HostedState,
    Request,
    decode_channel,
    decode_credit,
    decode_hosted,
    decode_partitions,
    encode_channel,
    encode_error,
    encode_held,
    encode_statuses,
    read_frame,
)
from shuffle_api import (
    DataTooLargeError,
    InvalidOperationError,
    ResultPartitionID,
    ShuffleError,
    TransportError,
)
from shuffle_runtime.connections import SERVER_KEEP_ALIVE_SECONDS
from shuffle_runtime.sockets import AuthenticatedListener, wait_readable, write_frame

__all__ = ["DataServer", "NettyDataPortLimits"]

_LOG = logging.getLogger(__name__)
# How often a waiting sender looks whether its channel was cancelled.
_POLL_SECONDS = 0.2
# Refusals logged one by one per connection; the rest are counted.
_LOGGED_REFUSALS = 5
# Requests and partition lists; a STATUS of 10,000 partitions is about 700 kB.
_MAX_REQUEST = 8 << 20
_WAIT_SLICE_SECONDS = 0.5


@dataclass(frozen=True, slots=True)
class NettyDataPortLimits:
    """What one data port lets its peers hold."""

    max_frame_size: int
    """Largest frame sent (a run of data); frames read from peers (requests and partition
    lists) are smaller still: see :attr:`max_request_size`."""
    max_connections: int = 256
    max_channels: int = 512
    """Channels (one sending thread each) open at once, over all connections."""
    max_channels_per_connection: int = 64
    handshake_timeout: float = 10.0
    idle_timeout: float = 120.0
    """A connection with no open channel that sends nothing for this long is closed; so is one
    that stops in the middle of a frame for this long."""

    @property
    def max_request_size(self) -> int:
        """Largest frame read from a peer."""
        return min(self.max_frame_size, _MAX_REQUEST)


class _Connection:
    def __init__(self, sock: socket.socket, peer: str, server: DataServer) -> None:
        self.sock = sock
        self.peer = peer
        self.server = server
        self.send_lock = threading.Lock()
        self.channels: dict[int, _Channel] = {}
        self.closed = threading.Event()
        self.refusals = 0
        self.channels_served = 0

    def send(self, frame_type: FrameType, header: bytes, payload: pa.Buffer | bytes = b"") -> None:
        with self.send_lock:
            write_frame(self.sock, frame_type, header, payload)

    def serve(self) -> None:
        """Read control frames until the peer hangs up or idles (the listener did the
        handshake)."""
        limits = self.server.limits
        try:
            # For every receive, and for the channels' sends (a consumer that stops reading).
            self.sock.settimeout(limits.idle_timeout)
            while self._wait_for_frame():
                frame = read_frame(self.sock, limits.max_request_size)
                if frame is None:
                    break
                self._handle(*frame)
        except TimeoutError:
            _LOG.info("closing data connection from %s: a frame stopped midway", self.peer)
        finally:
            self.close()

    def _wait_for_frame(self) -> bool:
        """Until the peer sends something (True), or idles with no channel open (False): for
        the idle timeout, or, between the requests of a reader's connection, a short while:
        clients keep such a connection idle for less (see shuffle_runtime.connections), and each
        one held counts against ``max_connections``. A consumer waiting for data may say
        nothing for as long as it waits."""
        idle_since = time.monotonic()
        while not self.closed.is_set():
            if wait_readable(self.sock, _WAIT_SLICE_SECONDS):
                return True
            if self._open_channels():
                idle_since = time.monotonic()
                continue
            idle_timeout = self.server.limits.idle_timeout
            if self.channels_served:
                idle_timeout = min(idle_timeout, SERVER_KEEP_ALIVE_SECONDS)
            if time.monotonic() - idle_since >= idle_timeout:
                _LOG.info("closing idle data connection from %s", self.peer)
                return False
        return False

    def _open_channels(self) -> bool:
        return any(not channel.finished.is_set() for channel in list(self.channels.values()))

    def _handle(self, frame_type: FrameType, body: memoryview) -> None:
        if frame_type in (FrameType.REQUEST, FrameType.REQUEST_BATCH):
            self._open_channel(frame_type, body)
        elif frame_type is FrameType.CREDIT:
            channel_id, credits = decode_credit(body)
            channel = self.channels.get(channel_id)
            if channel is not None:
                channel.add_credit(credits)
        elif frame_type is FrameType.CANCEL:
            channel = self.channels.get(decode_channel(body))
            if channel is not None:
                channel.cancel()
        elif frame_type in _CONTROL:
            self._control(frame_type, body)
        else:
            raise TransportError(f"unexpected {frame_type.name} frame from a peer")

    def _control(self, frame_type: FrameType, body: memoryview) -> None:
        """Answer a control request in order: ACK, STATUS_REPLY or ERROR."""
        manager = self.server.manager
        try:
            if frame_type is FrameType.STATUS:
                statuses = manager.statuses(decode_partitions(body))
                self.send(FrameType.STATUS_REPLY, encode_statuses(statuses))
                return
            if frame_type is FrameType.HELD:
                self.send(FrameType.HELD_REPLY, encode_held(manager.held(decode_partitions(body))))
                return
            if frame_type is FrameType.RELEASE:
                manager.release(decode_partitions(body))
            elif frame_type is FrameType.HOST:
                if not self.server.hosts_partitions:
                    raise InvalidOperationError(
                        "this data port hosts no other process's partitions"
                    )
                state, partition = decode_hosted(body)
                if state is HostedState.WRITING:
                    manager.register_writing(partition)
                else:
                    manager.adopt_committed(partition)
            elif frame_type is FrameType.SHUTDOWN:
                if self.server.on_shutdown is None:
                    raise InvalidOperationError("this data port does not shut down on request")
                self.server.on_shutdown()
            self.send(FrameType.ACK, b"")
        except ShuffleError as error:
            self._refused(f"{frame_type.name} refused: {error}")
            self.send(FrameType.ERROR, encode_error(0, error))

    def _open_channel(self, frame_type: FrameType, body: memoryview) -> None:
        limits = self.server.limits
        try:
            request = Request.decode(frame_type, body)
        except ShuffleError as error:
            self.send(FrameType.ERROR, encode_error(0, error))
            return
        refusal: str | None = None
        if request.channel in self.channels:
            refusal = f"channel {request.channel} is already open on this connection"
        elif len(self.channels) >= limits.max_channels_per_connection:
            refusal = (
                f"a connection may have {limits.max_channels_per_connection} channels open at once"
            )
        elif not self.server.take_channel():
            refusal = f"the data port serves {limits.max_channels} channels at once; try again"
        if refusal is not None:
            self._refused(f"request refused: {refusal}")
            self.send(FrameType.ERROR, encode_error(request.channel, TransportError(refusal)))
            return
        channel = _Channel(self, request)
        self.channels[request.channel] = channel
        threading.Thread(
            target=channel.run, name=f"pyshuffle-send-{request.partitions[0]}", daemon=True
        ).start()

    def _refused(self, what: str) -> None:
        """Log a refusal; past the first few on a connection, only their count (at close), so
        a peer cannot grow the log without bound."""
        self.refusals += 1
        if self.refusals <= _LOGGED_REFUSALS:
            _LOG.warning("data port: %s from %s", what, self.peer)

    def forget_channel(self, channel_id: int) -> None:
        self.channels.pop(channel_id, None)
        self.channels_served += 1
        self.server.return_channel()

    def close(self) -> None:
        if self.refusals > _LOGGED_REFUSALS and not self.closed.is_set():
            _LOG.warning(
                "data port: %d more requests from %s were refused",
                self.refusals - _LOGGED_REFUSALS,
                self.peer,
            )
        self.closed.set()
        for channel in list(self.channels.values()):
            channel.cancel()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # the listener closes it


_CONTROL = frozenset(
    {FrameType.STATUS, FrameType.HELD, FrameType.RELEASE, FrameType.HOST, FrameType.SHUTDOWN}
)


class _Channel:
    def __init__(self, connection: _Connection, request: Request) -> None:
        self._connection = connection
        self._request = request
        self._credit = request.initial_credit
        self._condition = threading.Condition()
        self._cancelled = False
        self.finished = threading.Event()

    def add_credit(self, credits: int) -> None:
        with self._condition:
            self._credit += credits
            self._condition.notify_all()

    def cancel(self) -> None:
        with self._condition:
            self._cancelled = True
            self._condition.notify_all()

    def _take_credit(self) -> bool:
        with self._condition:
            self._condition.wait_for(lambda: self._credit > 0 or self._cancelled)
            if self._cancelled:
                return False
            self._credit -= 1
            return True

    def run(self) -> None:
        """Serve the request's partitions in order; an error ends the channel."""
        request = self._request
        try:
            for partition in request.partitions:
                if self._cancelled:
                    return
                view = self._connection.server.manager.create_view(
                    partition,
                    request.subpartitions,
                    pipelined=request.pipelined,
                    verify=False,
                    cancelled=lambda: self._cancelled,
                )
                try:
                    self._stream(partition, view)
                finally:
                    view.release()
        except ShuffleError as error:
            self._send_error(error)
        except OSError as error:
            # A send that failed (a consumer that stopped reading past the timeout, or went
            # away) may have left a frame half written: nothing more can follow on it.
            _LOG.info(
                "sending %s to %s failed: %s", request.partitions, self._connection.peer, error
            )
            self._connection.close()
        finally:
            self.finished.set()
            self._connection.forget_channel(request.channel)

    def _stream(self, partition: ResultPartitionID, view: SubpartitionView) -> None:
        channel = self._request.channel
        schema_sent = False
        max_payload = self._connection.server.limits.max_frame_size - BUFFER_HEADER_SIZE
        while self._take_credit():
            item = view.poll(_POLL_SECONDS)
            while item is False:
                if self._cancelled:
                    return
                item = view.poll(_POLL_SECONDS)
            if item is None:
                self._give_back_credit()  # END takes none
                self._connection.send(FrameType.END, encode_channel(channel))
                return
            if isinstance(item, EncodedRun):
                schema = view.schema
                payload, checksum = item.data, item.checksum
            else:
                assert isinstance(item, pa.RecordBatch)
                schema = item.schema
                payload, checksum = item.serialize(), 0
            if not schema_sent and schema is not None:
                self._connection.send(FrameType.SCHEMA, encode_channel(channel), schema.serialize())
                schema_sent = True
            if payload.size > max_payload:
                raise DataTooLargeError(
                    f"a buffer of {payload.size} bytes of partition {partition}"
                    " exceeds netty-like.network.max-frame-size; a single row that large"
                    " cannot be sent"
                )
            header = BufferHeader(channel, view.backlog, checksum).encode()
            self._connection.send(FrameType.BUFFER, header, payload)

    def _give_back_credit(self) -> None:
        with self._condition:
            self._credit += 1

    def _send_error(self, error: ShuffleError) -> None:
        with contextlib.suppress(OSError):
            self._connection.send(FrameType.ERROR, encode_error(self._request.channel, error))


class DataServer:
    """Listens on ``host:port`` (0: any free port) until :meth:`stop`; serves peers that hold
    ``secret``. ``hosts_partitions``: other processes of this executor may hand it their
    partitions (HOST frames); ``on_shutdown``: what a SHUTDOWN request runs (none: refused);
    ``tls``: the server context every connection is TLS with (None: plaintext)."""

    def __init__(
        self,
        manager: ResultPartitionManager,
        host: str,
        port: int,
        *,
        secret: bytes,
        limits: NettyDataPortLimits,
        hosts_partitions: bool = False,
        on_shutdown: Callable[[], None] | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.manager = manager
        self.limits = limits
        self.hosts_partitions = hosts_partitions
        self.on_shutdown = on_shutdown
        self._listener = AuthenticatedListener(
            host,
            port,
            secret=secret,
            max_connections=limits.max_connections,
            handshake_timeout=limits.handshake_timeout,
            serve=lambda sock, peer: _Connection(sock, peer, self).serve(),
            name="data port",
            tls=tls,
        )
        self._channels = 0
        self._requests = 0
        self._lock = threading.Lock()

    @property
    def port(self) -> int:
        return self._listener.port

    def start(self) -> int:
        return self._listener.start()

    def take_channel(self) -> bool:
        with self._lock:
            if self._channels >= self.limits.max_channels:
                return False
            self._channels += 1
            self._requests += 1
            return True

    @property
    def request_count(self) -> int:
        """Requests served so far (a channel each: one partition, or a batch)."""
        return self._requests

    def return_channel(self) -> None:
        with self._lock:
            self._channels -= 1

    @property
    def connection_count(self) -> int:
        return self._listener.connection_count

    def stop(self) -> None:
        self._listener.stop()
