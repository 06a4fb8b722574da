"""Reading a subpartition range of partitions from a producer's data port, with credit-based
flow control."""

from __future__ import annotations

import functools
import logging
import socket
import time
from collections.abc import Iterator, Sequence
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
from shuffle_runtime.connections import Connection, ConnectionPool, StaleConnectionError
from shuffle_runtime.format import decode_run, verify_checksum
from shuffle_runtime.gate import END_OF_PARTITION
from shuffle_runtime.sockets import write_frame

__all__ = ["CreditSettings", "read_remote"]

_LOG = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CreditSettings:
    initial_credit: int
    max_credit: int
    max_frame_size: int
    connect_timeout: float
    connect_retries: int
    """Connections attempted again after one refused or unanswered (a producer restarting,
    or gone: the engine learns which meanwhile)."""
    connect_retry_wait: float


def read_remote(
    host: str,
    port: int,
    partitions: Sequence[ResultPartitionID],
    subpartitions: SubpartitionRange,
    *,
    pipelined: bool,
    settings: CreditSettings,
    connections: ConnectionPool,
) -> Iterator[list[pa.RecordBatch] | None]:
    """The batches of each buffer of ``partitions`` (several: blocking ones, at most
    ``MAX_BATCH``), in one request, each partition followed by ``END_OF_PARTITION``. On a
    connection of ``connections`` (kept for the next read from this port); closing the
    iterator early closes the connection, and the producer frees what it had queued for us."""
    address = f"{host}:{port}"
    asked = partitions[0] if len(partitions) == 1 else f"{len(partitions)} partitions"

    def read(connection: Connection) -> Iterator[list[pa.RecordBatch] | None]:
        connection.sock.settimeout(None)
        # A channel number of its own per request: the producer may not have forgotten the
        # previous request's channel when the next one arrives.
        request = Request(
            connection.requests,
            tuple(partitions),
            subpartitions,
            settings.initial_credit,
            pipelined,
        )
        yield from _stream(connection.sock, request, settings)

    def connect(fresh: bool = False) -> Connection:
        failed = 0
        while True:
            try:
                return connections.connect(
                    host, port, timeout=settings.connect_timeout, fresh=fresh
                )
            except AuthenticationError:
                raise  # a PermissionError too
            except OSError as error:
                failed += 1
                if failed > settings.connect_retries:
                    raise TransportError(
                        f"cannot connect to the data port {address} of the producer of {asked}"
                        f" ({failed} attempts): {error}"
                    ) from error
                _LOG.info("cannot connect to %s (%s); trying again", address, error)
                time.sleep(settings.connect_retry_wait)

    try:
        yield from connections.exchange(
            connect(), run=read, reconnect=functools.partial(connect, fresh=True)
        )
    except (PartitionError, AuthenticationError, StaleConnectionError):
        raise
    except OSError as error:
        raise TransportError(
            f"data connection to {address} failed while reading {asked}: {error}"
        ) from error
    except ShuffleError as error:
        raise TransportError(f"reading {asked} from {address} failed: {error}") from error


def _stream(
    sock: socket.socket, request: Request, settings: CreditSettings
) -> Iterator[list[pa.RecordBatch] | None]:
    channel = request.channel
    write_frame(sock, request.frame_type, request.encode())
    window = settings.initial_credit
    answered = False
    for partition in request.partitions:
        schema: pa.Schema | None = None
        while True:
            frame = read_frame(sock, settings.max_frame_size)
            if frame is None and not answered:
                raise StaleConnectionError(
                    f"producer closed the connection before answering for {partition}"
                )
            if frame is None:
                raise TransportError(
                    f"producer closed the connection before the end of {partition}"
                )
            answered = True
            frame_type, body = frame
            if frame_type is FrameType.SCHEMA:
                schema = pa.ipc.read_schema(pa.py_buffer(body[4:]))
            elif frame_type is FrameType.BUFFER:
                header, payload = BufferHeader.decode(body)
                if schema is None:
                    raise TransportError(f"data of {partition} arrived before its schema")
                data = pa.py_buffer(payload)
                if header.checksum:
                    verify_checksum(
                        data, header.checksum, partition, "a run received over the network"
                    )
                yield list(decode_run(data, schema, partition))
                # The buffer is consumed: grant it back, plus more while the producer has a
                # backlog.
                grant = 1
                if header.backlog > window and window < settings.max_credit:
                    grant += min(header.backlog - window, settings.max_credit - window)
                    window += grant - 1
                write_frame(sock, FrameType.CREDIT, encode_credit(channel, grant))
            elif frame_type is FrameType.END:
                yield END_OF_PARTITION
                break
            elif frame_type is FrameType.ERROR:
                _, code, message = decode_error(body)
                raise error_from_code(code, message, partition)
            else:
                raise TransportError(f"unexpected {frame_type.name} frame from a producer")
