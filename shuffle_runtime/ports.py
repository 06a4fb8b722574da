"""Ports for daemons started on 127.0.0.1 by the local clusters, tests and benchmarks.

A port chosen now and bound later by another process can be taken in between. The kernel hands
out the source port of every outgoing connection from the ephemeral range, and a host running a
Spark job opens many, so ports are drawn from below that range, where only listeners live; a
caller that still loses a race sees :func:`address_in_use` in its daemon's words and draws again.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["address_in_use", "free_ports"]

_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# From 20000: deploy/local-cluster.sh and its tests listen on fixed ports in 19097-19301.
_LOWEST = 20_000
# Linux's default ephemeral range, where the host does not say.
_DEFAULT_EPHEMERAL_LOW = 32_768
_DRAWS_PER_PORT = 50


def _ephemeral_low() -> int:
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _DEFAULT_EPHEMERAL_LOW


def free_ports(count: int, *, draw: random.Random | None = None) -> list[int]:
    """``count`` distinct ports free on 127.0.0.1 now, below the ephemeral range where it has
    room (each probe is held until all are chosen, so none is handed out twice)."""
    draw = draw or random.SystemRandom()
    high = _ephemeral_low()
    probes: list[socket.socket] = []
    try:
        for _ in range(count):
            probes.append(_probe(draw, high))
        return [int(probe.getsockname()[1]) for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def _probe(draw: random.Random, high: int) -> socket.socket:
    for _ in range(_DRAWS_PER_PORT if high > _LOWEST else 0):
        probe = socket.socket()
        try:
            probe.bind(("127.0.0.1", draw.randrange(_LOWEST, high)))
        except OSError:
            probe.close()
            continue
        return probe
    probe = socket.socket()  # no room below the ephemeral range: let the kernel choose
    probe.bind(("127.0.0.1", 0))
    return probe


def address_in_use(text: str) -> bool:
    """Whether a process's words say it could not listen because its port was taken."""
    return "Address already in use" in text  # strerror(EADDRINUSE), as daemons and gRPC say
