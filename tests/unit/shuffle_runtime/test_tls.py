"""TLS on the plain-socket data ports, on real sockets: TlsSocket carries bytes both ways at
once (one thread reading while others send, as the default service's data port does) and from
files; an untrusted or misnamed server, a plaintext client and a plaintext server are refused
with AuthenticationError; the listener counts the refusals."""

from __future__ import annotations

import hashlib
import os
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trustme

from shuffle_api import AuthenticationError, ConfigError
from shuffle_runtime.connections import ConnectionPool
from shuffle_runtime.sockets import (
    AUTH,
    CHALLENGE,
    REFUSED,
    AuthenticatedListener,
    open_connection,
    open_handshake,
    read_frame,
    wait_readable,
    write_frame,
)
from shuffle_runtime.tls import TlsFiles, TlsSocket, buffered
from tests.eventually import eventually
from tests.tls_files import write_tls_files

SECRET = b"s" * 32


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return write_tls_files(tmp_path_factory.mktemp("tls"))


@contextmanager
def _tls_pair(
    server: ssl.SSLContext | None, client: ssl.SSLContext | None, name: str = "127.0.0.1"
) -> Iterator[tuple[TlsSocket, TlsSocket]]:
    """Both ends of one TLS connection on 127.0.0.1."""
    assert server is not None and client is not None, "the files make both contexts"
    with socket.create_server(("127.0.0.1", 0)) as listener:
        accepted: list[TlsSocket | BaseException] = []

        def accept() -> None:
            plain, _ = listener.accept()
            plain.settimeout(10)
            try:
                far = TlsSocket.wrap(plain, server, server_side=True)
                far.handshake(time.monotonic() + 10)
                accepted.append(far)
            except BaseException as error:
                accepted.append(error)

        thread = threading.Thread(target=accept)
        thread.start()
        plain = socket.create_connection(listener.getsockname(), timeout=10)
        try:
            near = TlsSocket.client(plain, client, name)
        finally:
            thread.join()
        far = accepted[0]
        if isinstance(far, BaseException):
            near.close()
            raise far
        try:
            yield near, far
        finally:
            near.close()
            far.close()


def _receive(sock: socket.socket, size: int) -> bytes:
    buffer = bytearray(size)
    view = memoryview(buffer)
    received = 0
    while received < size:
        count = sock.recv_into(view[received:])
        assert count, f"the stream ended after {received} of {size} bytes"
        received += count
    return bytes(buffer)


def test_bytes_cross_both_ways_at_once_from_several_senders(files: TlsFiles) -> None:
    upstream = os.urandom(6 << 20)
    message = 64 << 10
    messages = 48  # per sender
    with _tls_pair(files.server_context(), files.client_context()) as (client, server):
        got: dict[str, bytes] = {}

        def send_down(sender: int) -> None:
            # Senders share the connection, as a data port's channels do; each message whole.
            for sequence in range(messages):
                server.sendall(bytes([sender, sequence]) * (message // 2))

        def read_down() -> None:
            got["down"] = _receive(client, 2 * messages * message)

        def read_up() -> None:
            got["up"] = _receive(server, len(upstream))  # while the same socket sends

        threads = [
            threading.Thread(target=send_down, args=(0,)),
            threading.Thread(target=send_down, args=(1,)),
            threading.Thread(target=read_down),
            threading.Thread(target=read_up),
        ]
        for thread in threads:
            thread.start()
        client.sendall(upstream)
        for thread in threads:
            thread.join()
    assert hashlib.sha256(got["up"]).digest() == hashlib.sha256(upstream).digest()
    down = got["down"]
    received = [down[start : start + message] for start in range(0, len(down), message)]
    for sender in (0, 1):
        # Every message intact, each sender's in its order.
        own = [chunk for chunk in received if chunk[0] == sender]
        assert own == [bytes([sender, sequence]) * (message // 2) for sequence in range(messages)]


def test_sendfile_sends_the_range_and_the_peer_sees_the_end(
    files: TlsFiles, tmp_path: Path
) -> None:
    content = os.urandom(1 << 20)
    path = tmp_path / "data"
    path.write_bytes(content)
    with _tls_pair(files.server_context(), files.client_context()) as (client, server):
        with path.open("rb") as file:
            assert server.sendfile(file, 1000, 500_000) == 500_000
        assert _receive(client, 500_000) == content[1000:501_000]
        server.shutdown(socket.SHUT_RDWR)
        assert client.recv_into(bytearray(10)) == 0
        with pytest.raises(OSError, match="not on a TLS connection"):
            client.sendmsg([b"x"])


def test_frames_kept_in_the_tls_buffers_count_as_readable(files: TlsFiles) -> None:
    with _tls_pair(files.server_context(), files.client_context()) as (client, server):
        server.sendall(b"".join(bytes([index]) * 100 for index in range(3)))
        assert _receive(client, 100) == b"\x00" * 100
        assert buffered(client)  # select would wait: the rest already left the network
        assert _receive(client, 200) == b"\x01" * 100 + b"\x02" * 100
        assert not buffered(client)


def test_a_server_the_authority_did_not_sign_is_refused(files: TlsFiles) -> None:
    stranger = trustme.CA()
    trusting_stranger = ssl.create_default_context(cadata=stranger.cert_pem.bytes().decode())
    with (
        pytest.raises(AuthenticationError, match="does not trust"),
        _tls_pair(files.server_context(), trusting_stranger),
    ):
        pass


def test_a_certificate_naming_another_host_is_refused_unless_names_are_not_checked(
    files: TlsFiles,
) -> None:
    with (
        pytest.raises(AuthenticationError, match="does not trust"),
        _tls_pair(files.server_context(), files.client_context(), name="other.example"),
    ):
        pass
    unchecked = TlsFiles(ca_file=files.ca_file, check_hostname=False).client_context()
    with _tls_pair(files.server_context(), unchecked, name="other.example") as (client, server):
        client.sendall(b"hello")
        assert _receive(server, 5) == b"hello"


def test_missing_or_unreadable_files_are_config_errors(tmp_path: Path) -> None:
    assert TlsFiles().server_context() is None and TlsFiles().client_context() is None
    with pytest.raises(ConfigError, match="certificate file and its key"):
        TlsFiles(ca_file="x").server_context()
    with pytest.raises(ConfigError, match="cannot be loaded"):
        TlsFiles(cert_file=str(tmp_path / "none"), key_file=str(tmp_path / "none")).server_context()
    with pytest.raises(ConfigError, match="cannot be loaded"):
        TlsFiles(ca_file=str(tmp_path / "none")).client_context()


@contextmanager
def _listening(server: ssl.SSLContext | None) -> Iterator[tuple[int, list[str], list[str]]]:
    """An echoing AuthenticatedListener; yields its port, the peers served and refused."""
    served: list[str] = []
    refused: list[str] = []

    def serve(sock: socket.socket, peer: str) -> None:
        served.append(peer)
        while (frame := read_frame(sock, 1 << 20)) is not None:
            write_frame(sock, frame[0], bytes(frame[1]))

    listener = AuthenticatedListener(
        "127.0.0.1",
        0,
        secret=SECRET,
        max_connections=8,
        handshake_timeout=1.0,
        serve=serve,
        name="test port",
        on_refused=refused.append,
        tls=server,
    )
    port = listener.start()
    try:
        yield port, served, refused
    finally:
        listener.stop()


def test_pooled_connections_run_the_secret_handshake_inside_tls(files: TlsFiles) -> None:
    with _listening(files.server_context()) as (port, served, refused):
        pool = ConnectionPool(SECRET, tls=files.client_context())
        for _ in range(2):  # the second exchange reuses the connection
            connection = pool.connect("127.0.0.1", port, timeout=5)
            assert isinstance(connection.sock, TlsSocket)
            write_frame(connection.sock, 42, b"x" * 100_000)
            assert read_frame(connection.sock, 1 << 20) == (42, memoryview(b"x" * 100_000))
            pool.give_back(connection)
        pool.close()
        with pytest.raises(AuthenticationError, match="wrong secret"):
            open_connection(
                "127.0.0.1", port, secret=b"w" * 32, timeout=5, tls=files.client_context()
            )
        # The client reads the refusal before the listener's thread records it.
        eventually(lambda: len(refused) == 1, "the wrong secret counted", timeout=5)
    assert len(served) == 1
    assert len(refused) == 1  # the wrong secret, inside TLS


def test_a_plaintext_client_is_told_the_port_takes_tls_and_counted(files: TlsFiles) -> None:
    with _listening(files.server_context()) as (port, served, refused):
        with (
            socket.create_connection(("127.0.0.1", port), timeout=10) as sock,
            pytest.raises(AuthenticationError, match="takes TLS connections only"),
        ):
            open_handshake(sock, SECRET, "the test port")
        # A client that speaks first, not TLS.
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
            assert sock.recv(100) == b""
        eventually(lambda: len(refused) >= 2, "both refusals counted", timeout=5)
    assert not served
    assert len(refused) == 2


def test_a_peer_trickling_its_proof_inside_tls_is_cut_at_the_handshake_deadline(
    files: TlsFiles,
) -> None:
    with _listening(files.server_context()) as (port, served, refused):
        plain = socket.create_connection(("127.0.0.1", port), timeout=10)
        trusting = files.client_context()
        assert trusting is not None
        with TlsSocket.client(plain, trusting, "127.0.0.1") as sock:
            frame = read_frame(sock, 1024)
            assert frame is not None and frame[0] == CHALLENGE
            started = time.monotonic()
            sock.sendall(b"\x00\x00\x00\x40" + bytes([AUTH]))  # 64 bytes, one at a time
            answer: tuple[int, memoryview] | None = None
            for _ in range(30):
                try:
                    sock.sendall(b"a")
                    if wait_readable(sock, 0.3):
                        answer = read_frame(sock, 4096)  # its refusal, then the end
                        cut = answer is None or read_frame(sock, 4096) is None
                        break
                except OSError:  # the hang-up reached this side before its refusal
                    cut = True
                    break
            else:
                cut = False
            elapsed = time.monotonic() - started
    assert cut and elapsed < 5, elapsed  # the listener's handshake timeout is 1 s: a ceiling
    assert answer is None or answer[0] == REFUSED
    assert refused and not served


def test_a_busy_tls_port_is_a_connection_to_try_again_not_an_authentication_failure(
    files: TlsFiles,
) -> None:
    def hold(sock: socket.socket, peer: str) -> None:
        sock.recv(1)  # the connection, until a byte or the end

    listener = AuthenticatedListener(
        "127.0.0.1",
        0,
        secret=SECRET,
        max_connections=1,
        handshake_timeout=5.0,
        serve=hold,
        name="test port",
        tls=files.server_context(),
    )
    port = listener.start()
    try:
        held = open_connection(
            "127.0.0.1", port, secret=SECRET, timeout=5, tls=files.client_context()
        )
        with pytest.raises(OSError) as refusal:
            open_connection("127.0.0.1", port, secret=SECRET, timeout=5, tls=files.client_context())
        # ConnectionResetError, or TransportError: both are retried; an AuthenticationError
        # would not be.
        assert not isinstance(refusal.value, AuthenticationError)
        held.close()
    finally:
        listener.stop()


def test_a_tls_client_of_a_plaintext_port_is_refused(files: TlsFiles) -> None:
    with (
        _listening(None) as (port, served, _),
        pytest.raises(AuthenticationError, match="TLS handshake"),
    ):
        open_connection("127.0.0.1", port, secret=SECRET, timeout=5, tls=files.client_context())
    assert not served
