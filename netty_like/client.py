"""Reading a subpartition range from a producer's data port, with credit-based flow control."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from netty_like.protocol import (
    BufferHeader,
    FrameType,
    Request,
    decode_error,
    encode_credit,
    error_from_code,
    read_frame,
)
from shuffle_api import (
    AuthenticationError,
    PartitionError,
    ResultPartitionID,
    ShuffleError,
    SubpartitionRange,
    TransportError,
)
from shuffle_api.format import decode_run, verify_checksum
from shuffle_api.sockets import open_handshake, write_frame

__all__ = ["CreditSettings", "read_remote"]


@dataclass(frozen=True, slots=True)
class CreditSettings:
    initial_credit: int
    max_credit: int
    max_frame_size: int
    connect_timeout: float


def read_remote(
    host: str,
    port: int,
    partition: ResultPartitionID,
    subpartitions: SubpartitionRange,
    *,
    pipelined: bool,
    settings: CreditSettings,
    secret: bytes,
) -> Iterator[pa.RecordBatch]:
    """Yield the batches; closing the iterator early closes the connection, and the producer
    frees what it had queued for us."""
    address = f"{host}:{port}"
    try:
        sock = socket.create_connection((host, port), timeout=settings.connect_timeout)
    except OSError as error:
        raise TransportError(
            f"cannot connect to the data port {address} of the producer of {partition}: {error}"
        ) from error
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        open_handshake(sock, secret, address)
        sock.settimeout(None)
        yield from _stream(sock, partition, subpartitions, pipelined, settings)
    except (PartitionError, AuthenticationError):
        raise
    except OSError as error:
        raise TransportError(
            f"data connection to {address} failed while reading {partition}: {error}"
        ) from error
    except ShuffleError as error:
        raise TransportError(f"reading {partition} from {address} failed: {error}") from error
    finally:
        sock.close()


def _stream(
    sock: socket.socket,
    partition: ResultPartitionID,
    subpartitions: SubpartitionRange,
    pipelined: bool,
    settings: CreditSettings,
) -> Iterator[pa.RecordBatch]:
    channel = 1
    request = Request(channel, partition, subpartitions, settings.initial_credit, pipelined)
    write_frame(sock, FrameType.REQUEST, request.encode())
    window = settings.initial_credit
    schema: pa.Schema | None = None
    while True:
        frame = read_frame(sock, settings.max_frame_size)
        if frame is None:
            raise TransportError(f"producer closed the connection before the end of {partition}")
        frame_type, body = frame
        if frame_type is FrameType.SCHEMA:
            schema = pa.ipc.read_schema(pa.py_buffer(body[4:]))
        elif frame_type is FrameType.BUFFER:
            header, payload = BufferHeader.decode(body)
            if schema is None:
                raise TransportError(f"data of {partition} arrived before its schema")
            data = pa.py_buffer(payload)
            if header.checksum:
                verify_checksum(data, header.checksum, partition, "a run received over the network")
            yield from decode_run(data, schema, partition)
            # The buffer is consumed: grant it back, plus more while the producer has a backlog.
            grant = 1
            if header.backlog > window and window < settings.max_credit:
                grant += min(header.backlog - window, settings.max_credit - window)
                window += grant - 1
            write_frame(sock, FrameType.CREDIT, encode_credit(channel, grant))
        elif frame_type is FrameType.END:
            return
        elif frame_type is FrameType.ERROR:
            _, code, message = decode_error(body)
            raise error_from_code(code, message, partition)
        else:
            raise TransportError(f"unexpected {frame_type.name} frame from a producer")
