"""One table of the ShuffleError classes that cross a wire, for every port of both services:
each class has a number (the default service's data port sends it) and a name (the external
service's gRPC metadata and data port send it), so a peer raises the class that was raised on
the other side, with its partition. Classes outside the table (a client's own, such as a
connection found stale) go as their nearest base in it."""

from __future__ import annotations

from typing import Final

from shuffle_api import errors as e
from shuffle_api.errors import PartitionError, ShuffleError
from shuffle_api.ids import ResultPartitionID

__all__ = ["WIRE_ERRORS", "error_code", "error_named", "new_error", "wire_class", "wire_name"]

WIRE_ERRORS: Final[tuple[tuple[int, type[ShuffleError]], ...]] = (
    # Subclasses before their bases: an error goes as the first class it is an instance of.
    # Numbers are never reused (1-10 are those of pyshuffle before 2026-11-27).
    (2, e.ChecksumMismatchError),
    (3, e.PartitionCorruptedError),
    (1, e.PartitionNotFoundError),
    (4, e.ProducerFailedError),
    (5, e.PartitionAlreadyConsumedError),
    (11, e.PartitionError),
    (12, e.StorageFullError),
    (10, e.StorageError),
    (13, e.UnsupportedFormatVersionError),
    (14, e.SerializationError),
    (7, e.InvalidIdentifierError),
    (15, e.SchemaMismatchError),
    (16, e.UnsupportedTypeError),
    (17, e.InvalidOperationError),
    (18, e.ConfigError),
    (6, e.DataTooLargeError),
    (30, e.QuotaExceededError),
    (29, e.PermissionDeniedError),
    (9, e.AuthenticationError),
    (19, e.TooManyStreamsError),
    (20, e.UnavailableError),
    (21, e.TransportError),
    (22, e.NotRegisteredError),
    (23, e.NoPlacementTargetError),
    (24, e.BlobNotFoundError),
    (25, e.BlobCorruptedError),
    (26, e.ShuffleServiceClosedError),
    (28, e.StageCancelledError),
    (27, e.StageFailedError),
    (8, e.ShuffleError),
)
_BY_CODE: Final = dict(WIRE_ERRORS)
_BY_NAME: Final = {cls.__name__: cls for _, cls in WIRE_ERRORS}


def _entry(error: BaseException) -> tuple[int, type[ShuffleError]]:
    return next(
        ((code, cls) for code, cls in WIRE_ERRORS if isinstance(error, cls)), WIRE_ERRORS[-1]
    )


def error_code(error: BaseException) -> int:
    """The number ``error`` goes by."""
    return _entry(error)[0]


def wire_class(error: BaseException) -> type[ShuffleError]:
    """The class ``error`` goes as."""
    return _entry(error)[1]


def wire_name(error: BaseException) -> str:
    """The class name ``error`` goes by."""
    return wire_class(error).__name__


def error_named(name: str | int) -> type[ShuffleError] | None:
    """The class of a name or number in the table, else None."""
    return _BY_CODE.get(name) if isinstance(name, int) else _BY_NAME.get(name)


def new_error(
    cls: type[ShuffleError], message: str, partition: ResultPartitionID | None
) -> ShuffleError:
    """An error of ``cls``, naming ``partition`` if the class is about one."""
    if issubclass(cls, PartitionError):
        return cls(message, partition)
    return cls(message)
