"""One table for errors on the wire, read in both directions: the daemon reports a ShuffleError
with its gRPC status and, in trailing metadata, its class and partition; the client raises the
same class with the same partition. A peer that sends no metadata (or names a class outside
the table) gets the class its status code stands for."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Final

import grpc

from external_shuffle._proto import external_shuffle_pb2 as pb
from external_shuffle.wire import key_of, partition_of
from shuffle_api import (
    AuthenticationError,
    ChecksumMismatchError,
    ConfigError,
    DataTooLargeError,
    InvalidIdentifierError,
    InvalidOperationError,
    PartitionCorruptedError,
    PartitionError,
    PartitionNotFoundError,
    ResultPartitionID,
    SchemaMismatchError,
    SerializationError,
    ShuffleError,
    ShuffleServiceClosedError,
    StorageError,
    StorageFullError,
    TransportError,
    UnsupportedFormatVersionError,
)

__all__ = [
    "WIRE_ERRORS",
    "NotRegisteredError",
    "TooManyStreamsError",
    "UnavailableError",
    "error_from_pb",
    "error_from_status",
    "error_to_pb",
    "short",
    "status_for",
    "trailing_metadata",
]

ERROR_CLASS_KEY: Final = "pyshuffle-error"
PARTITION_KEY: Final = "pyshuffle-partition-bin"
# What of a message (and so of a client's input it may quote) goes on the wire and in logs.
MAX_DETAILS: Final = 1024


class NotRegisteredError(ShuffleError, LookupError):
    """The application, job or worker a request names is not registered."""


class UnavailableError(ShuffleError):
    """The daemon cannot take this call now (draining, or no worker to place on)."""


class TooManyStreamsError(ShuffleError):
    """A worker has as many streams open as it takes (in all, or of this client)."""


WIRE_ERRORS: Final[tuple[tuple[type[ShuffleError], grpc.StatusCode], ...]] = (
    # Subclasses before their bases: a status is the first match's.
    (ChecksumMismatchError, grpc.StatusCode.DATA_LOSS),
    (PartitionCorruptedError, grpc.StatusCode.DATA_LOSS),
    (PartitionNotFoundError, grpc.StatusCode.NOT_FOUND),
    (NotRegisteredError, grpc.StatusCode.NOT_FOUND),
    (UnsupportedFormatVersionError, grpc.StatusCode.INVALID_ARGUMENT),
    (SerializationError, grpc.StatusCode.INVALID_ARGUMENT),
    (InvalidIdentifierError, grpc.StatusCode.INVALID_ARGUMENT),
    (SchemaMismatchError, grpc.StatusCode.INVALID_ARGUMENT),
    (InvalidOperationError, grpc.StatusCode.INVALID_ARGUMENT),
    (ConfigError, grpc.StatusCode.INVALID_ARGUMENT),
    (StorageFullError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (TooManyStreamsError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (DataTooLargeError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (StorageError, grpc.StatusCode.INTERNAL),
    (AuthenticationError, grpc.StatusCode.UNAUTHENTICATED),
    (UnavailableError, grpc.StatusCode.UNAVAILABLE),
    (TransportError, grpc.StatusCode.UNAVAILABLE),
    (ShuffleServiceClosedError, grpc.StatusCode.FAILED_PRECONDITION),
    (ShuffleError, grpc.StatusCode.FAILED_PRECONDITION),
)
_BY_NAME: Final = {error.__name__: error for error, _ in WIRE_ERRORS}

# Without metadata (a peer that is not a pyshuffle daemon, or gRPC itself): by status code.
_BY_CODE: Final[dict[grpc.StatusCode, type[ShuffleError]]] = {
    grpc.StatusCode.UNAVAILABLE: TransportError,
    grpc.StatusCode.DEADLINE_EXCEEDED: TransportError,
    grpc.StatusCode.CANCELLED: TransportError,
    grpc.StatusCode.NOT_FOUND: PartitionNotFoundError,
    grpc.StatusCode.DATA_LOSS: PartitionCorruptedError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: DataTooLargeError,
    grpc.StatusCode.INVALID_ARGUMENT: SerializationError,
    grpc.StatusCode.UNAUTHENTICATED: AuthenticationError,
}


def short(text: str) -> str:
    """``text`` cut to what an error may carry."""
    return text if len(text) <= MAX_DETAILS else text[:MAX_DETAILS] + "... (cut)"


def status_for(error: ShuffleError) -> grpc.StatusCode:
    """The gRPC status a ShuffleError is reported with."""
    return next(code for cls, code in WIRE_ERRORS if isinstance(error, cls))


def _wire_class(error: ShuffleError) -> str:
    return next(cls.__name__ for cls, _ in WIRE_ERRORS if isinstance(error, cls))


def _partition_of_error(error: ShuffleError) -> ResultPartitionID | None:
    partition = error.partition_id if isinstance(error, PartitionError) else None
    return partition if isinstance(partition, ResultPartitionID) else None


def trailing_metadata(error: ShuffleError) -> Sequence[tuple[str, str | bytes]]:
    """What tells the client the error's class and partition."""
    metadata: list[tuple[str, str | bytes]] = [(ERROR_CLASS_KEY, _wire_class(error))]
    partition = _partition_of_error(error)
    if partition is not None:
        metadata.append((PARTITION_KEY, key_of(partition).SerializeToString()))
    return metadata


def _partition_in(metadata: dict[str, str | bytes]) -> ResultPartitionID | None:
    value = metadata.get(PARTITION_KEY)
    if not isinstance(value, bytes):
        return None
    try:
        return partition_of(pb.PartitionKey.FromString(value))
    except (ShuffleError, ValueError):
        return None  # not a partition id: the error names none


def error_to_pb(error: ShuffleError) -> pb.DataPortError:
    """A ShuffleError as the worker's data port reports it."""
    partition = _partition_of_error(error)
    return pb.DataPortError(
        error_class=_wire_class(error),
        partition=None if partition is None else key_of(partition),
        message=short(str(error)),
    )


def error_from_pb(
    message: pb.DataPortError, what: str, partition: ResultPartitionID | None
) -> ShuffleError:
    """The ShuffleError a data port reported (its class, else a ShuffleError)."""
    cls = _BY_NAME.get(message.error_class, ShuffleError)
    text = f"{what} failed: {message.error_class}: {short(message.message)}"
    if issubclass(cls, PartitionError):
        reported = None
        if message.HasField("partition"):
            with contextlib.suppress(ShuffleError):
                reported = partition_of(message.partition)
        return cls(text, reported or partition)
    return cls(text)


def error_from_status(
    code: grpc.StatusCode,
    details: str,
    metadata: Sequence[tuple[str, str | bytes]],
    what: str,
    partition: ResultPartitionID | None = None,
) -> ShuffleError:
    """The ShuffleError a failed call stands for; ``what`` says which call, on which peer, and
    ``partition`` which partition it was about (if the peer does not say)."""
    received = dict(metadata)
    name = received.get(ERROR_CLASS_KEY)
    cls = _BY_NAME.get(name) if isinstance(name, str) else None
    if cls is None:
        cls = _BY_CODE.get(code, ShuffleError)
        if cls is PartitionNotFoundError and partition is None:
            cls = NotRegisteredError  # a NOT_FOUND about no partition names something else
    message = f"{what} failed: {code.name}: {short(details)}"
    if cls is AuthenticationError:
        message += " (check external-shuffle.auth.token / token-file)"
    if issubclass(cls, PartitionError):
        return cls(message, _partition_in(received) or partition)
    return cls(message)
