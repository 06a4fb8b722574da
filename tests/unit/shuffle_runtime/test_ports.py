"""Ports drawn for local daemons: distinct, free, and below the range the kernel hands out to
outgoing connections."""

from __future__ import annotations

import random
import socket
from pathlib import Path

from shuffle_runtime.ports import address_in_use, free_ports

EPHEMERAL_LOW = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def test_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    ports = free_ports(40)
    assert len(set(ports)) == 40
    assert all(port < EPHEMERAL_LOW for port in ports)
    listeners = [socket.create_server(("127.0.0.1", port)) for port in ports]
    for listener in listeners:
        listener.close()


def test_a_port_in_use_is_never_drawn() -> None:
    draw = random.Random(7)
    [first] = free_ports(1, draw=random.Random(7))
    with socket.create_server(("127.0.0.1", first)):
        # The same draws again: the first lands on the port held, and another is chosen.
        [second] = free_ports(1, draw=draw)
    assert second != first


def test_a_daemon_that_lost_its_port_is_told_apart() -> None:
    assert address_in_use("[Errno 98] Address already in use (while attempting to bind")
    assert not address_in_use("ConfigError: unknown key 'external-shuffle.worker.prot'")
