"""The connection pool of data-port clients, against a real authenticated listener on
127.0.0.1 that answers each request with a few frames."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from shuffle_api import AuthenticationError, TransportError
from shuffle_runtime.connections import Connection, ConnectionPool, StaleConnectionError
from shuffle_runtime.sockets import AuthenticatedListener, read_frame, write_frame
from tests.eventually import eventually

SECRET = b"s" * 32
REQUEST, ANSWER, END = 20, 21, 22


class EchoPort:
    """Answers each request frame with three ANSWER frames and an END; with
    ``close_after``, hangs up after that many requests on a connection; with
    ``silent_after``, hangs up on the next request after that many, unanswered."""

    def __init__(self, close_after: int | None = None, silent_after: int | None = None) -> None:
        self.close_after = close_after
        self.silent_after = silent_after
        self.connections = 0
        self.requests = 0
        self._lock = threading.Lock()
        self.listener = AuthenticatedListener(
            "127.0.0.1",
            0,
            secret=SECRET,
            max_connections=8,
            handshake_timeout=5,
            serve=self._serve,
            name="test port",
        )
        self.listener.start()

    def _serve(self, sock: socket.socket, peer: str) -> None:
        with self._lock:
            self.connections += 1
        served = 0
        sock.settimeout(10)
        while (frame := read_frame(sock, 1024)) is not None:
            if self.silent_after is not None and served >= self.silent_after:
                return
            with self._lock:
                self.requests += 1
            for piece in range(3):
                write_frame(sock, ANSWER, bytes(frame[1]) + bytes([piece]))
            write_frame(sock, END, b"")
            served += 1
            if self.close_after is not None and served >= self.close_after:
                return


@pytest.fixture
def port() -> Iterator[EchoPort]:
    made = EchoPort()
    yield made
    made.listener.stop()


def ask(body: bytes) -> Callable[[Connection], Iterator[bytes]]:
    def run(connection: Connection) -> Iterator[bytes]:
        write_frame(connection.sock, REQUEST, body)
        first = True
        while True:
            frame = read_frame(connection.sock, 1024)
            if frame is None:
                if first:
                    raise StaleConnectionError("hung up before answering")
                raise TransportError("hung up mid-answer")
            first = False
            if frame[0] == END:
                return
            yield bytes(frame[1])

    return run


def request(
    pool: ConnectionPool, port: EchoPort, body: bytes, take: int | None = None
) -> list[bytes]:
    connection = pool.connect("127.0.0.1", port.listener.port, timeout=5)
    answers = pool.exchange(
        connection,
        run=ask(body),
        reconnect=lambda: pool.connect("127.0.0.1", port.listener.port, timeout=5, fresh=True),
    )
    if take is None:
        return list(answers)
    got = [next(answers) for _ in range(take)]
    answers.close()
    return got


def test_requests_to_one_port_share_one_connection(port: EchoPort) -> None:
    pool = ConnectionPool(SECRET)
    for number in range(5):
        assert request(pool, port, bytes([number])) == [bytes([number, p]) for p in range(3)]
    assert (port.connections, port.requests, pool.idle_count) == (1, 5, 1)
    pool.close()
    assert pool.idle_count == 0


def test_a_connection_the_server_closed_while_idle_is_replaced() -> None:
    port = EchoPort(close_after=1)
    try:
        pool = ConnectionPool(SECRET)
        for number in range(4):
            assert request(pool, port, bytes([number]))[0] == bytes([number, 0])
        assert port.connections == 4
        pool.close()
    finally:
        port.listener.stop()


def test_a_reused_connection_closed_before_its_answer_is_replaced_by_the_callers_connect() -> None:
    port = EchoPort(silent_after=1)
    pool = ConnectionPool(SECRET)
    address = ("127.0.0.1", port.listener.port)
    try:
        assert request(pool, port, b"a")[0] == b"a\x00"
        # The idle connection reads as open; the server hangs up on its next request.
        answers = pool.exchange(
            pool.connect(*address, timeout=5),
            run=ask(b"b"),
            reconnect=lambda: pool.connect(*address, timeout=5, fresh=True),
        )
        assert list(answers) == [b"b\x00", b"b\x01", b"b\x02"]
        assert port.connections == 2

        def refused() -> Connection:
            raise LookupError("the caller's own error")

        answers = pool.exchange(pool.connect(*address, timeout=5), run=ask(b"c"), reconnect=refused)
        with pytest.raises(LookupError, match="caller's own"):
            list(answers)
    finally:
        pool.close()
        port.listener.stop()


def test_an_answer_abandoned_midway_closes_its_connection(port: EchoPort) -> None:
    pool = ConnectionPool(SECRET)
    assert request(pool, port, b"a", take=1) == [b"a\x00"]
    assert pool.idle_count == 0
    assert request(pool, port, b"b") == [b"b\x00", b"b\x01", b"b\x02"]
    assert port.connections == 2


def test_idle_connections_expire_and_are_bounded_per_address(port: EchoPort) -> None:
    now = [0.0]
    pool = ConnectionPool(SECRET, max_idle_per_address=1, max_idle_seconds=5, clock=lambda: now[0])
    first = pool.connect("127.0.0.1", port.listener.port, timeout=5)
    second = pool.connect("127.0.0.1", port.listener.port, timeout=5)
    pool.give_back(first)
    pool.give_back(second)  # one idle per address: closed
    assert pool.idle_count == 1
    assert second.sock.fileno() == -1
    now[0] = 6.0
    assert request(pool, port, b"x")[0] == b"x\x00"  # the expired one is not reused
    assert first.sock.fileno() == -1
    # The second connection never asked anything: its server thread counts it when it runs.
    eventually(lambda: port.connections == 3, "three connections served", timeout=5)


def test_a_connection_given_back_after_close_is_closed(port: EchoPort) -> None:
    pool = ConnectionPool(SECRET)
    connection = pool.connect("127.0.0.1", port.listener.port, timeout=5)
    pool.close()
    pool.give_back(connection)
    assert pool.idle_count == 0
    assert connection.sock.fileno() == -1


def test_a_wrong_secret_fails_the_handshake(port: EchoPort) -> None:
    with pytest.raises(AuthenticationError):
        ConnectionPool(b"w" * 32).connect("127.0.0.1", port.listener.port, timeout=5)
