"""The streams a worker has open (pushes and fetches): admitted within a total and a per-peer
cap, so that health checks, commits and other clients always find a handler thread; and
cancelled when idle past a timeout, which frees the thread a silent client holds. A plain
class with the clock passed in; the worker's reaper calls :meth:`OpenStreams.idle`."""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from external_shuffle.wire.errors import TooManyStreamsError

__all__ = ["OpenStreamLimits", "OpenStreams", "peer_host"]


@dataclass(frozen=True, slots=True)
class OpenStreamLimits:
    idle_timeout: float
    max_streams: int
    max_streams_per_peer: int


def peer_host(peer: str) -> str:
    """The host of a gRPC peer string (``ipv4:10.0.0.5:4711``, ``ipv6:[::1]:4711``)."""
    return peer.rsplit(":", 1)[0]


@dataclass
class _Stream:
    host: str
    cancel: Callable[[], object]
    last_active: float


class OpenStreams:
    def __init__(self, limits: OpenStreamLimits, clock: Callable[[], float]) -> None:
        self.limits = limits
        self._clock = clock
        self._streams: dict[int, _Stream] = {}
        self._per_host: Counter[str] = Counter()
        self._ids = itertools.count()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._streams)

    def open(self, peer: str, cancel: Callable[[], object]) -> int:
        """Admit a stream of ``peer`` (``cancel`` ends it); raises TooManyStreamsError past
        a cap. Returns its id, for :meth:`touch` and :meth:`close`."""
        host = peer_host(peer)
        with self._lock:
            if len(self._streams) >= self.limits.max_streams:
                raise TooManyStreamsError(
                    f"the worker has {len(self._streams)} streams open, its most; try again"
                )
            if self._per_host[host] >= self.limits.max_streams_per_peer:
                raise TooManyStreamsError(
                    f"{self._per_host[host]} streams of this client are open, its most; try again"
                )
            stream_id = next(self._ids)
            self._streams[stream_id] = _Stream(host, cancel, self._clock())
            self._per_host[host] += 1
            return stream_id

    def touch(self, stream_id: int) -> None:
        """The stream moved a message: it is not idle."""
        with self._lock:
            stream = self._streams.get(stream_id)
            if stream is not None:
                stream.last_active = self._clock()

    def close(self, stream_id: int) -> None:
        with self._lock:
            stream = self._streams.pop(stream_id, None)
            if stream is not None:
                self._per_host[stream.host] -= 1
                if not self._per_host[stream.host]:
                    del self._per_host[stream.host]

    def idle(self) -> int:
        """Cancel the streams idle past the timeout (they close themselves as their handlers
        end); returns how many."""
        now = self._clock()
        with self._lock:
            idle = [
                stream
                for stream in self._streams.values()
                if now - stream.last_active > self.limits.idle_timeout
            ]
            for stream in idle:
                stream.last_active = now  # cancelled once; its handler closes it
        for stream in idle:
            stream.cancel()
        return len(idle)
