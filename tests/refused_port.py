"""A local port that refuses connections for as long as a test needs it."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def refused_port() -> Iterator[int]:
    """A port of 127.0.0.1 bound and not listening: connections to it are refused, and no
    other socket (a daemon's listener, a connection's own end) can take it meanwhile, as it
    could a port released at once."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield held.getsockname()[1]
