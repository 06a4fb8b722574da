"""The one exception tree of pyshuffle.

Every error raised by pyshuffle derives from :class:`ShuffleError`; foreign errors (OSError,
pyarrow, protobuf) are translated at the boundary where they occur, naming what was wrong.
"""

from __future__ import annotations

__all__ = [
    "AuthenticationError",
    "BlobCorruptedError",
    "BlobNotFoundError",
    "ChecksumMismatchError",
    "ConfigError",
    "DataTooLargeError",
    "InvalidIdentifierError",
    "InvalidOperationError",
    "NoPlacementTargetError",
    "NotRegisteredError",
    "PartitionAlreadyConsumedError",
    "PartitionCorruptedError",
    "PartitionError",
    "PartitionNotFoundError",
    "PermissionDeniedError",
    "ProducerFailedError",
    "QuotaExceededError",
    "SchemaMismatchError",
    "SerializationError",
    "ShuffleError",
    "ShuffleServiceClosedError",
    "StageFailedError",
    "StorageError",
    "StorageFullError",
    "TooManyStreamsError",
    "TransportError",
    "UnavailableError",
    "UnsupportedFormatVersionError",
    "UnsupportedTypeError",
]


class ShuffleError(Exception):
    """Base of every pyshuffle error."""


class ConfigError(ShuffleError, ValueError):
    """A configuration key, value or factory class path is wrong."""


class InvalidIdentifierError(ShuffleError, ValueError):
    """An id is empty, too long, or holds characters that could escape a store path."""


class SerializationError(ShuffleError, ValueError):
    """Bytes that should hold a descriptor or message do not decode."""


class UnsupportedFormatVersionError(SerializationError):
    """Data written by a newer (or unknown) format version."""


class ShuffleServiceClosedError(ShuffleError, RuntimeError):
    """The master, environment or writer was used after close()."""


class SchemaMismatchError(ShuffleError, ValueError):
    """A batch's schema differs from the schema of the partition it is written to."""


class DataTooLargeError(ShuffleError, ValueError):
    """A batch, frame or message exceeds a configured size limit."""


class StorageError(ShuffleError, OSError):
    """The store failed (full disk, permission, unreachable object store)."""


class StorageFullError(StorageError):
    """The store has no space left for what was being written; nothing of it stays readable."""


class BlobNotFoundError(ShuffleError, LookupError):
    """No blob with this key: never put, deleted, or its store is not the one the reader was
    given."""


class BlobCorruptedError(ShuffleError):
    """The bytes read for a blob do not hash to its key."""


class TransportError(ShuffleError, ConnectionError):
    """The data connection to a producer failed."""


class AuthenticationError(ShuffleError, PermissionError):
    """A peer did not prove it holds the application's secret (or token), or we did not."""


class PermissionDeniedError(AuthenticationError):
    """A peer proved who it is, and that credential may not do what it asked (an operator's
    read-only credential asking to decommission a worker)."""


class QuotaExceededError(ShuffleError):
    """An application asked a worker to hold more bytes than its quota there; what it was
    pushing of the partition is deleted, what it holds already stays."""


class InvalidOperationError(ShuffleError, ValueError):
    """An engine operation cannot run as asked (unknown column, unsupported key type, join
    type); nothing was written."""


class UnsupportedTypeError(InvalidOperationError):
    """A column's type cannot be carried, or cannot be the key it was asked to be; nothing
    ran."""


class StageFailedError(ShuffleError, RuntimeError):
    """An engine stage (e.g. a Spark job) failed; the message carries the task's own error."""


class StageCancelledError(StageFailedError):
    """An engine stage was cancelled (Spark's job group cancelled, a Connect tag
    interrupted) before it finished."""


class PartitionError(ShuffleError):
    """An error about one result partition; ``partition_id`` names it."""

    def __init__(self, message: str, partition_id: object | None = None) -> None:
        super().__init__(message)
        self.partition_id = partition_id


class PartitionNotFoundError(PartitionError, LookupError):
    """The partition was never committed, was released, or its files are gone."""


class PartitionCorruptedError(PartitionError):
    """A partition's files exist but do not decode (truncated, wrong format)."""


class ChecksumMismatchError(PartitionCorruptedError):
    """A subpartition slice does not match the checksum recorded when it was written."""


class ProducerFailedError(PartitionError):
    """The producer of a pipelined partition failed before finishing it."""


class PartitionAlreadyConsumedError(PartitionError):
    """A pipelined subpartition can be consumed once; it was requested again."""


class NotRegisteredError(ShuffleError, LookupError):
    """The application, job or worker a request names is not registered."""


class UnavailableError(ShuffleError):
    """A service cannot take this call now (draining, or nowhere to place a partition)."""


class TooManyStreamsError(ShuffleError):
    """A server has as many streams open as it takes (in all, or of this client)."""


class NoPlacementTargetError(ShuffleError, LookupError):
    """A placement was asked for with no target to place on."""
