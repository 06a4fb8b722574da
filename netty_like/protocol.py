"""Frames of the data port (credit-based flow control after Flink's netty shuffle).

Every frame: ``!IB`` (length of the rest, type), a fixed header for the type, then a payload.
Consumer -> producer: REQUEST (with initial credit), CREDIT, CANCEL.
Producer -> consumer: SCHEMA, BUFFER (one per credit, carries the backlog), END, ERROR.
"""

from __future__ import annotations

import enum
import socket
import struct
from dataclasses import dataclass

import pyarrow as pa

from shuffle_api import (
    ChecksumMismatchError,
    DataTooLargeError,
    IntermediateResultPartitionID,
    InvalidIdentifierError,
    PartitionAlreadyConsumedError,
    PartitionCorruptedError,
    PartitionError,
    PartitionNotFoundError,
    ProducerFailedError,
    ResultPartitionID,
    ShuffleError,
    SubpartitionRange,
    TransportError,
)

__all__ = [
    "BUFFER_HEADER_SIZE",
    "BufferHeader",
    "FrameType",
    "Request",
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


class FrameType(enum.IntEnum):
    REQUEST = 1
    CREDIT = 2
    CANCEL = 3
    SCHEMA = 4
    BUFFER = 5
    END = 6
    ERROR = 7


# Most specific first: the first class an error is an instance of gives its code.
_ERROR_CODES: tuple[tuple[int, type[ShuffleError]], ...] = (
    (1, PartitionNotFoundError),
    (2, ChecksumMismatchError),
    (3, PartitionCorruptedError),
    (4, ProducerFailedError),
    (5, PartitionAlreadyConsumedError),
    (6, DataTooLargeError),
    (7, InvalidIdentifierError),
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
        partition_id = self.partition.partition_id
        name = f"{partition_id.result_id}/{partition_id.partition_index}/"
        name += self.partition.producer_attempt_id
        return _REQUEST.pack(
            self.channel,
            self.subpartitions.start,
            self.subpartitions.end,
            self.initial_credit,
            self.pipelined,
        ) + name.encode("utf-8")

    @classmethod
    def decode(cls, body: memoryview) -> Request:
        if len(body) < _REQUEST.size:
            raise InvalidIdentifierError("partition request frame is too short")
        channel, start, end, credit, pipelined = _REQUEST.unpack_from(body)
        parts = bytes(body[_REQUEST.size :]).decode("utf-8", "replace").split("/")
        if len(parts) != 3 or not parts[1].isdigit():
            raise InvalidIdentifierError(f"malformed partition id in request: {'/'.join(parts)!r}")
        partition = ResultPartitionID(
            IntermediateResultPartitionID(parts[0], int(parts[1])), parts[2]
        )
        return cls(channel, partition, SubpartitionRange(start, end), credit, pipelined)


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
    return _ERROR.pack(channel, error_code(error)) + str(error).encode("utf-8")


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


def _read_exactly(sock: socket.socket, size: int) -> pa.Buffer | None:
    data = pa.allocate_buffer(size)  # not zero-filled, unlike a bytearray
    view = memoryview(data)
    received = 0
    while received < size:
        count = sock.recv_into(view[received:], size - received)
        if count == 0:
            return None
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
            f"frame of {size} bytes exceeds netty-like.network.max-frame-size ({max_frame_size})"
        )
    try:
        frame_type = FrameType(raw_type)
    except ValueError:
        raise TransportError(f"unknown frame type {raw_type} on the data port") from None
    body = _read_exactly(sock, size)
    if body is None:
        raise TransportError("connection closed in the middle of a frame")
    return frame_type, memoryview(body)
