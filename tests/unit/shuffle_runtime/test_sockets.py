"""AuthenticatedListener on real sockets: where it listens, the bounds an unauthenticated peer
meets (a handshake deadline that trickled bytes cannot stretch, a cap per host), and clients
that name whose secret they prove."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from shuffle_api import AuthenticationError, DataTooLargeError, TransportError
from shuffle_runtime.sockets import (
    CHALLENGE,
    REFUSED,
    AuthenticatedListener,
    FrameReader,
    frame_bytes,
    open_connection,
    open_handshake,
    read_frame,
)
from tests.eventually import eventually

SECRET = b"s" * 32


@contextmanager
def _listening(host: str = "127.0.0.1", **limits: float) -> Iterator[tuple[int, list[str]]]:
    """A listener whose connections echo one byte; yields its port and the peers served."""
    served: list[str] = []

    def serve(sock: socket.socket, peer: str) -> None:
        served.append(peer)
        sock.settimeout(5)
        sock.sendall(sock.recv(1))

    listener = AuthenticatedListener(
        host,
        0,
        secret=SECRET,
        max_connections=int(limits.get("max_connections", 8)),
        max_connections_per_peer=int(limits.get("per_peer", 8)),
        handshake_timeout=limits.get("handshake_timeout", 5.0),
        serve=serve,
        name="test port",
    )
    port = listener.start()
    try:
        yield port, served
    finally:
        listener.stop()


def _echo(host: str, port: int) -> bytes:
    with socket.create_connection((host, port), timeout=5) as sock:
        open_handshake(sock, SECRET, "the test port")
        sock.sendall(b"x")
        return sock.recv(1)


def test_an_ipv6_wildcard_host_serves_ipv4_and_ipv6_peers() -> None:
    with _listening("::") as (port, served):
        assert _echo("127.0.0.1", port) == b"x"
        assert _echo("::1", port) == b"x"
    assert len(served) == 2


def test_a_handshake_trickled_byte_by_byte_is_cut_at_its_deadline() -> None:
    with _listening(handshake_timeout=1.0) as (port, served):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            frame = read_frame(sock, 1024)
            assert frame is not None and frame[0] == CHALLENGE
            started = time.monotonic()
            refused = None
            # An AUTH frame's prefix announces 64 bytes; they come one every 0.3 s.
            sock.sendall(b"\x00\x00\x00\x40\x09")
            for _ in range(40):
                try:
                    sock.sendall(b"a")
                except OSError:
                    break
                time.sleep(0.3)
                sock.settimeout(0.01)
                try:
                    refused = read_frame(sock, 1 << 20)
                    break
                except TimeoutError:
                    continue
                finally:
                    sock.settimeout(10)
            assert refused is not None and refused[0] == REFUSED
            assert time.monotonic() - started < 5  # a ceiling, not a measure
        assert served == []


def test_connections_of_one_host_beyond_its_cap_are_refused() -> None:
    with _listening(per_peer=2) as (port, _):
        held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(2)]
        try:
            for sock in held:
                frame = read_frame(sock, 1024)
                assert frame is not None and frame[0] == CHALLENGE
            with socket.create_connection(("127.0.0.1", port), timeout=5) as third:
                frame = read_frame(third, 1 << 20)
                assert frame is not None and frame[0] == REFUSED
                assert b"of one host" in bytes(frame[1])
        finally:
            for sock in held:
                sock.close()
        deadline = time.monotonic() + 5
        while True:  # the held ones gone, the host is served again
            try:
                assert _echo("127.0.0.1", port) == b"x"
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


def test_a_wrong_secret_is_counted_and_refused() -> None:
    refused: list[str] = []
    listener = AuthenticatedListener(
        "127.0.0.1",
        0,
        secret=SECRET,
        max_connections=4,
        handshake_timeout=5.0,
        serve=lambda sock, peer: None,
        name="test port",
        on_refused=refused.append,
    )
    port = listener.start()
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as sock,
            pytest.raises(AuthenticationError, match="wrong secret"),
        ):
            open_handshake(sock, b"another secret", "the test port")
        eventually(lambda: bool(refused), "the wrong secret counted", timeout=5)
        assert len(refused) == 1 and refused[0].startswith("127.0.0.1:")
    finally:
        listener.stop()


def test_a_client_named_identity_is_proved_with_the_key_the_listener_gives_it() -> None:
    keys = {b"alice": b"alice's key"}
    served: list[bytes] = []

    def key_of(identity: bytes) -> bytes:
        if identity not in keys:
            raise AuthenticationError(f"unknown identity {identity!r}")
        return keys[identity]

    def serve(sock: socket.socket, peer: str) -> None:
        served.append(listener.identity_of(sock))

    listener = AuthenticatedListener(
        "127.0.0.1",
        0,
        secret=b"",
        max_connections=4,
        handshake_timeout=5,
        serve=serve,
        name="test port",
        keys=key_of,
    )
    port = listener.start()
    try:
        open_connection(
            "127.0.0.1", port, secret=b"alice's key", timeout=5, identity=b"alice"
        ).close()
        for secret, identity in ((b"alice's key", b"bob"), (b"bob's guess", b"alice")):
            with pytest.raises(AuthenticationError, match="refused"):
                open_connection("127.0.0.1", port, secret=secret, timeout=5, identity=identity)
    finally:
        listener.stop()
    assert served == [b"alice"]
    # A listener of one secret takes no identity.
    with (
        _listening() as (port, _),
        pytest.raises(AuthenticationError, match="takes no identity"),
    ):
        open_connection("127.0.0.1", port, secret=SECRET, timeout=5, identity=b"alice")


def test_a_frame_reader_reads_frames_that_span_receives_and_its_buffer() -> None:
    """Many small frames in one send, one split across sends, a body larger than the buffer,
    and bytes after a frame partly buffered."""
    small = [frame_bytes(3, bytes([number]) * number) for number in range(1, 40)]
    large = bytes(range(256)) * 10  # 2,560 bytes: more than the 1 KiB buffer
    payload = bytes(range(200)) * 20
    wire = b"".join(small) + frame_bytes(4, large) + frame_bytes(5, b"hdr") + payload
    first, second = socket.socketpair()
    with first, second:
        # Sent in pieces that cut frames at odd places.
        for start in range(0, len(wire), 777):
            first.sendall(wire[start : start + 777])
        first.close()
        frames = FrameReader(second, buffer_size=1024)
        for number in range(1, 40):
            assert frames.read_frame(1 << 20) == (3, bytes([number]) * number)
        assert frames.read_frame(1 << 20) == (4, large)
        assert frames.read_frame(1 << 20) == (5, b"hdr")
        received = bytearray(len(payload))
        frames.receive_into(memoryview(received))
        assert bytes(received) == payload
        frames.check_drained()
        assert frames.read_frame(1 << 20) is None  # the peer closed between frames


def test_a_frame_reader_refuses_a_large_frame_a_cut_frame_and_bytes_after_the_answer() -> None:
    first, second = socket.socketpair()
    with first, second:
        first.sendall(frame_bytes(3, b"x" * 100))
        with pytest.raises(DataTooLargeError):
            FrameReader(second).read_frame(99)
    for cut in (50, 5):  # inside the body; right after the prefix
        first, second = socket.socketpair()
        with first, second:
            first.sendall(frame_bytes(3, b"x" * 100)[:cut])
            first.close()
            with pytest.raises(TransportError, match="middle of a frame"):
                FrameReader(second).read_frame(1 << 20)
    first, second = socket.socketpair()
    with first, second:
        first.sendall(frame_bytes(3, b"answer") + b"more")
        frames = FrameReader(second)
        assert frames.read_frame(1 << 20) == (3, b"answer")
        with pytest.raises(TransportError, match="4 bytes arrived after"):
            frames.check_drained()
