"""The data port's handshake: both sides prove they hold the application's secret, and the
secret itself never crosses the network.

The server sends a random nonce; the client answers with a nonce of its own and an HMAC of
both under the secret; the server checks it and answers with its own HMAC, which the client
checks. Each side's proof is bound to both nonces and to its role, so nothing recorded from
one connection (or reflected from the other side) proves anything on another.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
from typing import Final

from netty_like.protocol import FrameType, decode_error, encode_error, read_frame, write_frame
from shuffle_api import AuthenticationError, ShuffleError

__all__ = ["HANDSHAKE_FRAME_LIMIT", "accept_handshake", "open_handshake"]

_NONCE: Final = 32
_DIGEST: Final = hashlib.sha256().digest_size
HANDSHAKE_FRAME_LIMIT: Final = 1024
"""The largest frame read before a peer has proven itself."""


def _proof(secret: bytes, role: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.digest(secret, b"pyshuffle-data-port/" + role + first + second, "sha256")


def _expect(sock: socket.socket, frame_type: FrameType, size: int, peer: str) -> memoryview:
    frame = read_frame(sock, HANDSHAKE_FRAME_LIMIT)
    if frame is None:
        raise AuthenticationError(f"{peer} closed the connection during the handshake")
    got, body = frame
    if got is FrameType.ERROR:
        _, _, message = decode_error(body)
        raise AuthenticationError(f"{peer} refused the handshake: {message}")
    if got is not frame_type or len(body) != size:
        raise AuthenticationError(
            f"{peer} sent a {got.name} frame of {len(body)} bytes where the handshake expects"
            f" {frame_type.name}"
        )
    return body


def accept_handshake(sock: socket.socket, secret: bytes) -> None:
    """Server side; raises :class:`AuthenticationError` (after telling the peer) unless the
    peer proves it holds ``secret``."""
    server_nonce = secrets.token_bytes(_NONCE)
    write_frame(sock, FrameType.CHALLENGE, server_nonce)
    try:
        body = _expect(sock, FrameType.AUTH, _NONCE + _DIGEST, "the client")
    except (ShuffleError, TimeoutError) as error:
        refusal = AuthenticationError(f"the data port refused the connection: {error}")
        write_frame(sock, FrameType.ERROR, encode_error(0, refusal))
        raise refusal from None
    client_nonce, proof = bytes(body[:_NONCE]), bytes(body[_NONCE:])
    if not hmac.compare_digest(proof, _proof(secret, b"client", server_nonce, client_nonce)):
        refusal = AuthenticationError(
            "the data port refused the connection: wrong application secret (the client is"
            " not part of this application)"
        )
        write_frame(sock, FrameType.ERROR, encode_error(0, refusal))
        raise refusal
    write_frame(sock, FrameType.AUTH_OK, _proof(secret, b"server", client_nonce, server_nonce))


def open_handshake(sock: socket.socket, secret: bytes, address: str) -> None:
    """Client side; raises :class:`AuthenticationError` unless both sides prove ``secret``."""
    server_nonce = bytes(_expect(sock, FrameType.CHALLENGE, _NONCE, f"the data port {address}"))
    client_nonce = secrets.token_bytes(_NONCE)
    proof = _proof(secret, b"client", server_nonce, client_nonce)
    write_frame(sock, FrameType.AUTH, client_nonce + proof)
    answer = bytes(_expect(sock, FrameType.AUTH_OK, _DIGEST, f"the data port {address}"))
    if not hmac.compare_digest(answer, _proof(secret, b"server", client_nonce, server_nonce)):
        raise AuthenticationError(
            f"the data port {address} did not prove it holds the application's secret"
        )
