"""The data port: serves this process's partitions to consumers in other processes.

One thread accepts; one thread per connection reads control frames; one thread per requested
channel sends, one BUFFER per credit. A consumer that disconnects releases its view, which frees
the producer's queued buffers.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading

import pyarrow as pa

from netty_like.partition_manager import EncodedRun, ResultPartitionManager, SubpartitionView
from netty_like.protocol import (
    BUFFER_HEADER_SIZE,
    BufferHeader,
    FrameType,
    Request,
    decode_channel,
    decode_credit,
    encode_channel,
    encode_error,
    read_frame,
    write_frame,
)
from shuffle_api import DataTooLargeError, ShuffleError

__all__ = ["DataServer"]

_LOG = logging.getLogger(__name__)
# How often a waiting sender looks whether its channel was cancelled.
_POLL_SECONDS = 0.2


class _Connection:
    def __init__(self, sock: socket.socket, server: DataServer) -> None:
        self.sock = sock
        self.server = server
        self.send_lock = threading.Lock()
        self.channels: dict[int, _Channel] = {}
        self.closed = threading.Event()

    def send(self, frame_type: FrameType, header: bytes, payload: pa.Buffer | bytes = b"") -> None:
        with self.send_lock:
            write_frame(self.sock, frame_type, header, payload)

    def serve(self) -> None:
        try:
            while not self.closed.is_set():
                frame = read_frame(self.sock, self.server.max_frame_size)
                if frame is None:
                    break
                frame_type, body = frame
                if frame_type is FrameType.REQUEST:
                    self._open_channel(body)
                elif frame_type is FrameType.CREDIT:
                    channel_id, credits = decode_credit(body)
                    channel = self.channels.get(channel_id)
                    if channel is not None:
                        channel.add_credit(credits)
                elif frame_type is FrameType.CANCEL:
                    channel = self.channels.get(decode_channel(body))
                    if channel is not None:
                        channel.cancel()
                else:
                    raise ShuffleError(f"unexpected {frame_type.name} frame from a consumer")
        except (OSError, ShuffleError) as error:
            _LOG.debug("data connection ended: %s", error)
        finally:
            self.close()

    def _open_channel(self, body: memoryview) -> None:
        try:
            request = Request.decode(body)
        except ShuffleError as error:
            self.send(FrameType.ERROR, encode_error(0, error))
            return
        channel = _Channel(self, request)
        self.channels[request.channel] = channel
        threading.Thread(
            target=channel.run, name=f"pyshuffle-send-{request.partition}", daemon=True
        ).start()

    def close(self) -> None:
        self.closed.set()
        for channel in list(self.channels.values()):
            channel.cancel()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.server.forget(self)


class _Channel:
    def __init__(self, connection: _Connection, request: Request) -> None:
        self._connection = connection
        self._request = request
        self._credit = request.initial_credit
        self._condition = threading.Condition()
        self._cancelled = False

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
        request = self._request
        view: SubpartitionView | None = None
        try:
            view = self._connection.server.manager.create_view(
                request.partition, request.subpartitions, pipelined=request.pipelined, verify=False
            )
            self._stream(view)
        except ShuffleError as error:
            self._send_error(error)
        except OSError as error:
            _LOG.debug("sending %s failed: %s", request.partition, error)
        finally:
            if view is not None:
                view.release()

    def _stream(self, view: SubpartitionView) -> None:
        channel = self._request.channel
        schema_sent = False
        max_payload = self._connection.server.max_frame_size - BUFFER_HEADER_SIZE
        while self._take_credit():
            item = view.poll(_POLL_SECONDS)
            while item is False:
                if self._cancelled:
                    return
                item = view.poll(_POLL_SECONDS)
            if item is None:
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
                    f"a buffer of {payload.size} bytes of partition {self._request.partition}"
                    " exceeds netty-like.network.max-frame-size; a single row that large"
                    " cannot be sent"
                )
            header = BufferHeader(channel, view.backlog, checksum).encode()
            self._connection.send(FrameType.BUFFER, header, payload)

    def _send_error(self, error: ShuffleError) -> None:
        with contextlib.suppress(OSError):
            self._connection.send(FrameType.ERROR, encode_error(self._request.channel, error))


class DataServer:
    """Listens on ``host:port`` (0: any free port) until :meth:`stop`."""

    def __init__(
        self, manager: ResultPartitionManager, host: str, port: int, max_frame_size: int
    ) -> None:
        self.manager = manager
        self.max_frame_size = max_frame_size
        self._listener = socket.create_server((host, port))
        self._connections: set[_Connection] = set()
        self._lock = threading.Lock()
        self._accepting = threading.Thread(
            target=self._accept, name="pyshuffle-accept", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1])

    def start(self) -> int:
        self._accepting.start()
        return self.port

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return  # listener closed by stop()
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            connection = _Connection(sock, self)
            with self._lock:
                self._connections.add(connection)
            threading.Thread(
                target=connection.serve, name="pyshuffle-connection", daemon=True
            ).start()

    def forget(self, connection: _Connection) -> None:
        with self._lock:
            self._connections.discard(connection)

    @property
    def connection_count(self) -> int:
        with self._lock:
            return len(self._connections)

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            connection.close()
        if self._accepting.is_alive():
            self._accepting.join(timeout=5)
