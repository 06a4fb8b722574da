"""Dropping TCP connections on this host as a network fault does: every established connection
to some ports aborted at once, on both ends, with ``ss -K`` (the kernel's SOCK_DESTROY, which
needs CAP_NET_ADMIN and a kernel built with it)."""

from __future__ import annotations

import logging
import socket
import subprocess
from collections.abc import Sequence
from typing import Final

__all__ = ["abort_connections", "can_abort_connections"]

_LOG = logging.getLogger(__name__)
_SS_TIMEOUT_SECONDS: Final = 30.0
_PROBE_SECONDS: Final = 2.0


def abort_connections(ports: Sequence[int]) -> int:
    """Abort every established TCP connection from or to ``ports``; how many sockets were
    destroyed (a peer on this host is reset by its end's destruction, so a connection counts
    once or twice)."""
    if not ports:
        return 0
    ends = " or ".join(f"sport = :{port} or dport = :{port}" for port in ports)
    answer = subprocess.run(
        ["ss", "-K", "-t", "-n", "-H", "state", "established", f"( {ends} )"],
        capture_output=True,
        text=True,
        timeout=_SS_TIMEOUT_SECONDS,
        check=False,
    )
    if answer.returncode != 0:
        raise OSError(f"ss -K failed: {answer.stderr.strip()}")
    return sum(1 for line in answer.stdout.splitlines() if line.strip())


def can_abort_connections() -> bool:
    """Whether :func:`abort_connections` works here, tried on a connection of its own (``ss``
    answers 0 also where the kernel cannot destroy sockets)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=_PROBE_SECONDS) as client:
            accepted, _ = server.accept()
            with accepted:
                try:
                    abort_connections([port])
                    client.sendall(b"?")
                    client.recv(1)  # an aborted socket raises; a live one waits, then times out
                except ConnectionError:
                    return True
                except (OSError, subprocess.TimeoutExpired) as error:
                    _LOG.info("connections cannot be dropped here: %s", error)
                return False
