"""How the daemon's handlers report a ShuffleError: a gRPC status, a log line, a metric."""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

import grpc

from external_shuffle.metrics import DaemonMetrics
from shuffle_api import (
    DataTooLargeError,
    InvalidIdentifierError,
    PartitionCorruptedError,
    PartitionNotFoundError,
    SerializationError,
    ShuffleError,
    StorageError,
)

__all__ = ["NotRegisteredError", "UnavailableError", "reports_errors", "status_for"]

logger = logging.getLogger(__name__)

Handler = TypeVar("Handler", bound=Callable[..., Any])


class NotRegisteredError(ShuffleError, LookupError):
    """The application, job or worker a request names is not registered."""


class UnavailableError(ShuffleError):
    """The daemon cannot take this call now (draining, or no worker to place on)."""


def status_for(error: ShuffleError) -> grpc.StatusCode:
    """The gRPC status a ShuffleError is reported with."""
    if isinstance(error, (InvalidIdentifierError, SerializationError)):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(error, (PartitionNotFoundError, NotRegisteredError)):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(error, PartitionCorruptedError):
        return grpc.StatusCode.DATA_LOSS
    if isinstance(error, DataTooLargeError):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if isinstance(error, UnavailableError):
        return grpc.StatusCode.UNAVAILABLE
    if isinstance(error, StorageError):
        return grpc.StatusCode.INTERNAL
    return grpc.StatusCode.FAILED_PRECONDITION


def _abort(
    metrics: DaemonMetrics, context: grpc.ServicerContext, method: str, error: ShuffleError
) -> None:
    code = status_for(error)
    metrics.errors.labels(method=method, code=code.name).inc()
    logger.warning("%s failed: %s", method, error, extra={"method": method, "code": code.name})
    context.abort(code, str(error))


def reports_errors(handler: Handler) -> Handler:
    """Decorates a servicer method (of an object with a ``metrics`` attribute): a ShuffleError
    it raises ends the call with the matching status."""
    method = handler.__name__
    if inspect.isgeneratorfunction(handler):

        @functools.wraps(handler)
        def streaming(self: Any, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            try:
                yield from handler(self, request, context)
            except ShuffleError as error:
                _abort(self.metrics, context, method, error)

        return cast(Handler, streaming)

    @functools.wraps(handler)
    def unary(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return handler(self, request, context)
        except ShuffleError as error:
            _abort(self.metrics, context, method, error)

    return cast(Handler, unary)
