"""The shared-secret token and TLS, for both ends.

Every call carries ``authorization: Bearer <token>``; the daemon's interceptor rejects a call
without it (or with another) before any handler runs, so a rejected call never touches data.
Only the gRPC health service is open, for probes that cannot send a token.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import grpc

from external_shuffle.options import (
    AUTH_TOKEN,
    AUTH_TOKEN_FILE,
    TLS_CA_FILE,
    TLS_CERT_FILE,
    TLS_KEY_FILE,
)
from shuffle_api import ConfigError, Configuration

if TYPE_CHECKING:
    from external_shuffle.ops.metrics import DaemonMetrics

__all__ = [
    "AUTHORIZATION",
    "TokenInterceptor",
    "client_credentials",
    "load_token",
    "server_credentials",
]

logger = logging.getLogger(__name__)

AUTHORIZATION: Final = "authorization"
_OPEN_SERVICES: Final = ("/grpc.health.v1.Health/",)


def load_token(configuration: Configuration) -> str:
    """The shared secret: the token file's content, else the token option. Raises ConfigError
    naming both keys when neither is set."""
    path = configuration.get(AUTH_TOKEN_FILE)
    if path:
        try:
            token = Path(path).read_text(encoding="utf-8").strip()
        except OSError as error:
            raise ConfigError(
                f"{AUTH_TOKEN_FILE.key} = {path!r} cannot be read: {error}"
            ) from error
        if not token:
            raise ConfigError(f"{AUTH_TOKEN_FILE.key} = {path!r} is empty")
        return token
    token = configuration.get(AUTH_TOKEN).strip()
    if not token:
        raise ConfigError(
            f"the external shuffle service needs a shared token: set {AUTH_TOKEN_FILE.key} (a"
            f" file holding it) or {AUTH_TOKEN.key} (or {AUTH_TOKEN.env_name})"
        )
    return token


def _read(option_key: str, path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise ConfigError(f"{option_key} = {path!r} cannot be read: {error}") from error


def server_credentials(configuration: Configuration) -> grpc.ServerCredentials | None:
    """TLS credentials when a certificate is configured, else None (plaintext)."""
    cert, key = configuration.get(TLS_CERT_FILE), configuration.get(TLS_KEY_FILE)
    if not cert and not key:
        return None
    if not (cert and key):
        raise ConfigError(f"TLS needs both {TLS_CERT_FILE.key} and {TLS_KEY_FILE.key}")
    return grpc.ssl_server_credentials(
        [(_read(TLS_KEY_FILE.key, key), _read(TLS_CERT_FILE.key, cert))]
    )


def client_credentials(configuration: Configuration) -> grpc.ChannelCredentials | None:
    """TLS credentials trusting the configured CA, else None (plaintext)."""
    ca = configuration.get(TLS_CA_FILE)
    if not ca:
        return None
    return grpc.ssl_channel_credentials(root_certificates=_read(TLS_CA_FILE.key, ca))


class TokenInterceptor(grpc.ServerInterceptor):
    """Lets through only calls whose metadata carries the token (and health checks). A
    refused call is counted (``pyshuffle_auth_failures_total``) and logged with its peer."""

    def __init__(self, token: str, metrics: DaemonMetrics) -> None:
        self._expected = f"Bearer {token}".encode()
        self._metrics = metrics

    def _denied(self, method: str, problem: str) -> Callable[[Any, grpc.ServicerContext], Any]:
        def deny(request: Any, context: grpc.ServicerContext) -> Any:
            self._metrics.auth_failures.labels(method=method).inc()
            logger.warning(
                "refused %s from %s: %s",
                method,
                context.peer(),
                problem,
                extra={"method": method, "peer": context.peer(), "code": "UNAUTHENTICATED"},
            )
            context.abort(grpc.StatusCode.UNAUTHENTICATED, f"{method}: {problem}")

        return deny

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        method = handler_call_details.method
        handler = continuation(handler_call_details)
        if handler is None or method.startswith(_OPEN_SERVICES):
            return handler
        presented = dict(handler_call_details.invocation_metadata).get(AUTHORIZATION)
        if presented is None:
            problem = "no token: calls need metadata 'authorization: Bearer <token>'"
        elif not hmac.compare_digest(
            presented.encode() if isinstance(presented, str) else presented, self._expected
        ):
            problem = "wrong token"
        else:
            return handler
        deny = self._denied(method, problem)
        # The same kind of handler as the method's, so the call ends cleanly without reading it.
        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(deny)
        if handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(deny)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(deny)
        return grpc.unary_unary_rpc_method_handler(deny)
