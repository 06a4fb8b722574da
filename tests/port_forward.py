"""A TCP forwarder to one address, as `kubectl port-forward` gives an operator: the only route
from a client to a cluster (tests name its port in the client's config)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

_PIECE = 64 * 1024


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while piece := source.recv(_PIECE):
            sink.sendall(piece)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


def _serve(listener: socket.socket, target: tuple[str, int]) -> None:
    with contextlib.suppress(OSError):  # the listener closed: the forward ends
        while True:
            client, _ = listener.accept()
            upstream = socket.create_connection(target)
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(source, sink), daemon=True).start()


@contextlib.contextmanager
def port_forward(target: str) -> Iterator[int]:
    """A port on 127.0.0.1 forwarded to ``target`` (host:port) while in the block."""
    host, _, port = target.rpartition(":")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        threading.Thread(target=_serve, args=(listener, (host, int(port))), daemon=True).start()
        yield int(listener.getsockname()[1])
