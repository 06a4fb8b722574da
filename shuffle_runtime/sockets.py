"""Framed TCP connections that authenticate both ends: what every plain-socket port of pyshuffle
stands on (the default service's data port, the external worker's data port).

A frame is ``!IB`` (length of the rest, type) and the rest. Frame types 7 to 10 belong to this
module on every such port; each protocol numbers its own frames around them.

A connection opens with a handshake in which both sides prove they hold a shared secret, and the
secret itself never crosses the network. The server sends CHALLENGE (a random nonce); the client
answers AUTH (a nonce of its own and an HMAC of both under the secret); the server checks it and
answers AUTH_OK (its own HMAC), which the client checks. Each side's proof is bound to both
nonces and to its role, so nothing recorded from one connection (or reflected from the other
side) proves anything on another. A client may name, after its proof, whose secret it proves
(a credential's public part, ``MAX_IDENTITY`` bytes at most): a server that keys each client
by it (``keys``) checks the proof with that key. A server that will not serve a connection
says why in a
REFUSED frame (channel 0, an error code, the reason; the default service's ERROR frames share
the layout) and hangs up.

:class:`AuthenticatedListener` accepts such connections within bounds: a cap on connections
open at once (one thread each), and a time limit on the handshake.

With TLS (``shuffle_runtime.tls``) the connection speaks TLS from its first byte, and the
handshake above runs inside it: TLS proves the server to the client and encrypts; the secret
still proves the client.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import logging
import secrets
import select
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import pyarrow as pa

from shuffle_api.errors import (
    AuthenticationError,
    DataTooLargeError,
    ShuffleError,
    TransportError,
)
from shuffle_runtime.tls import TlsSocket, buffered, wait_ready

__all__ = [
    "AUTH",
    "AUTH_OK",
    "CHALLENGE",
    "FRAME_PREFIX",
    "HANDSHAKE_FRAME_LIMIT",
    "MAX_BATCH",
    "REFUSED",
    "AuthenticatedListener",
    "FrameReader",
    "accept_handshake",
    "frame_bytes",
    "open_connection",
    "open_handshake",
    "read_frame",
    "receive_into",
    "refuse",
    "wait_readable",
    "write_frame",
]

_LOG = logging.getLogger(__name__)

FRAME_PREFIX: Final = struct.Struct("!IB")
REFUSED: Final = 7
CHALLENGE: Final = 8
AUTH: Final = 9
AUTH_OK: Final = 10
_REFUSAL = struct.Struct("!IB")
# The codes a refusal carries (the default service's error codes for the same classes).
_REFUSAL_OTHER: Final = 8
_REFUSAL_AUTHENTICATION: Final = 9
_MAX_REFUSAL_TEXT = 4096

_NONCE: Final = 32
_DIGEST: Final = hashlib.sha256().digest_size
HANDSHAKE_FRAME_LIMIT: Final = 1024
"""The largest frame read before a peer has proven itself."""
MAX_IDENTITY: Final = 512
"""The longest identity a client names in its proof."""
MAX_BATCH: Final = 256
"""The most partitions one batched request asks a data port for (both ports refuse more)."""

# A frame's body is read in pieces of at most this size, so what a peer announces is allocated
# only as its bytes arrive.
_READ_PIECE = 4 << 20


def frame_bytes(frame_type: int, body: bytes) -> bytes:
    """A whole frame, for a sender that puts several in one send."""
    return FRAME_PREFIX.pack(len(body), frame_type) + body


def write_frame(
    sock: socket.socket, frame_type: int, header: bytes, payload: pa.Buffer | bytes = b""
) -> None:
    """Send one frame; ``payload`` goes out without a copy."""
    if not len(payload):
        sock.sendall(frame_bytes(frame_type, header))
        return
    sock.sendall(FRAME_PREFIX.pack(len(header) + len(payload), frame_type) + header)
    sock.sendall(memoryview(payload))


def _wait_until(sock: socket.socket, deadline: float | None) -> None:
    """Let the next receive wait no later than ``deadline`` (``time.monotonic()``): a peer
    that sends a byte now and then cannot stretch a bounded read."""
    if deadline is None:
        return
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError("timed out")
    sock.settimeout(remaining)


def _read_exactly(
    sock: socket.socket, size: int, deadline: float | None = None
) -> pa.Buffer | None:
    """``size`` bytes, or ``None`` if the peer closed before the first one (a timeout then
    is the socket's ``TimeoutError``; after it, a :class:`TransportError`)."""
    data = pa.allocate_buffer(min(size, _READ_PIECE))  # not zero-filled, unlike a bytearray
    received = 0
    while received < size:
        if received == data.size:
            grown = pa.allocate_buffer(min(size, 2 * data.size))
            memoryview(grown)[:received] = memoryview(data)
            data = grown
        try:
            _wait_until(sock, deadline)
            count = sock.recv_into(memoryview(data)[received:], data.size - received)
        except TimeoutError:
            if received == 0:
                raise
            raise TransportError("the peer stopped in the middle of a frame") from None
        if count == 0:
            if received == 0:
                return None
            raise TransportError("connection closed in the middle of a frame")
        received += count
    return data


def receive_into(sock: socket.socket, buffer: memoryview) -> None:
    """Fill ``buffer`` from ``sock`` (bytes that follow a frame, of a size the frame gave)."""
    received = 0
    while received < len(buffer):
        count = sock.recv_into(buffer[received:])
        if count == 0:
            raise TransportError(
                f"connection closed after {received} of the {len(buffer)} bytes announced"
            )
        received += count


def _frame_prefix(prefix: memoryview, max_frame_size: int) -> tuple[int, int]:
    """A frame's body size and type; DataTooLargeError past ``max_frame_size``, before the
    body is read."""
    size, frame_type = FRAME_PREFIX.unpack(prefix)
    if size > max_frame_size:
        raise DataTooLargeError(
            f"a frame of {size} bytes exceeds the limit of {max_frame_size} bytes here"
        )
    return size, frame_type


def read_frame(
    sock: socket.socket, max_frame_size: int, deadline: float | None = None
) -> tuple[int, memoryview] | None:
    """The next frame's type and body, or ``None`` when the peer closed the connection between
    frames. A frame larger than ``max_frame_size`` is refused before its body is read; one
    not whole by ``deadline`` (``time.monotonic()``) is a timeout."""
    prefix = _read_exactly(sock, FRAME_PREFIX.size, deadline)
    if prefix is None:
        return None
    size, frame_type = _frame_prefix(memoryview(prefix), max_frame_size)
    if size == 0:
        return frame_type, memoryview(b"")
    try:
        body = _read_exactly(sock, size, deadline)
    except TimeoutError:
        raise TransportError("the peer stopped in the middle of a frame") from None
    if body is None:
        raise TransportError("connection closed in the middle of a frame")
    return frame_type, memoryview(body)


class FrameReader:
    """Frames read from ``sock`` through a buffer of ``buffer_size`` bytes: the frames of many
    small blocks arrive in one receive, where :func:`read_frame` makes two each (a reducer's
    fetch of a thousand map outputs is thousands of frames). Bytes that follow a frame
    (:meth:`receive_into`) come from the buffer first, then straight from the socket.

    For one answer at a time: the peer sends nothing unasked, so the buffer never holds the
    start of another answer, and :meth:`check_drained` says the answer ended where it should.
    """

    def __init__(self, sock: socket.socket, buffer_size: int = 64 << 10) -> None:
        self._sock = sock
        self._buffer = bytearray(buffer_size)
        self._view = memoryview(self._buffer)
        self._start = self._end = 0

    @property
    def _buffered(self) -> int:
        return self._end - self._start

    def _fill(self, size: int) -> bool:
        """At least ``size`` (<= the buffer's size) bytes buffered; False if the peer closed
        before the first of them."""
        if self._buffered >= size:
            return True
        if self._start:  # what is left moves to the front, making room
            self._view[: self._buffered] = self._view[self._start : self._end]
            self._end -= self._start
            self._start = 0
        first = self._end
        while self._end < size:
            count = self._sock.recv_into(self._view[self._end :])
            if count == 0:
                if self._end == first == 0:
                    return False
                raise TransportError("connection closed in the middle of a frame")
            self._end += count
        return True

    def _take(self, size: int) -> memoryview:
        taken = self._view[self._start : self._start + size]
        self._start += size
        return taken

    def read_frame(self, max_frame_size: int) -> tuple[int, bytes] | None:
        """As :func:`read_frame` (its body as bytes of its own), the socket's timeout for each
        receive."""
        if not self._fill(FRAME_PREFIX.size):
            return None
        size, frame_type = _frame_prefix(self._take(FRAME_PREFIX.size), max_frame_size)
        if size > len(self._buffer):  # rare (a large manifest): straight into its own bytes
            body = bytearray(size)
            self.receive_into(memoryview(body))
            return frame_type, bytes(body)
        if not self._fill(size):
            raise TransportError("connection closed in the middle of a frame")
        return frame_type, bytes(self._take(size))

    def receive_into(self, buffer: memoryview) -> None:
        """Fill ``buffer``: bytes that follow a frame, of a size the frame gave."""
        target = buffer.cast("B")
        buffered = min(self._buffered, len(target))
        target[:buffered] = self._take(buffered)
        receive_into(self._sock, target[buffered:])

    def check_drained(self) -> None:
        """TransportError if the peer sent more than its answer."""
        if self._buffered:
            raise TransportError(f"{self._buffered} bytes arrived after the end of the answer")


def refuse(sock: socket.socket, error: ShuffleError) -> None:
    """Tell the peer why it is not served (it raises the same class: an AuthenticationError,
    else a TransportError); the caller hangs up."""
    code = _REFUSAL_AUTHENTICATION if isinstance(error, AuthenticationError) else _REFUSAL_OTHER
    text = str(error)[:_MAX_REFUSAL_TEXT].encode("utf-8")
    write_frame(sock, REFUSED, _REFUSAL.pack(0, code) + text)


def _refusal(body: memoryview, peer: str) -> ShuffleError:
    if len(body) < _REFUSAL.size:
        return TransportError(f"{peer} refused the connection")
    _, code = _REFUSAL.unpack_from(body)
    reason = bytes(body[_REFUSAL.size :]).decode("utf-8", "replace")
    if code == _REFUSAL_AUTHENTICATION:
        return AuthenticationError(f"{peer} refused the handshake: {reason}")
    return TransportError(f"{peer} refused the connection: {reason}")


def _proof(secret: bytes, role: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.digest(secret, b"pyshuffle-data-port/" + role + first + second, "sha256")


def _expect(
    sock: socket.socket,
    frame_type: int,
    size: int,
    peer: str,
    deadline: float | None = None,
    *,
    extra: int = 0,
) -> memoryview:
    """The next frame's body, of ``frame_type`` and ``size`` bytes (up to ``extra`` more)."""
    frame = read_frame(sock, HANDSHAKE_FRAME_LIMIT, deadline)
    if frame is None:
        raise AuthenticationError(f"{peer} closed the connection during the handshake")
    got, body = frame
    if got == REFUSED:
        raise _refusal(body, peer)
    if got != frame_type or not size <= len(body) <= size + extra:
        raise AuthenticationError(
            f"{peer} sent a frame of type {got} and {len(body)} bytes where the handshake"
            f" expects type {frame_type} of {size} bytes"
        )
    return body


def accept_handshake(
    sock: socket.socket, keys: Callable[[bytes], bytes], deadline: float | None = None
) -> bytes:
    """Server side: the identity the peer named (b"" if none) once it proved it holds the
    secret ``keys(identity)`` gives, by ``deadline`` (``time.monotonic()``); else
    :class:`AuthenticationError` (after telling the peer; ``keys`` raises one for an identity
    it does not accept)."""
    server_nonce = secrets.token_bytes(_NONCE)
    write_frame(sock, CHALLENGE, server_nonce)
    try:
        body = _expect(sock, AUTH, _NONCE + _DIGEST, "the client", deadline, extra=MAX_IDENTITY)
        client_nonce, proof = bytes(body[:_NONCE]), bytes(body[_NONCE : _NONCE + _DIGEST])
        identity = bytes(body[_NONCE + _DIGEST :])
        secret = keys(identity)
    except (ShuffleError, TimeoutError) as error:
        refusal = AuthenticationError(f"the data port refused the connection: {error}")
        refuse(sock, refusal)
        raise refusal from None
    if not hmac.compare_digest(proof, _proof(secret, b"client", server_nonce, client_nonce)):
        refusal = AuthenticationError(
            "the data port refused the connection: wrong secret (the client is not part of"
            " this application, or holds another token)"
        )
        refuse(sock, refusal)
        raise refusal
    write_frame(sock, AUTH_OK, _proof(secret, b"server", client_nonce, server_nonce))
    return identity


def open_handshake(sock: socket.socket, secret: bytes, address: str, identity: bytes = b"") -> None:
    """Client side; raises :class:`AuthenticationError` unless both sides prove ``secret``
    (whose it is, ``identity``, named to a server that keys clients by it; a
    :class:`TransportError` if the server is too busy to serve the connection)."""
    if len(identity) > MAX_IDENTITY:
        raise AuthenticationError(f"an identity of {len(identity)} bytes: {MAX_IDENTITY} at most")
    server_nonce = bytes(_expect(sock, CHALLENGE, _NONCE, f"the data port {address}"))
    client_nonce = secrets.token_bytes(_NONCE)
    proof = _proof(secret, b"client", server_nonce, client_nonce)
    write_frame(sock, AUTH, client_nonce + proof + identity)
    answer = bytes(_expect(sock, AUTH_OK, _DIGEST, f"the data port {address}"))
    if not hmac.compare_digest(answer, _proof(secret, b"server", client_nonce, server_nonce)):
        raise AuthenticationError(
            f"the data port {address} did not prove it holds the application's secret"
        )


def wait_readable(sock: socket.socket, timeout: float) -> bool:
    """Whether ``sock`` has something to read (bytes, or the end of the stream) within
    ``timeout`` seconds: received bytes TLS already holds count, and so does a descriptor
    numbered past ``select``'s limit."""
    return buffered(sock) or wait_ready(sock, select.POLLIN, timeout)


def open_connection(
    host: str,
    port: int,
    *,
    secret: bytes,
    timeout: float,
    tls: ssl.SSLContext | None = None,
    server_name: str | None = None,
    identity: bytes = b"",
) -> socket.socket:
    """A connection to the data port at ``host:port``, connected within ``timeout`` and past
    its handshake: TLS first where ``tls`` (the context trusting the server) is given, with a
    certificate naming ``server_name`` (default ``host``); ``identity``: whose ``secret`` it
    is (:func:`open_handshake`). The errors of connecting are
    ``OSError`` s, those of the handshakes ``ShuffleError`` s."""
    sock = socket.create_connection((host, port), timeout=timeout)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is not None:
            sock = TlsSocket.client(sock, tls, server_name or host)
        open_handshake(sock, secret, f"{host}:{port}", identity)
    except BaseException:
        sock.close()
        raise
    return sock


@dataclass(slots=True)
class _Open:
    """An open connection: its peer's address, and the identity it named (once proven)."""

    host: str
    identity: bytes = b""


def _only_secret(secret: bytes, identity: bytes) -> bytes:
    if identity:
        raise AuthenticationError("this data port takes no identity: prove its secret alone")
    return secret


class AuthenticatedListener:
    """Listens on ``host:port`` (0: any free port; an IPv6 host too, ``::`` taking IPv4 as
    well) until :meth:`stop`. Each connection gets a thread, at most ``max_connections`` at
    once and ``max_connections_per_peer`` from one address (beyond them a connection is
    refused), passes the handshake within ``handshake_timeout`` and is then handed to
    ``serve(sock, peer)``,
    which owns it until it returns; the listener closes it then. ``on_refused(peer)`` is called
    for each peer that fails the handshake. With ``tls`` (a server context) every connection
    is TLS (a plaintext client is told so, in the clear, and refused). With ``keys``, a
    client proves the secret ``keys(identity)`` gives for the identity it names
    (:func:`accept_handshake`), which :meth:`identity_of` tells while it is served; without,
    every client proves ``secret``."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        secret: bytes,
        max_connections: int,
        handshake_timeout: float,
        serve: Callable[[socket.socket, str], None],
        name: str,
        max_connections_per_peer: int | None = None,
        on_refused: Callable[[str], None] = lambda peer: None,
        tls: ssl.SSLContext | None = None,
        keys: Callable[[bytes], bytes] | None = None,
    ) -> None:
        self._keys = keys or functools.partial(_only_secret, secret)
        self._tls = tls
        self._on_refused = on_refused
        self._max_connections = max_connections
        self._max_per_peer = max_connections_per_peer or max_connections
        self._handshake_timeout = handshake_timeout
        self._serve = serve
        self._name = name
        if ":" in host:
            self._listener = socket.create_server(
                (host, port), family=socket.AF_INET6, dualstack_ipv6=host == "::"
            )
        else:
            self._listener = socket.create_server((host, port))
        self._stopping = threading.Event()
        self._connections: dict[socket.socket, _Open] = {}
        self._lock = threading.Lock()
        self._accepting = threading.Thread(
            target=self._accept, name=f"pyshuffle-{name}-accept", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1])

    @property
    def connection_count(self) -> int:
        with self._lock:
            return len(self._connections)

    def start(self) -> int:
        self._accepting.start()
        return self.port

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                sock, address = self._listener.accept()
            except OSError as error:
                if self._stopping.is_set():
                    return  # listener closed by stop_accepting()
                # Out of file descriptors, a connection reset before accept: accept again.
                _LOG.warning("%s: accept failed: %s", self._name, error)
                time.sleep(0.1)
                continue
            try:
                self._admit(sock, address)
            except Exception:  # a thread that cannot start: this connection only
                _LOG.exception("%s: a connection could not be served", self._name)
                self._forget(sock)

    def _admit(self, sock: socket.socket, address: object) -> None:
        host = address[0] if isinstance(address, tuple) else str(address)
        peer = f"{host}:{address[1]}" if isinstance(address, tuple) else host
        with self._lock:
            from_peer = sum(1 for other in self._connections.values() if other.host == host)
            refusal = None
            if len(self._connections) >= self._max_connections:
                refusal = f"the {self._name} serves {self._max_connections} connections at once"
            elif from_peer >= self._max_per_peer:
                refusal = f"the {self._name} serves {self._max_per_peer} connections of one host"
            else:
                self._connections[sock] = _Open(host)
        if refusal is not None:
            _LOG.warning("%s: connection from %s refused: %s", self._name, peer, refusal)
            # A TLS client would read a frame in the clear as a failed handshake: it hears
            # the hang-up, which it tries again.
            with contextlib.suppress(OSError):
                if self._tls is None:
                    sock.settimeout(1.0)
                    refuse(sock, TransportError(f"{refusal}; try again"))
            sock.close()
            return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(
            target=self._connection,
            args=(sock, peer),
            name=f"pyshuffle-{self._name}-connection",
            daemon=True,
        ).start()

    def _connection(self, sock: socket.socket, peer: str) -> None:
        try:
            sock.settimeout(self._handshake_timeout)
            deadline = time.monotonic() + self._handshake_timeout
            try:
                if self._tls is not None:
                    sock = self._start_tls(sock, self._tls, deadline)
                identity = accept_handshake(sock, self._keys, deadline)
                with self._lock:
                    self._connections[sock].identity = identity
            except AuthenticationError:
                self._on_refused(peer)
                raise
            self._serve(sock, peer)
        except AuthenticationError as error:
            _LOG.warning("%s: connection from %s refused: %s", self._name, peer, error)
        except (OSError, ShuffleError) as error:
            _LOG.info("%s: connection from %s ended: %s", self._name, peer, error)
        except Exception:  # a bug serving one peer must not go unlogged
            _LOG.exception("%s: serving %s failed", self._name, peer)
        finally:
            self._forget(sock)

    def _start_tls(
        self, sock: socket.socket, context: ssl.SSLContext, deadline: float
    ) -> socket.socket:
        """``sock`` past the TLS handshake, in its place among the open connections (where
        :meth:`stop` ends it, mid-handshake too)."""
        # A client of this protocol without TLS says nothing until it hears the challenge.
        if not wait_readable(sock, deadline - time.monotonic()):
            refusal = AuthenticationError(
                f"the {self._name} takes TLS connections only: the client sent nothing to"
                " start one (give it the authority's certificate to trust)"
            )
            refuse(sock, refusal)
            raise refusal
        with self._lock:
            secure = TlsSocket.wrap(sock, context, server_side=True)
            self._connections[secure] = self._connections.pop(sock)
        try:
            secure.handshake(deadline)
        except BaseException:
            self._forget(secure)
            raise
        return secure

    def identity_of(self, sock: socket.socket) -> bytes:
        """The identity the client of ``sock``, being served, named (b"" if none)."""
        with self._lock:
            served = self._connections.get(sock)
            return b"" if served is None else served.identity

    def _forget(self, sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()
        with self._lock:
            self._connections.pop(sock, None)

    def stop_accepting(self) -> None:
        """Take no new connection; open ones go on."""
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()

    def stop(self) -> None:
        """Stop accepting and end every connection (their reads and writes fail)."""
        self.stop_accepting()
        with self._lock:
            connections = list(self._connections)
        for sock in connections:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if self._accepting.is_alive():
            self._accepting.join(timeout=5)
