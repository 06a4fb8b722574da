"""A worker's open streams in-process, with a clock the tests move: caps in all and per client
host, and idle streams cancelled once."""

from __future__ import annotations

import pytest

from external_shuffle.daemon.streams import OpenStreamLimits, OpenStreams, peer_host
from external_shuffle.wire.errors import TooManyStreamsError


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_caps_in_all_and_per_host_refuse_streams_and_closing_makes_room() -> None:
    streams = OpenStreams(OpenStreamLimits(10.0, max_streams=3, max_streams_per_peer=2), Clock())
    a1 = streams.open("ipv4:10.0.0.1:5001", lambda: None)
    streams.open("ipv4:10.0.0.1:5002", lambda: None)
    with pytest.raises(TooManyStreamsError, match="of this client"):
        streams.open("ipv4:10.0.0.1:5003", lambda: None)
    streams.open("ipv6:[::1]:6000", lambda: None)
    with pytest.raises(TooManyStreamsError, match="its most"):
        streams.open("ipv4:10.0.0.2:5000", lambda: None)
    streams.close(a1)
    streams.open("ipv4:10.0.0.1:5004", lambda: None)
    assert len(streams) == 3


def test_idle_streams_are_cancelled_once_and_active_ones_kept() -> None:
    clock = Clock()
    streams = OpenStreams(OpenStreamLimits(5.0, max_streams=10, max_streams_per_peer=10), clock)
    cancelled: list[str] = []
    idle = streams.open("ipv4:10.0.0.1:1", lambda: cancelled.append("idle"))
    busy = streams.open("ipv4:10.0.0.1:2", lambda: cancelled.append("busy"))
    clock.now = 4.0
    streams.touch(busy)
    clock.now = 6.0
    assert streams.idle() == 1
    assert cancelled == ["idle"]
    assert streams.idle() == 0, "cancelled once; its handler closes it"
    streams.close(idle)
    clock.now = 9.5
    assert streams.idle() == 1
    assert cancelled == ["idle", "busy"]


def test_peer_host_drops_the_port() -> None:
    assert peer_host("ipv4:127.0.0.1:4711") == "ipv4:127.0.0.1"
    assert peer_host("ipv6:[::1]:4711") == "ipv6:[::1]"
