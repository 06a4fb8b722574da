"""Frames of the data port (credit-based flow control after Flink's netty shuffle).

Every frame: ``!IB`` (length of the rest, type), a fixed header for the type, then a payload.
A connection opens with a handshake: the server sends CHALLENGE (a nonce), the client answers
AUTH (its own nonce and proof that it holds the application's secret), the server AUTH_OK (its
proof). Then:
Consumer -> producer: REQUEST (with initial credit), CREDIT, CANCEL.
Producer -> consumer: SCHEMA, BUFFER (one per credit, carries the backlog), END, ERROR.
Control, answered in order by ACK, STATUS_REPLY or ERROR: HOST (a process of the same
executor hands a partition it writes or wrote to the executor's host), STATUS (which of these
partitions are held, with their statistics), RELEASE, SHUTDOWN (a host's application is done).
"""

from __future__ import annotations

import enum
import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from shuffle_api import (
    AuthenticationError,
    ChecksumMismatchError,
    DataTooLargeError,
    IntermediateResultPartitionID,
    InvalidIdentifierError,
    PartitionAlreadyConsumedError,
    PartitionCorruptedError,
    PartitionError,
    PartitionNotFoundError,
    PartitionStatistics,
    ProducerFailedError,
    ResultPartitionID,
    ShuffleError,
    StorageError,
    SubpartitionRange,
    TransportError,
)

__all__ = [
    "BUFFER_HEADER_SIZE",
    "BufferHeader",
    "FrameType",
    "HostedState",
    "Request",
    "decode_hosted",
    "decode_partitions",
    "decode_statuses",
    "encode_hosted",
    "encode_partitions",
    "encode_statuses",
    "error_code",
    "error_from_code",
    "read_frame",
    "write_frame",
]

_PREFIX = struct.Struct("!IB")
_REQUEST = struct.Struct("!IIII?")
_CHANNEL = struct.Struct("!I")
_CREDIT = struct.Struct("!II")
_BUFFER = struct.Struct("!IIQ")
_ERROR = struct.Struct("!IB")
_COUNT = struct.Struct("!I")
_NAME = struct.Struct("!H")
_STATE = struct.Struct("!B")


class FrameType(enum.IntEnum):
    REQUEST = 1
    CREDIT = 2
    CANCEL = 3
    SCHEMA = 4
    BUFFER = 5
    END = 6
    ERROR = 7
    CHALLENGE = 8
    AUTH = 9
    AUTH_OK = 10
    HOST = 11
    STATUS = 12
    STATUS_REPLY = 13
    RELEASE = 14
    ACK = 15
    SHUTDOWN = 16


class HostedState(enum.IntEnum):
    """What a HOST frame says of a partition: being written (the host deletes it if its writer
    never commits), or committed (the host serves it)."""

    WRITING = 1
    COMMITTED = 2


# Most specific first: the first class an error is an instance of gives its code.
_ERROR_CODES: tuple[tuple[int, type[ShuffleError]], ...] = (
    (1, PartitionNotFoundError),
    (2, ChecksumMismatchError),
    (3, PartitionCorruptedError),
    (4, ProducerFailedError),
    (5, PartitionAlreadyConsumedError),
    (6, DataTooLargeError),
    (7, InvalidIdentifierError),
    (9, AuthenticationError),
    (10, StorageError),
    (8, ShuffleError),
)


def error_code(error: BaseException) -> int:
    for code, cls in _ERROR_CODES:
        if isinstance(error, cls):
            return code
    return _ERROR_CODES[-1][0]


def error_from_code(code: int, message: str, partition: ResultPartitionID | None) -> ShuffleError:
    cls = dict(_ERROR_CODES).get(code, ShuffleError)
    if issubclass(cls, PartitionError):
        return cls(message, partition)
    return cls(message)


@dataclass(frozen=True, slots=True)
class Request:
    channel: int
    partition: ResultPartitionID
    subpartitions: SubpartitionRange
    initial_credit: int
    pipelined: bool

    def encode(self) -> bytes:
        return _REQUEST.pack(
            self.channel,
            self.subpartitions.start,
            self.subpartitions.end,
            self.initial_credit,
            self.pipelined,
        ) + encode_partition(self.partition)

    @classmethod
    def decode(cls, body: memoryview) -> Request:
        if len(body) < _REQUEST.size:
            raise InvalidIdentifierError("partition request frame is too short")
        channel, start, end, credit, pipelined = _REQUEST.unpack_from(body)
        partition = decode_partition(body[_REQUEST.size :])
        try:
            subpartitions = SubpartitionRange(start, end)
        except ValueError as error:
            raise InvalidIdentifierError(f"bad subpartition range in request: {error}") from None
        return cls(channel, partition, subpartitions, credit, pipelined)


# Errors quote at most this much of what a peer sent.
_QUOTED = 80


def encode_partition(partition: ResultPartitionID) -> bytes:
    partition_id = partition.partition_id
    name = f"{partition_id.result_id}/{partition_id.partition_index}/"
    return (name + partition.producer_attempt_id).encode("utf-8")


def decode_partition(body: memoryview | bytes) -> ResultPartitionID:
    """A partition id from its name; ids are validated, so none can name a path outside a
    store."""
    text = bytes(body).decode("utf-8", "replace")
    parts = text.split("/")
    if len(parts) != 3 or not parts[1].isdigit():
        raise InvalidIdentifierError(f"malformed partition id: {text[:_QUOTED]!r}")
    try:
        return ResultPartitionID(IntermediateResultPartitionID(parts[0], int(parts[1])), parts[2])
    except ValueError as error:
        raise InvalidIdentifierError(f"invalid partition id {text[:_QUOTED]!r}: {error}") from None


def encode_partitions(partitions: Sequence[ResultPartitionID]) -> bytes:
    names = [encode_partition(partition) for partition in partitions]
    return _COUNT.pack(len(names)) + b"".join(_NAME.pack(len(name)) + name for name in names)


def decode_partitions(body: memoryview) -> list[ResultPartitionID]:
    if len(body) < _COUNT.size:
        raise InvalidIdentifierError("partition list frame is too short")
    (count,) = _COUNT.unpack_from(body)
    offset = _COUNT.size
    partitions: list[ResultPartitionID] = []
    for _ in range(count):
        if offset + _NAME.size > len(body):
            raise InvalidIdentifierError("partition list frame is truncated")
        (size,) = _NAME.unpack_from(body, offset)
        offset += _NAME.size
        if offset + size > len(body):
            raise InvalidIdentifierError("partition list frame is truncated")
        partitions.append(decode_partition(body[offset : offset + size]))
        offset += size
    return partitions


def encode_hosted(state: HostedState, partition: ResultPartitionID) -> bytes:
    return _STATE.pack(state) + encode_partition(partition)


def decode_hosted(body: memoryview) -> tuple[HostedState, ResultPartitionID]:
    if len(body) < _STATE.size:
        raise InvalidIdentifierError("host frame is too short")
    (raw,) = _STATE.unpack_from(body)
    try:
        state = HostedState(raw)
    except ValueError:
        raise InvalidIdentifierError(f"unknown hosted state {raw}") from None
    return state, decode_partition(body[_STATE.size :])


def encode_statuses(statuses: Sequence[PartitionStatistics | None]) -> bytes:
    """Per partition: held or not, and a held one's rows, bytes and Arrow bytes per
    subpartition."""
    parts = [_COUNT.pack(len(statuses))]
    for statistics in statuses:
        if statistics is None:
            parts.append(_STATE.pack(0))
            continue
        count = len(statistics.rows_per_subpartition)
        parts.append(_STATE.pack(1) + _COUNT.pack(count))
        parts.append(struct.pack(f"!{count}q", *statistics.rows_per_subpartition))
        parts.append(struct.pack(f"!{count}q", *statistics.bytes_per_subpartition))
        parts.append(struct.pack(f"!{count}q", *statistics.arrow_bytes_per_subpartition))
    return b"".join(parts)


def decode_statuses(body: memoryview) -> list[PartitionStatistics | None]:
    try:
        (count,) = _COUNT.unpack_from(body)
        offset = _COUNT.size
        statuses: list[PartitionStatistics | None] = []
        for _ in range(count):
            (held,) = _STATE.unpack_from(body, offset)
            offset += _STATE.size
            if not held:
                statuses.append(None)
                continue
            (subpartitions,) = _COUNT.unpack_from(body, offset)
            offset += _COUNT.size
            numbers = struct.Struct(f"!{subpartitions}q")
            rows, sizes, arrow_sizes = (
                numbers.unpack_from(body, offset + column * numbers.size) for column in range(3)
            )
            offset += 3 * numbers.size
            statuses.append(PartitionStatistics(rows, sizes, arrow_sizes))
    except struct.error as error:
        raise TransportError(f"a status reply does not decode: {error}") from None
    return statuses


BUFFER_HEADER_SIZE = _BUFFER.size


@dataclass(frozen=True, slots=True)
class BufferHeader:
    channel: int
    backlog: int
    checksum: int  # xxh3-64 of the payload; 0 when the payload was not stored with one

    def encode(self) -> bytes:
        return _BUFFER.pack(self.channel, self.backlog, self.checksum)

    @classmethod
    def decode(cls, body: memoryview) -> tuple[BufferHeader, memoryview]:
        return cls(*_BUFFER.unpack_from(body)), body[_BUFFER.size :]


def encode_channel(channel: int) -> bytes:
    return _CHANNEL.pack(channel)


def decode_channel(body: memoryview) -> int:
    return int(_CHANNEL.unpack_from(body)[0])


def encode_credit(channel: int, credits: int) -> bytes:
    return _CREDIT.pack(channel, credits)


def decode_credit(body: memoryview) -> tuple[int, int]:
    channel, credits = _CREDIT.unpack_from(body)
    return int(channel), int(credits)


def encode_error(channel: int, error: BaseException) -> bytes:
    return _ERROR.pack(channel, error_code(error)) + str(error)[:_MAX_ERROR_TEXT].encode("utf-8")


def decode_error(body: memoryview) -> tuple[int, int, str]:
    channel, code = _ERROR.unpack_from(body)
    return int(channel), int(code), bytes(body[_ERROR.size :]).decode("utf-8", "replace")


def write_frame(
    sock: socket.socket, frame_type: FrameType, header: bytes, payload: pa.Buffer | bytes = b""
) -> None:
    """Send one frame; ``payload`` goes out without a copy."""
    size = len(header) + len(payload)
    sock.sendall(_PREFIX.pack(size, frame_type) + header)
    if len(payload):
        sock.sendall(memoryview(payload))


# A frame's body is read in pieces of at most this size, so what a peer announces is allocated
# only as its bytes arrive.
_READ_PIECE = 4 << 20
_MAX_ERROR_TEXT = 4096


def _read_exactly(sock: socket.socket, size: int) -> pa.Buffer | None:
    """``size`` bytes, or ``None`` if the peer closed before the first one (a timeout then
    is the socket's ``TimeoutError``; after it, a :class:`TransportError`)."""
    data = pa.allocate_buffer(min(size, _READ_PIECE))  # not zero-filled, unlike a bytearray
    received = 0
    while received < size:
        if received == data.size:
            grown = pa.allocate_buffer(min(size, 2 * data.size))
            memoryview(grown)[:received] = memoryview(data)
            data = grown
        try:
            count = sock.recv_into(memoryview(data)[received:], data.size - received)
        except TimeoutError:
            if received == 0:
                raise
            raise TransportError("the peer stopped in the middle of a frame") from None
        if count == 0:
            if received == 0:
                return None
            raise TransportError("connection closed in the middle of a frame")
        received += count
    return data


def read_frame(sock: socket.socket, max_frame_size: int) -> tuple[FrameType, memoryview] | None:
    """The next frame, or ``None`` when the peer closed the connection between frames."""
    prefix = _read_exactly(sock, _PREFIX.size)
    if prefix is None:
        return None
    size, raw_type = _PREFIX.unpack(memoryview(prefix))
    if size > max_frame_size:
        raise DataTooLargeError(
            f"a frame of {size} bytes exceeds the limit of {max_frame_size} bytes here"
        )
    try:
        frame_type = FrameType(raw_type)
    except ValueError:
        raise TransportError(f"unknown frame type {raw_type} on the data port") from None
    if size == 0:
        return frame_type, memoryview(b"")
    try:
        body = _read_exactly(sock, size)
    except TimeoutError:
        raise TransportError("the peer stopped in the middle of a frame") from None
    if body is None:
        raise TransportError("connection closed in the middle of a frame")
    return frame_type, memoryview(body)
