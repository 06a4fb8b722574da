"""TLS on the plain-socket data ports (both services'): contexts from PEM files, and
:class:`TlsSocket`, a connected socket whose bytes travel as TLS records.

Python's own ``ssl.SSLSocket`` lets one OpenSSL connection object be read by one thread while
another writes to it, which OpenSSL does not support; the default service's data port does just
that (a connection's control frames are read while its channels send). A :class:`TlsSocket`
runs the TLS state machine over memory buffers instead, each step under a lock, and moves the
records over the socket itself; its sends are serialized, and so are its receives.

The record layer replaces ``sendfile(2)``: bytes sent from a file pass through this process to
be encrypted (Linux's kernel TLS would avoid it, which Python 3.11's ``ssl`` does not offer).
"""

from __future__ import annotations

import math
import os
import select
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from shuffle_api.errors import AuthenticationError, ConfigError, TransportError

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

__all__ = ["TlsFiles", "TlsSocket", "buffered", "wait_ready"]

# Plaintext bytes encrypted per step, and ciphertext bytes received per step: each bounds what
# one connection holds in its buffers.
_PIECE: Final = 256 << 10


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """Where a process finds its TLS material (PEM files); all empty: plaintext.

    A server presents ``cert_file`` (with ``key_file``); a client trusts the authority in
    ``ca_file`` and, with ``check_hostname``, also needs the server's certificate to name the
    address it connects to."""

    cert_file: str = ""
    key_file: str = ""
    ca_file: str = ""
    check_hostname: bool = True

    @property
    def enabled(self) -> bool:
        return bool(self.cert_file or self.key_file or self.ca_file)

    def server_context(self) -> ssl.SSLContext | None:
        """A context presenting the certificate (None: no file set, plaintext); raises
        ConfigError if it cannot be loaded."""
        if not self.enabled:
            return None
        if not (self.cert_file and self.key_file):
            raise ConfigError("TLS needs a certificate file and its key file to serve")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        # Both ends are pyshuffle's: no older version to speak, and no renegotiation.
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        try:
            context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as error:
            raise ConfigError(
                f"the TLS certificate {self.cert_file!r} with key {self.key_file!r} cannot be"
                f" loaded: {error}"
            ) from error
        return context

    def client_context(self) -> ssl.SSLContext | None:
        """A context trusting the authority (None: no file set, plaintext); raises
        ConfigError if it cannot be loaded."""
        if not self.enabled:
            return None
        if not self.ca_file:
            raise ConfigError("TLS needs the file of the authority that signed the servers")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.check_hostname = self.check_hostname
        try:
            context.load_verify_locations(cafile=self.ca_file)
        except (OSError, ssl.SSLError) as error:
            raise ConfigError(
                f"the TLS authority file {self.ca_file!r} cannot be loaded: {error}"
            ) from error
        return context


def wait_ready(sock: socket.socket, events: int, timeout: float | None) -> bool:
    """Whether ``sock``'s descriptor is ready for ``events`` (``select.POLLIN``, ``POLLOUT``)
    within ``timeout`` seconds (None: no limit); by ``poll``, which takes any descriptor
    number (``select`` fails past 1024)."""
    poller = select.poll()
    poller.register(sock, events)
    return bool(poller.poll(None if timeout is None else max(0, math.ceil(timeout * 1000))))


def buffered(sock: socket.socket) -> bool:
    """Whether ``sock`` holds received bytes that ``select`` on its descriptor does not see
    (a :class:`TlsSocket`'s records already taken off the network)."""
    return isinstance(sock, TlsSocket) and sock.pending() > 0


class TlsSocket(socket.socket):
    """A connected socket speaking TLS, made by :meth:`client`, or by :meth:`wrap` then
    :meth:`handshake`; it takes over a plain connected socket (closed after: this one owns
    the connection).

    Its receives, sends and ``sendfile`` go through TLS, each within the socket's timeout as a
    whole (however many steps on the network it takes, as a plain ``sendall``'s). The
    descriptor itself never blocks: each call waits for it with ``poll`` until its own
    deadline, so a thread reading and one sending do not share a timeout.
    ``shutdown`` and ``close`` act on the connection at once, from any thread. The other
    plain-socket calls (``sendmsg``, ``recvmsg``...) would bypass TLS, and are refused."""

    def __init__(
        self,
        plain: socket.socket,
        tls: ssl.SSLObject,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
    ) -> None:
        self._timeout = plain.gettimeout()
        super().__init__(plain.family, plain.type, plain.proto, fileno=plain.detach())
        super().settimeout(0.0)
        self._tls = tls
        self._incoming = incoming
        self._outgoing = outgoing
        self._tls_lock = threading.Lock()  # each step of the TLS state machine
        self._sending = threading.Lock()  # records leave in the order they were made
        self._receiving = threading.Lock()

    @classmethod
    def wrap(
        cls, plain: socket.socket, context: ssl.SSLContext, *, server_side: bool, host: str = ""
    ) -> TlsSocket:
        """``plain``, before the handshake; ``host``: the name a client checks the server's
        certificate against."""
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = context.wrap_bio(
            incoming, outgoing, server_side=server_side, server_hostname=host or None
        )
        return cls(plain, tls, incoming, outgoing)

    @classmethod
    def client(cls, plain: socket.socket, context: ssl.SSLContext, host: str) -> TlsSocket:
        """``plain`` past the client's side of the handshake, within its timeout; raises
        AuthenticationError if the server is not one ``context`` trusts for ``host``."""
        sock = cls.wrap(plain, context, server_side=False, host=host)
        timeout = sock.gettimeout()
        sock.handshake(None if timeout is None else time.monotonic() + timeout)
        return sock

    def handshake(self, deadline: float | None) -> None:
        """The TLS handshake, done by ``deadline`` (``time.monotonic()``); closes the socket
        and raises AuthenticationError unless it completes: the peer does not speak TLS, or
        (a client's) presents a certificate this side does not trust, or (a server's peer)
        stops. A client whose server hangs up or does not answer in time gets a
        TransportError: a busy or restarting port, to try again."""
        server_side = self._tls.server_side
        peer = "the client" if server_side else f"the data port {self._tls.server_hostname}"
        try:
            while True:
                try:
                    self._tls.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    self._send_records(deadline)
                    if not self._receive_records(deadline):
                        raise EOFError from None
            self._send_records(deadline)
        except ssl.SSLCertVerificationError as error:
            self.close()
            raise AuthenticationError(
                f"{peer} presented a certificate this side does not trust: {error.verify_message}"
            ) from None
        except ssl.SSLError as error:
            self.close()
            raise AuthenticationError(
                f"{peer} did not complete a TLS handshake (is TLS configured on both sides?):"
                f" {error.reason or error}"
            ) from None
        except (EOFError, TimeoutError) as error:
            self.close()
            what = (
                "hung up during the TLS handshake"
                if isinstance(error, EOFError)
                else "did not complete the TLS handshake in time"
            )
            if server_side:
                raise AuthenticationError(f"{peer} {what}") from None
            raise TransportError(f"{peer} {what} (busy or restarting?); try again") from None
        except BaseException:
            self.close()
            raise

    def pending(self) -> int:
        """Bytes received and not yet read (decrypted, or still records)."""
        with self._tls_lock:
            return self._tls.pending() + self._incoming.pending

    def settimeout(self, value: float | None) -> None:
        """What each later call may take (None: no limit), as a plain socket's."""
        self._timeout = value

    def gettimeout(self) -> float | None:
        return self._timeout

    def setblocking(self, flag: bool) -> None:
        self._timeout = None if flag else 0.0

    def _deadline(self) -> float | None:
        """When a call that starts now must end, by the socket's timeout."""
        return None if self._timeout is None else time.monotonic() + self._timeout

    def _wait_for(self, events: int, deadline: float | None) -> None:
        """Until the descriptor is ready for ``events``; TimeoutError past ``deadline``."""
        remaining = None if deadline is None else deadline - time.monotonic()
        if (remaining is not None and remaining <= 0) or not wait_ready(self, events, remaining):
            raise TimeoutError("timed out")

    def _send_plain(self, data: bytes, deadline: float | None) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[super().send(view) :]
            except BlockingIOError:
                self._wait_for(select.POLLOUT, deadline)

    def _send_records(self, deadline: float | None) -> None:
        """Send what the TLS state machine wrote (the caller sends, or handshakes)."""
        with self._tls_lock:
            records = self._outgoing.read()
        if records:
            self._send_plain(records, deadline)

    def _receive_records(self, deadline: float | None) -> bool:
        """Feed the TLS state machine what the network has, waiting for it no later than
        ``deadline``; False at the end of the stream (told to the state machine too)."""
        while True:
            try:
                records = super().recv(_PIECE)
                break
            except BlockingIOError:
                self._wait_for(select.POLLIN, deadline)
        with self._tls_lock:
            if not records:
                self._incoming.write_eof()
                return False
            self._incoming.write(records)
        return True

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        view = memoryview(buffer).cast("B")
        size = min(nbytes or len(view), len(view))
        if size == 0:
            return 0
        with self._receiving:
            deadline = self._deadline()
            while True:
                count = self._decrypt_into(view[:size], deadline)
                if count is not None:
                    return count
                # At the end of the stream, the state machine reports it next.
                self._receive_records(deadline)

    def _decrypt_into(self, view: memoryview, deadline: float | None) -> int | None:
        """Bytes decrypted into ``view`` from the records received (as many as fit, not one
        record a call: a record is 16 KiB); 0 at the end of the stream; None: none yet."""
        count = 0
        ended = False
        with self._tls_lock:
            try:
                while count < len(view):
                    # With a buffer, read returns the count (typeshed says bytes).
                    count += self._tls.read(len(view) - count, view[count:])  # type: ignore[operator]
            except ssl.SSLWantReadError:
                pass
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                ended = True
            answers = self._outgoing.pending
        if answers and self._sending.acquire(blocking=False):
            # What reading made the state machine say (a key update's answer); a sender
            # holding the lock sends it with its own records instead.
            try:
                self._send_records(deadline)
            finally:
                self._sending.release()
        return count if count or ended else None

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        buffer = bytearray(bufsize)
        return bytes(buffer[: self.recv_into(buffer)])

    def sendall(self, data: ReadableBuffer, flags: int = 0) -> None:
        view = memoryview(data).cast("B")
        with self._sending:
            deadline = self._deadline()
            for start in range(0, len(view), _PIECE):
                with self._tls_lock:
                    self._tls.write(view[start : start + _PIECE])
                self._send_records(deadline)
            self._send_records(deadline)  # what a receive made meanwhile

    def send(self, data: ReadableBuffer, flags: int = 0) -> int:
        self.sendall(data)
        return len(memoryview(data).cast("B"))

    def sendfile(self, file: Any, offset: int = 0, count: int | None = None) -> int:
        """``count`` bytes of ``file`` from ``offset`` (to its end if None), read here to be
        encrypted."""
        descriptor = file.fileno()
        end = os.fstat(descriptor).st_size if count is None else offset + count
        sent = 0
        while offset + sent < end:
            piece = os.pread(descriptor, min(_PIECE, end - offset - sent), offset + sent)
            if not piece:
                break
            self.sendall(piece)
            sent += len(piece)
        return sent

    def _plain_only(self, *args: Any, **kwargs: Any) -> Any:
        raise OSError("not on a TLS connection: use send, sendall, recv, recv_into or sendfile")

    # Each would move bytes around TLS.
    sendmsg = sendto = recvmsg = recvmsg_into = recvfrom = recvfrom_into = _plain_only
    makefile = _plain_only
