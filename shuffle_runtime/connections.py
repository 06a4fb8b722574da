"""Authenticated data-port connections kept open between requests.

A reducer reads one partition after another from the same few data ports. Opening a connection
for each (TCP connect, the handshake's round trips and HMACs, a thread on the server) costs
more than reading a small block, so a client process keeps a few idle connections per port and
sends its next request on one of them, as Spark's block fetches and Flink's netty clients do.

A connection goes back to the pool only after a whole exchange (the request answered to its
end): one abandoned mid-answer still has bytes in flight and is closed. An idle connection the
server has closed meanwhile (its idle timeout, a restart) is noticed before reuse where it can
be (the socket reads as closed); where it cannot, the request fails with nothing received and
:meth:`ConnectionPool.exchange` asks again on a new connection.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Final, TypeVar

from shuffle_api.errors import TransportError
from shuffle_runtime.sockets import open_connection, wait_readable

__all__ = ["SERVER_KEEP_ALIVE_SECONDS", "Connection", "ConnectionPool", "StaleConnectionError"]

T = TypeVar("T")

MAX_IDLE_PER_ADDRESS: Final = 1
"""Enough for a reader's one request at a time; each idle one holds a thread and a connection
of the server's caps."""
MAX_IDLE_SECONDS: Final = 5.0
"""Well under any server's idle timeout, so that the client closes first."""
SERVER_KEEP_ALIVE_SECONDS: Final = 2 * MAX_IDLE_SECONDS
"""How long a data port keeps a reader's connection waiting for its next request: longer than
the reader keeps it idle, and short, as each one held counts against the port's caps."""


class StaleConnectionError(TransportError):
    """The server closed a connection before answering anything on it: a reused one it had
    closed while idle. Nothing was read."""


@dataclass(eq=False)
class Connection:
    """One authenticated connection to ``host:port``; ``reused``: it served a request before."""

    sock: socket.socket
    host: str
    port: int
    reused: bool = False
    requests: int = 0
    """Requests sent on it so far (a protocol may number each request's channel by it)."""
    idle_since: float = field(default=0.0, repr=False)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def _reads_as_closed(sock: socket.socket) -> bool:
    """Whether an idle connection has anything to read: end of stream (the server closed it)
    or bytes nobody asked for. Either way it cannot take a request."""
    try:
        return wait_readable(sock, 0)
    except (OSError, ValueError):
        return True


class ConnectionPool:
    """Connections to data ports that prove ``secret`` (``identity``: whose, to a port that
    keys clients by it), by address; thread-safe. ``tls``: the
    context trusting the data ports' certificates (None: plaintext). ``clock``: seconds,
    monotonic."""

    def __init__(
        self,
        secret: bytes,
        *,
        identity: bytes = b"",
        tls: ssl.SSLContext | None = None,
        max_idle_per_address: int = MAX_IDLE_PER_ADDRESS,
        max_idle_seconds: float = MAX_IDLE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._secret = secret
        self._identity = identity
        self._tls = tls
        self._max_idle_per_address = max_idle_per_address
        self._max_idle_seconds = max_idle_seconds
        self._clock = clock
        self._idle: dict[str, deque[Connection]] = {}
        self._lock = threading.Lock()
        self._closed = False

    @property
    def idle_count(self) -> int:
        with self._lock:
            return sum(len(idle) for idle in self._idle.values())

    def connect(self, host: str, port: int, *, timeout: float, fresh: bool = False) -> Connection:
        """An idle connection to ``host:port`` that still reads as open, else (or when
        ``fresh``) a new one: connected within ``timeout`` and past the handshake. The
        errors of connecting (``OSError``) and of the handshake (``ShuffleError``) are the
        caller's to name."""
        address = f"{host}:{port}"
        if not fresh:
            while (idle := self._take_idle(address)) is not None:
                if not _reads_as_closed(idle.sock):
                    idle.reused = True
                    return idle
                idle.close()
        sock = open_connection(
            host, port, secret=self._secret, timeout=timeout, tls=self._tls, identity=self._identity
        )
        return Connection(sock, host, port)

    def _take_idle(self, address: str) -> Connection | None:
        with self._lock:
            self._expire()
            idle = self._idle.get(address)
            return idle.pop() if idle else None

    def give_back(self, connection: Connection) -> None:
        """``connection``, its exchange done to the end, for the next request to its address
        (closed instead if the pool is closed or holds enough for that address)."""
        connection.idle_since = self._clock()
        with self._lock:
            self._expire()
            idle = self._idle.setdefault(connection.address, deque())
            if not self._closed and len(idle) < self._max_idle_per_address:
                idle.append(connection)
                return
        connection.close()

    def _expire(self) -> None:
        """Close connections idle for too long (under the lock)."""
        oldest = self._clock() - self._max_idle_seconds
        for address in list(self._idle):
            idle = self._idle[address]
            while idle and idle[0].idle_since < oldest:
                idle.popleft().close()
            if not idle:
                del self._idle[address]

    def exchange(
        self,
        connection: Connection,
        *,
        run: Callable[[Connection], Iterator[T]],
        reconnect: Callable[[], Connection],
    ) -> Generator[T, None, None]:
        """What ``run`` yields of one request on ``connection`` (from :meth:`connect`), the
        connection given back once ``run`` ends, closed if it fails or is abandoned. A reused
        connection that ``run`` finds closed before it yielded anything
        (:class:`StaleConnectionError`) is replaced, once, by ``reconnect()``: the caller's
        own :meth:`connect` with ``fresh``, whose errors it names as for the first one."""
        while True:
            connection.requests += 1
            produced = False
            try:
                for item in run(connection):
                    produced = True
                    yield item
            except StaleConnectionError:
                connection.close()
                if not connection.reused or produced:
                    raise
                connection = reconnect()
                continue
            except BaseException:
                connection.close()
                raise
            self.give_back(connection)
            return

    def close(self) -> None:
        """Close every idle connection; those given back later are closed too."""
        with self._lock:
            self._closed = True
            idle = [connection for queue in self._idle.values() for connection in queue]
            self._idle.clear()
        for connection in idle:
            connection.close()
