"""Client side of the wire: channels that carry the token, and gRPC errors as ShuffleErrors."""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Any

import grpc

from external_shuffle.options import CLIENT_TIMEOUT, MAX_MESSAGE_SIZE
from external_shuffle.wire.auth import AUTHORIZATION, client_credentials, load_token
from external_shuffle.wire.errors import error_from_status
from external_shuffle.wire.version import WIRE_VERSION, WIRE_VERSION_HEADER
from shuffle_api import (
    Configuration,
    ResultPartitionID,
    ShuffleError,
    ShuffleServiceClosedError,
)

__all__ = [
    "ChannelPool",
    "ClientSettings",
    "channel_options",
    "translate_rpc_error",
]


_MAX_RECONNECT_BACKOFF_MS = 1000


def channel_options(max_message_size: int) -> list[tuple[str, int]]:
    """Message limits for channels and servers (gRPC's defaults are 4 MiB in, unlimited out),
    and reconnects to a peer found down at least every second: gRPC's backoff otherwise grows
    to two minutes, and a channel waiting it out fails every call at once although a restarted
    worker is back."""
    return [
        ("grpc.max_send_message_length", max_message_size),
        ("grpc.max_receive_message_length", max_message_size),
        ("grpc.max_reconnect_backoff_ms", _MAX_RECONNECT_BACKOFF_MS),
    ]


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """What every client channel needs: the token, TLS trust, limits and the call timeout."""

    token: str
    credentials: grpc.ChannelCredentials | None
    max_message_size: int
    timeout: float

    @classmethod
    def from_configuration(cls, configuration: Configuration) -> ClientSettings:
        return cls(
            token=load_token(configuration),
            credentials=client_credentials(configuration),
            max_message_size=configuration.get(MAX_MESSAGE_SIZE),
            timeout=configuration.get(CLIENT_TIMEOUT),
        )


class _CallMetadata(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds the token (call credentials would demand TLS) and the wire version to every call."""

    def __init__(self, token: str) -> None:
        self.use(token)

    def use(self, token: str) -> None:
        # One assignment: a call made meanwhile has the old metadata or the new, whole.
        self._metadata = (
            (AUTHORIZATION, f"Bearer {token}"),
            (WIRE_VERSION_HEADER, str(WIRE_VERSION)),
        )

    def _with_metadata(self, details: Any) -> Any:
        metadata = [*(details.metadata or ()), *self._metadata]
        return _CallDetails(
            details.method,
            details.timeout,
            metadata,
            details.credentials,
            details.wait_for_ready,
            details.compression,
        )

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_metadata(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_metadata(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._with_metadata(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._with_metadata(details), requests)


@dataclass(frozen=True)
class _CallDetails(grpc.ClientCallDetails):
    method: str
    timeout: float | None
    metadata: Any
    credentials: Any
    wait_for_ready: bool | None
    compression: Any


class ChannelPool:
    """One channel per target, shared by every call of this process to it."""

    def __init__(self, settings: ClientSettings) -> None:
        self.settings = settings
        self._call_metadata = _CallMetadata(settings.token)
        self._channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()
        self._closed = False

    def get(self, target: str) -> grpc.Channel:
        with self._lock:
            if self._closed:
                raise ShuffleServiceClosedError("the external shuffle client is closed")
            channel = self._channels.get(target)
            if channel is None:
                options = channel_options(self.settings.max_message_size)
                if self.settings.credentials is None:
                    raw = grpc.insecure_channel(target, options=options)
                else:
                    raw = grpc.secure_channel(target, self.settings.credentials, options=options)
                channel = grpc.intercept_channel(raw, self._call_metadata)
                self._channels[target] = channel
            return channel

    def use_token(self, token: str) -> None:
        """Present ``token`` on every later call (an application's credential, once issued)."""
        self.settings = dataclasses.replace(self.settings, token=token)
        self._call_metadata.use(token)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            channel.close()


def translate_rpc_error(
    error: grpc.RpcError, what: str, partition: ResultPartitionID | None = None
) -> ShuffleError:
    """The ShuffleError for a failed call (the class the daemon raised, see ``wire.errors``);
    ``what`` says which call, on which peer, ``partition`` which partition it was about."""
    if not isinstance(error, grpc.Call):
        return ShuffleError(f"{what} failed: {error}")
    return error_from_status(
        error.code(), error.details() or "", error.trailing_metadata() or (), what, partition
    )
