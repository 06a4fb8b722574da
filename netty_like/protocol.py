"""Frames of the data port (credit-based flow control after Flink's netty shuffle).

Frames and the handshake that opens a connection are :mod:`shuffle_runtime.sockets`'; each frame
here is a fixed header for its type, then a payload. After the handshake:
Consumer -> producer: REQUEST (with initial credit), CREDIT, CANCEL. REQUEST_BATCH asks on
one channel for several blocking partitions, served one after another.
Producer -> consumer: SCHEMA, BUFFER (one per credit, carries the backlog), END, ERROR; for a
batch, SCHEMA, BUFFERs and END per partition, in order (an ERROR ends the channel).
Control, answered in order by ACK, STATUS_REPLY or ERROR: HOST (a process of the same
executor hands a partition it writes or wrote to the executor's host), STATUS (which of these
partitions are held, with their statistics), HELD (which are held: a byte each, answered by
HELD_REPLY), RELEASE, SHUTDOWN (a host's application is done).
"""

from __future__ import annotations

import enum
import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from shuffle_api import (
    IntermediateResultPartitionID,
    InvalidIdentifierError,
    PartitionStatistics,
    ResultPartitionID,
    ShuffleError,
    SubpartitionRange,
    TransportError,
)
from shuffle_runtime import sockets
from shuffle_runtime.sockets import MAX_BATCH
from shuffle_runtime.wire_errors import error_code, error_named, new_error

__all__ = [
    "BUFFER_HEADER_SIZE",
    "BufferHeader",
    "FrameType",
    "HostedState",
    "Request",
    "decode_held",
    "decode_hosted",
    "decode_partitions",
    "decode_statuses",
    "encode_held",
    "encode_hosted",
    "encode_partitions",
    "encode_statuses",
    "error_code",
    "error_from_code",
    "read_frame",
]

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
    ERROR = sockets.REFUSED  # a refusal and every other error share the layout
    CHALLENGE = sockets.CHALLENGE
    AUTH = sockets.AUTH
    AUTH_OK = sockets.AUTH_OK
    HOST = 11
    STATUS = 12
    STATUS_REPLY = 13
    RELEASE = 14
    ACK = 15
    SHUTDOWN = 16
    REQUEST_BATCH = 17
    HELD = 18
    HELD_REPLY = 19


class HostedState(enum.IntEnum):
    """What a HOST frame says of a partition: being written (the host deletes it if its writer
    never commits), or committed (the host serves it)."""

    WRITING = 1
    COMMITTED = 2


def error_from_code(code: int, message: str, partition: ResultPartitionID | None) -> ShuffleError:
    """The error an ERROR frame reports (its code as in ``shuffle_runtime.wire_errors``)."""
    return new_error(error_named(code) or ShuffleError, message, partition)


@dataclass(frozen=True, slots=True)
class Request:
    """A channel's request: one partition, or (REQUEST_BATCH) several blocking ones."""

    channel: int
    partitions: tuple[ResultPartitionID, ...]
    subpartitions: SubpartitionRange
    initial_credit: int
    pipelined: bool

    @property
    def frame_type(self) -> FrameType:
        return FrameType.REQUEST if len(self.partitions) == 1 else FrameType.REQUEST_BATCH

    def encode(self) -> bytes:
        header = _REQUEST.pack(
            self.channel,
            self.subpartitions.start,
            self.subpartitions.end,
            self.initial_credit,
            self.pipelined,
        )
        if len(self.partitions) == 1:
            return header + encode_partition(self.partitions[0])
        return header + encode_partitions(self.partitions)

    @classmethod
    def decode(cls, frame_type: FrameType, body: memoryview) -> Request:
        if len(body) < _REQUEST.size:
            raise InvalidIdentifierError("partition request frame is too short")
        channel, start, end, credit, pipelined = _REQUEST.unpack_from(body)
        partitions: tuple[ResultPartitionID, ...]
        if frame_type is FrameType.REQUEST:
            partitions = (decode_partition(body[_REQUEST.size :]),)
        else:
            partitions = tuple(decode_partitions(body[_REQUEST.size :]))
            if not 0 < len(partitions) <= MAX_BATCH or pipelined:
                raise InvalidIdentifierError(
                    f"a batch of {len(partitions)} partitions (pipelined: {pipelined}); batches"
                    f" hold 1..{MAX_BATCH} blocking partitions"
                )
        try:
            subpartitions = SubpartitionRange(start, end)
        except ValueError as error:
            raise InvalidIdentifierError(f"bad subpartition range in request: {error}") from None
        return cls(channel, partitions, subpartitions, credit, pipelined)


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


def encode_held(held: Sequence[bool]) -> bytes:
    """Per partition, a byte: held (1) or not (0)."""
    return _COUNT.pack(len(held)) + bytes(map(int, held))


def decode_held(body: memoryview) -> list[bool]:
    if len(body) < _COUNT.size:
        raise TransportError("a held reply is too short")
    (count,) = _COUNT.unpack_from(body)
    flags = body[_COUNT.size :]
    if len(flags) != count or any(flag > 1 for flag in flags):
        raise TransportError(f"a held reply of {len(flags)} bytes for {count} partitions")
    return [bool(flag) for flag in flags]


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


_MAX_ERROR_TEXT = 4096


def encode_error(channel: int, error: BaseException) -> bytes:
    return _ERROR.pack(channel, error_code(error)) + str(error)[:_MAX_ERROR_TEXT].encode("utf-8")


def decode_error(body: memoryview) -> tuple[int, int, str]:
    channel, code = _ERROR.unpack_from(body)
    return int(channel), int(code), bytes(body[_ERROR.size :]).decode("utf-8", "replace")


def read_frame(sock: socket.socket, max_frame_size: int) -> tuple[FrameType, memoryview] | None:
    """The next frame, or ``None`` when the peer closed the connection between frames."""
    frame = sockets.read_frame(sock, max_frame_size)
    if frame is None:
        return None
    raw_type, body = frame
    try:
        return FrameType(raw_type), body
    except ValueError:
        raise TransportError(f"unknown frame type {raw_type} on the data port") from None
