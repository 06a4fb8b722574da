"""Errors on the external service's wires, read in both directions: the daemon reports a
ShuffleError with its gRPC status and, in trailing metadata, its class (by its name in
``shuffle_runtime.wire_errors``, the table both services share) and partition; the client raises
the same class with the same partition. A peer that sends no metadata (or names a class outside
the table) gets the class its status code stands for."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Final

import grpc

from external_shuffle.wire.messages import key_of, partition_of
from external_shuffle.wire.stubs import pb
from shuffle_api import errors as e
from shuffle_api.errors import (
    AuthenticationError,
    NotRegisteredError,
    PartitionNotFoundError,
    ShuffleError,
    TooManyStreamsError,
    UnavailableError,
)
from shuffle_api.ids import ResultPartitionID
from shuffle_runtime.wire_errors import WIRE_ERRORS, error_named, new_error, wire_class, wire_name

__all__ = [
    "STATUS_CODES",
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

STATUS_CODES: Final[dict[type[ShuffleError], grpc.StatusCode]] = {
    e.ChecksumMismatchError: grpc.StatusCode.DATA_LOSS,
    e.PartitionCorruptedError: grpc.StatusCode.DATA_LOSS,
    e.BlobCorruptedError: grpc.StatusCode.DATA_LOSS,
    e.PartitionNotFoundError: grpc.StatusCode.NOT_FOUND,
    e.NotRegisteredError: grpc.StatusCode.NOT_FOUND,
    e.BlobNotFoundError: grpc.StatusCode.NOT_FOUND,
    e.UnsupportedFormatVersionError: grpc.StatusCode.INVALID_ARGUMENT,
    e.SerializationError: grpc.StatusCode.INVALID_ARGUMENT,
    e.InvalidIdentifierError: grpc.StatusCode.INVALID_ARGUMENT,
    e.SchemaMismatchError: grpc.StatusCode.INVALID_ARGUMENT,
    e.UnsupportedTypeError: grpc.StatusCode.INVALID_ARGUMENT,
    e.InvalidOperationError: grpc.StatusCode.INVALID_ARGUMENT,
    e.ConfigError: grpc.StatusCode.INVALID_ARGUMENT,
    e.StorageFullError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    e.TooManyStreamsError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    e.DataTooLargeError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    e.QuotaExceededError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    e.StorageError: grpc.StatusCode.INTERNAL,
    e.PermissionDeniedError: grpc.StatusCode.PERMISSION_DENIED,
    e.AuthenticationError: grpc.StatusCode.UNAUTHENTICATED,
    e.UnavailableError: grpc.StatusCode.UNAVAILABLE,
    e.NoPlacementTargetError: grpc.StatusCode.UNAVAILABLE,
    e.TransportError: grpc.StatusCode.UNAVAILABLE,
    e.ProducerFailedError: grpc.StatusCode.ABORTED,
    e.PartitionAlreadyConsumedError: grpc.StatusCode.FAILED_PRECONDITION,
    e.PartitionError: grpc.StatusCode.FAILED_PRECONDITION,
    e.ShuffleServiceClosedError: grpc.StatusCode.FAILED_PRECONDITION,
    e.StageCancelledError: grpc.StatusCode.ABORTED,
    e.StageFailedError: grpc.StatusCode.ABORTED,
    e.ShuffleError: grpc.StatusCode.FAILED_PRECONDITION,
}
"""The gRPC status of each class of the shared table."""
assert set(STATUS_CODES) == {cls for _, cls in WIRE_ERRORS}, "a class of the table has no status"

# Without metadata (a peer that is not a pyshuffle daemon, or gRPC itself): by status code.
_BY_CODE: Final[dict[grpc.StatusCode, type[ShuffleError]]] = {
    grpc.StatusCode.UNAVAILABLE: e.TransportError,
    grpc.StatusCode.DEADLINE_EXCEEDED: e.TransportError,
    grpc.StatusCode.CANCELLED: e.TransportError,
    grpc.StatusCode.NOT_FOUND: PartitionNotFoundError,
    grpc.StatusCode.DATA_LOSS: e.PartitionCorruptedError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: e.DataTooLargeError,
    grpc.StatusCode.INVALID_ARGUMENT: e.SerializationError,
    grpc.StatusCode.UNAUTHENTICATED: AuthenticationError,
    grpc.StatusCode.PERMISSION_DENIED: e.PermissionDeniedError,
}


def short(text: str) -> str:
    """``text`` cut to what an error may carry."""
    return text if len(text) <= MAX_DETAILS else text[:MAX_DETAILS] + "... (cut)"


def status_for(error: ShuffleError) -> grpc.StatusCode:
    """The gRPC status a ShuffleError is reported with."""
    return STATUS_CODES[wire_class(error)]


def _partition_of_error(error: ShuffleError) -> ResultPartitionID | None:
    partition = error.partition_id if isinstance(error, e.PartitionError) else None
    return partition if isinstance(partition, ResultPartitionID) else None


def trailing_metadata(error: ShuffleError) -> Sequence[tuple[str, str | bytes]]:
    """What tells the client the error's class and partition."""
    metadata: list[tuple[str, str | bytes]] = [(ERROR_CLASS_KEY, wire_name(error))]
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
        error_class=wire_name(error),
        partition=None if partition is None else key_of(partition),
        message=short(str(error)),
    )


def error_from_pb(
    message: pb.DataPortError, what: str, partition: ResultPartitionID | None
) -> ShuffleError:
    """The ShuffleError a data port reported (its class, else a ShuffleError)."""
    cls = error_named(message.error_class) or ShuffleError
    text = f"{what} failed: {message.error_class}: {short(message.message)}"
    reported = None
    if message.HasField("partition"):
        with contextlib.suppress(ShuffleError):
            reported = partition_of(message.partition)
    return new_error(cls, text, reported or partition)


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
    cls = error_named(name) if isinstance(name, str) else None
    if cls is None:
        cls = _BY_CODE.get(code, ShuffleError)
        if cls is PartitionNotFoundError and partition is None:
            cls = NotRegisteredError  # a NOT_FOUND about no partition names something else
    message = f"{what} failed: {code.name}: {short(details)}"
    if cls is AuthenticationError:
        message += " (check external-shuffle.auth.token / token-file)"
    return new_error(cls, message, _partition_in(received) or partition)
