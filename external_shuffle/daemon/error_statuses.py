"""How the daemon's handlers report a ShuffleError: a gRPC status with the error's class and
partition (``wire_errors``), a log line, a metric; and request bytes that do not decode
reported as the client's error, not the daemon's."""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

import grpc

from external_shuffle.ops.metrics import DaemonMetrics
from external_shuffle.wire.errors import short, status_for, trailing_metadata
from shuffle_api import SerializationError, ShuffleError

__all__ = ["RequestDecodingInterceptor", "reports_errors"]

logger = logging.getLogger(__name__)

Handler = TypeVar("Handler", bound=Callable[..., Any])


def _abort(
    metrics: DaemonMetrics, context: grpc.ServicerContext, method: str, error: ShuffleError
) -> None:
    code = status_for(error)
    details = short(str(error))
    metrics.errors.labels(method=method, code=code.name).inc()
    logger.warning("%s failed: %s", method, details, extra={"method": method, "code": code.name})
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
                _abort(self.metrics, context, method, error)

        return cast(Handler, streaming)

    @functools.wraps(handler)
    def unary(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return handler(self, request, context)
        except ShuffleError as error:
            _abort(self.metrics, context, method, error)

    return cast(Handler, unary)


def _tolerant(decode: Callable[[bytes], Any], method: str) -> Callable[[bytes], Any]:
    """``decode``, giving the SerializationError for bytes it cannot decode instead of
    raising it (gRPC would end the call with INTERNAL, as if the daemon had failed)."""

    def tolerant(data: bytes) -> Any:
        try:
            return decode(data)
        except Exception as error:  # any decoder's failure: the bytes are the client's
            return SerializationError(f"{method}: the request does not decode: {error}")

    return tolerant


class RequestDecodingInterceptor(grpc.ServerInterceptor):
    """Request bytes that do not decode end the call with INVALID_ARGUMENT (a
    SerializationError for the client); request streams get the error as an element, which
    the handler raises."""

    def __init__(self, metrics: DaemonMetrics) -> None:
        self._metrics = metrics

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        method = handler_call_details.method.rsplit("/", 1)[-1]
        decode = _tolerant(handler.request_deserializer, method)
        serialize = handler.response_serializer
        if handler.request_streaming and handler.response_streaming:
            assert handler.stream_stream is not None
            return grpc.stream_stream_rpc_method_handler(handler.stream_stream, decode, serialize)
        if handler.request_streaming:
            assert handler.stream_unary is not None
            return grpc.stream_unary_rpc_method_handler(handler.stream_unary, decode, serialize)
        behavior = handler.unary_stream if handler.response_streaming else handler.unary_unary
        assert behavior is not None
        metrics = self._metrics

        def refusing_undecodable(request: Any, context: grpc.ServicerContext) -> Any:
            if isinstance(request, SerializationError):
                _abort(metrics, context, method, request)
            return behavior(request, context)

        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(refusing_undecodable, decode, serialize)
        return grpc.unary_unary_rpc_method_handler(refusing_undecodable, decode, serialize)
