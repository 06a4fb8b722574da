"""The two messages that carry partition bytes, framed by hand: a push's data chunks
(``PushDataRequest``) and a fetch's (``FetchDataResponse``).

They stay the protobuf messages ``proto/`` defines (any generated client or server reads and
writes them), but their ``data`` field is never copied into or out of a message object:
a pushed chunk is sent as its other fields, serialized by protobuf, joined with the data field
in one copy; a fetched chunk is its fields and the data field's tag and length (the prefix),
with the data read from the file straight after them; a received chunk's data is a view of
the received bytes. Through message objects each 4 MiB chunk was copied three more times on
each side (set, serialize; parse, read the field).
Every other method of the Worker service keeps the generated (de)serializers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf import message_factory
from google.protobuf.message import DecodeError, Message

from external_shuffle.wire.stubs import pb
from shuffle_api import SerializationError

__all__ = [
    "FetchChunk",
    "PushChunk",
    "fetch_data_call",
    "fetch_prefix",
    "frame_push",
    "push_data_call",
    "push_partition_call",
    "read_fetch",
    "read_push",
    "worker_rpc_handler",
]

Bytes = bytes | bytearray | memoryview

_WORKER = pb.DESCRIPTOR.services_by_name["Worker"]
_PUSH_DATA_FIELD = pb.PushDataRequest.DESCRIPTOR.fields_by_name["data"].number
_FETCH_DATA_FIELD = pb.FetchDataResponse.DESCRIPTOR.fields_by_name["data"].number

# Protobuf wire types (https://protobuf.dev/programming-guides/encoding/).
_VARINT, _FIXED64, _LENGTH_DELIMITED, _FIXED32 = 0, 1, 2, 5
_MAX_VARINT_BYTES = 10
# The messages framed here have four fields at most; a few unknown ones from a newer peer are
# fine, but walking millions of tiny fields in Python is not.
_MAX_FIELDS = 64


@dataclass(frozen=True, slots=True)
class PushChunk:
    """A received ``PushDataRequest``: its other fields, and its data as a view."""

    header: pb.PushDataRequest
    data: memoryview


@dataclass(frozen=True, slots=True)
class FetchChunk:
    """A received ``FetchDataResponse``: its other fields, and its data as a view."""

    header: pb.FetchDataResponse
    data: memoryview


def _varint(value: int) -> bytes:
    encoded = bytearray()
    while value > 0x7F:
        encoded.append((value & 0x7F) | 0x80)
        value >>= 7
    encoded.append(value)
    return bytes(encoded)


def _read_varint(view: memoryview, position: int) -> tuple[int, int]:
    value = shift = 0
    for index in range(position, min(position + _MAX_VARINT_BYTES, len(view))):
        byte = view[index]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, index + 1
        shift += 7
    raise SerializationError(f"malformed message: a varint at byte {position} does not end")


def _before_data(header: bytes, field_number: int, size: int) -> bytes:
    """What precedes a field of ``size`` bytes that ends the message: ``header`` (a serialized
    message without the field), the field's tag and its length. Protobuf parsers take fields
    in any order, so the field may follow the others."""
    if not size:
        return header  # proto3 leaves an empty bytes field out
    return header + _varint(field_number << 3 | _LENGTH_DELIMITED) + _varint(size)


def _with_data(header: bytes, field_number: int, parts: Sequence[Bytes], size: int) -> bytes:
    """``header`` and the field whose value is ``parts`` (``size`` bytes in all), joined:
    one copy of the data."""
    return b"".join((_before_data(header, field_number, size), *parts))


def _split(message: bytes, field_number: int) -> tuple[bytes, memoryview]:
    """``message`` without its length-delimited field ``field_number``, and that field's
    value as a view of ``message`` (the last occurrence wins, as protobuf parses it)."""
    view = memoryview(message)
    others: list[memoryview] = []
    data = view[0:0]
    position = fields = 0
    while position < len(view):
        fields += 1
        if fields > _MAX_FIELDS:
            raise SerializationError(f"malformed message: more than {_MAX_FIELDS} fields")
        start = position
        tag, position = _read_varint(view, position)
        wire_type = tag & 0x7
        if wire_type == _VARINT:
            _, position = _read_varint(view, position)
        elif wire_type == _FIXED64:
            position += 8
        elif wire_type == _FIXED32:
            position += 4
        elif wire_type == _LENGTH_DELIMITED:
            length, position = _read_varint(view, position)
            if tag >> 3 == field_number and position + length <= len(view):
                data = view[position : position + length]
                position += length
                continue
            position += length
        else:
            raise SerializationError(
                f"malformed message: wire type {wire_type} at byte {start} is not supported"
            )
        if position > len(view):
            raise SerializationError(
                f"malformed message: a field at byte {start} runs past its end ({len(view)})"
            )
        others.append(view[start:position])
    return b"".join(others), data


MessageType = TypeVar("MessageType", bound=Message)


def _parse(message_type: type[MessageType], data: bytes) -> MessageType:
    try:
        return message_type.FromString(data)
    except DecodeError as error:
        raise SerializationError(f"malformed {message_type.DESCRIPTOR.name}: {error}") from error


def frame_push(header: pb.PushDataRequest, parts: Sequence[Bytes], size: int) -> bytes:
    """The serialized ``PushDataRequest`` of one chunk: ``header`` (its ``data`` unset) with
    ``parts``, ``size`` bytes in all, as its data."""
    return _with_data(header.SerializeToString(), _PUSH_DATA_FIELD, parts, size)


def read_push(message: bytes) -> PushChunk:
    others, data = _split(message, _PUSH_DATA_FIELD)
    return PushChunk(_parse(pb.PushDataRequest, others), data)


def fetch_prefix(size: int, *, end_of_run: bool, run_checksum: int) -> bytes:
    """The start of the serialized ``FetchDataResponse`` of one chunk of a run, ``size``
    bytes of data: the message is this prefix followed by the data."""
    header = pb.FetchDataResponse(
        end_of_run=end_of_run, run_checksum=run_checksum
    ).SerializeToString()
    return _before_data(header, _FETCH_DATA_FIELD, size)


def read_fetch(message: bytes) -> FetchChunk:
    others, data = _split(message, _FETCH_DATA_FIELD)
    return FetchChunk(_parse(pb.FetchDataResponse, others), data)


def _method_path(name: str) -> str:
    return f"/{_WORKER.full_name}/{name}"


def push_data_call(
    channel: grpc.Channel,
) -> grpc.StreamUnaryMultiCallable[bytes, pb.PushDataResponse]:
    """``Worker.PushData`` taking messages framed by :func:`frame_push`."""
    return channel.stream_unary(
        _method_path("PushData"),
        request_serializer=None,
        response_deserializer=pb.PushDataResponse.FromString,
    )


def push_partition_call(
    channel: grpc.Channel,
) -> grpc.UnaryUnaryMultiCallable[bytes, pb.PushDataResponse]:
    """``Worker.PushPartition`` taking a message framed by :func:`frame_push`."""
    return channel.unary_unary(
        _method_path("PushPartition"),
        request_serializer=None,
        response_deserializer=pb.PushDataResponse.FromString,
    )


def fetch_data_call(
    channel: grpc.Channel,
) -> grpc.UnaryStreamMultiCallable[pb.FetchDataRequest, FetchChunk]:
    """``Worker.FetchData`` yielding :class:`FetchChunk` s."""
    return channel.unary_stream(
        _method_path("FetchData"),
        request_serializer=pb.FetchDataRequest.SerializeToString,
        response_deserializer=read_fetch,
    )


def _never_raising(read: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """A request deserializer that returns its SerializationError instead of raising it: gRPC
    would answer a raising one with a bare INTERNAL; the handler raises it as a typed error."""

    def deserialize(message: bytes) -> Any:
        try:
            return read(message)
        except SerializationError as error:
            return error

    return deserialize


_HANDLER_KINDS = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}

# Worker methods served with framed messages: (request deserializer, response serializer).
_FRAMED: dict[str, tuple[Callable[[bytes], Any], Callable[[Any], bytes] | None]] = {
    "PushData": (_never_raising(read_push), pb.PushDataResponse.SerializeToString),
    "PushPartition": (_never_raising(read_push), pb.PushDataResponse.SerializeToString),
    # FetchData's handler yields messages it framed (fetch_prefix and the data) or serialized.
    "FetchData": (pb.FetchDataRequest.FromString, None),
}


def worker_rpc_handler(servicer: Any) -> grpc.GenericRpcHandler:
    """Every method of the Worker service bound to ``servicer``; what ``add_WorkerServicer_
    to_server`` registers, but with the framed messages of :data:`_FRAMED`."""
    handlers = {}
    for method in _WORKER.methods:
        request_type = message_factory.GetMessageClass(method.input_type)
        response_type = message_factory.GetMessageClass(method.output_type)
        deserializer, serializer = _FRAMED.get(
            method.name, (request_type.FromString, response_type.SerializeToString)
        )
        kind = _HANDLER_KINDS[(method.client_streaming, method.server_streaming)]
        handlers[method.name] = kind(
            getattr(servicer, method.name),
            request_deserializer=deserializer,
            response_serializer=serializer,
        )
    return grpc.method_handlers_generic_handler(_WORKER.full_name, handlers)
