"""The shared-secret token and TLS, for both ends (gRPC's credentials, and the data port's
contexts, from the same files).

Every call carries ``authorization: Bearer <token>``: the cluster's secret, or an operator's
credential derived from it (``wire.credentials``); the daemon's interceptor
(``daemon.interceptors``) rejects a call without one, or with one that may not make it,
before any handler runs, so a rejected call never touches data.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Final

import grpc

from external_shuffle.options import (
    APPLICATION_CREDENTIAL,
    AUTH_TOKEN,
    AUTH_TOKEN_FILE,
    TLS_CA_FILE,
    TLS_CERT_FILE,
    TLS_KEY_FILE,
)
from shuffle_api import ConfigError, Configuration
from shuffle_runtime.tls import TlsFiles

__all__ = [
    "AUTHORIZATION",
    "client_credentials",
    "data_port_client_tls",
    "data_port_server_tls",
    "load_token",
    "server_credentials",
]

AUTHORIZATION: Final = "authorization"


def load_token(configuration: Configuration) -> str:
    """What a client presents: its application's credential (set by its driver), else the
    token file's content, else the token option (the cluster's secret, or a credential). Raises
    ConfigError naming the keys when none is set."""
    issued = configuration.get(APPLICATION_CREDENTIAL).strip()
    if issued:
        return issued
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


def _server_files(configuration: Configuration) -> TlsFiles | None:
    cert, key = configuration.get(TLS_CERT_FILE), configuration.get(TLS_KEY_FILE)
    if not cert and not key:
        return None
    if not (cert and key):
        raise ConfigError(f"TLS needs both {TLS_CERT_FILE.key} and {TLS_KEY_FILE.key}")
    return TlsFiles(cert_file=cert, key_file=key)


def server_credentials(configuration: Configuration) -> grpc.ServerCredentials | None:
    """TLS credentials when a certificate is configured, else None (plaintext)."""
    files = _server_files(configuration)
    if files is None:
        return None
    return grpc.ssl_server_credentials(
        [(_read(TLS_KEY_FILE.key, files.key_file), _read(TLS_CERT_FILE.key, files.cert_file))]
    )


def data_port_server_tls(configuration: Configuration) -> ssl.SSLContext | None:
    """The worker's data port's TLS context: the gRPC port's certificate, else None."""
    files = _server_files(configuration)
    return None if files is None else files.server_context()


def client_credentials(configuration: Configuration) -> grpc.ChannelCredentials | None:
    """TLS credentials trusting the configured CA, else None (plaintext)."""
    ca = configuration.get(TLS_CA_FILE)
    if not ca:
        return None
    return grpc.ssl_channel_credentials(root_certificates=_read(TLS_CA_FILE.key, ca))


def data_port_client_tls(configuration: Configuration) -> ssl.SSLContext | None:
    """A data port client's TLS context trusting the configured CA (the certificate must
    name the worker, as gRPC checks it), else None."""
    return TlsFiles(ca_file=configuration.get(TLS_CA_FILE)).client_context()
