"""How the daemon's handlers report a ShuffleError: a gRPC status with the error's class and
partition (``wire.errors``), a log line, a metric."""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

import grpc

from external_shuffle.ops.metrics import DaemonMetrics
from external_shuffle.wire.errors import short, status_for, trailing_metadata
from shuffle_api import AuthenticationError, ShuffleError

__all__ = ["abort_call", "reports_errors"]

logger = logging.getLogger(__name__)

Handler = TypeVar("Handler", bound=Callable[..., Any])


def abort_call(
    metrics: DaemonMetrics, context: grpc.ServicerContext, method: str, error: ShuffleError
) -> None:
    """End the call with ``error``; a refused credential is counted in the authentication
    failures and logged with the peer, any other error in the errors."""
    code = status_for(error)
    details = short(str(error))
    extra = {"method": method, "code": code.name}
    if isinstance(error, AuthenticationError):
        metrics.auth_failures.labels(method=method).inc()
        logger.warning("refused %s from %s: %s", method, context.peer(), details, extra=extra)
    else:
        metrics.errors.labels(method=method, code=code.name).inc()
        logger.warning("%s failed: %s", method, details, extra=extra)
    context.set_trailing_metadata(tuple(trailing_metadata(error)))
    context.abort(code, details)


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
                abort_call(self.metrics, context, method, error)

        return cast(Handler, streaming)

    @functools.wraps(handler)
    def unary(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return handler(self, request, context)
        except ShuffleError as error:
            abort_call(self.metrics, context, method, error)

    return cast(Handler, unary)
