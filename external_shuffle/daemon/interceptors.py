"""The daemon's gRPC server interceptors, in the order a call meets them: the token, the wire
version, then request bytes that do not decode (reported as the client's error, not the
daemon's). Only the gRPC health service is open, for probes that cannot send a token."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final, TypeAlias

import grpc

from external_shuffle.daemon.error_statuses import abort_call
from external_shuffle.ops.metrics import DaemonMetrics
from external_shuffle.wire.credentials import CredentialCheck
from external_shuffle.wire.version import wire_version_of
from shuffle_api import AuthenticationError, SerializationError, UnsupportedFormatVersionError

__all__ = ["RequestDecodingInterceptor", "TokenInterceptor", "WireVersionInterceptor"]

logger = logging.getLogger(__name__)

_OPEN_SERVICES: Final = ("/grpc.health.v1.Health/",)
Behavior = Callable[[Any, grpc.ServicerContext], Any]
# A string: grpc's classes are generic only to the type checker.
Continuation: TypeAlias = (
    "Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None]"
)


def _refusing(
    handler: grpc.RpcMethodHandler[Any, Any], refuse: Behavior
) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of the same kind as ``handler`` that runs ``refuse`` (which aborts), so the
    call ends cleanly without its request being read."""
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse)
    return grpc.unary_unary_rpc_method_handler(refuse)


class TokenInterceptor(grpc.ServerInterceptor):
    """Lets through only calls whose metadata carries a credential (``wire.credentials``) that
    may call the method (and health checks). A refused call is counted
    (``pyshuffle_auth_failures_total``) and logged with its peer and credential."""

    def __init__(self, check: CredentialCheck, metrics: DaemonMetrics) -> None:
        self._check = check
        self._metrics = metrics

    def _denied(self, method: str, error: AuthenticationError) -> Behavior:
        def deny(request: Any, context: grpc.ServicerContext) -> Any:
            abort_call(self._metrics, context, method, error)

        return deny

    def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        method = handler_call_details.method
        handler = continuation(handler_call_details)
        if handler is None or method.startswith(_OPEN_SERVICES):
            return handler
        try:
            self._check.credential_of_call(handler_call_details.invocation_metadata).check_may_call(
                method
            )
        except AuthenticationError as error:  # PermissionDeniedError included
            return _refusing(handler, self._denied(method, error))
        return handler


class WireVersionInterceptor(grpc.ServerInterceptor):
    """Refuses a call whose wire version (``wire.version``) this daemon does not serve, with
    UnsupportedFormatVersionError naming both versions, before any handler runs."""

    def __init__(self, metrics: DaemonMetrics) -> None:
        self._metrics = metrics

    def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(_OPEN_SERVICES):
            return handler
        try:
            wire_version_of(handler_call_details.invocation_metadata)
        except UnsupportedFormatVersionError as error:
            method = handler_call_details.method.rsplit("/", 1)[-1]
            metrics, refused = self._metrics, error

            def refuse(request: Any, context: grpc.ServicerContext) -> Any:
                abort_call(metrics, context, method, refused)

            return _refusing(handler, refuse)
        return handler


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
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
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
                abort_call(metrics, context, method, request)
            return behavior(request, context)

        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(refusing_undecodable, decode, serialize)
        return grpc.unary_unary_rpc_method_handler(refusing_undecodable, decode, serialize)
