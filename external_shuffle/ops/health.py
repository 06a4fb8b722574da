"""``/healthz`` and ``/readyz``: a daemon's answers to probes over HTTP (Kubernetes' liveness and
readiness probes, a container's HEALTHCHECK) on each HTTP port it serves (/metrics' and the
status page's). They need no token, and say no more than "ok" or why the daemon is not ready.

``/healthz`` is 200 while the process serves HTTP at all; ``/readyz`` is 200 only while the
daemon serves its roles (see :class:`Readiness`), else 503 with a one-line reason.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from http import HTTPStatus
from typing import Final

__all__ = ["PROBE_HEADERS", "ProbeAnswer", "Readiness", "probe_answer"]

PROBE_HEADERS: Final = {"Content-Type": "text/plain; charset=utf-8", "Cache-Control": "no-store"}


class Readiness(abc.ABC):
    """What ``/readyz`` asks."""

    @abc.abstractmethod
    def not_ready(self) -> str | None:
        """Why the daemon does not serve now (one line, nothing secret), or None if it does."""


@dataclass(frozen=True, slots=True)
class ProbeAnswer:
    status: HTTPStatus
    body: bytes


def probe_answer(path: str, readiness: Readiness) -> ProbeAnswer | None:
    """The answer to a probe of ``path`` (a query string is ignored); None: not a probe's path."""
    route = path.split("?", 1)[0]
    if route == "/healthz":
        return ProbeAnswer(HTTPStatus.OK, b"ok\n")
    if route != "/readyz":
        return None
    reason = readiness.not_ready()
    if reason is None:
        return ProbeAnswer(HTTPStatus.OK, b"ready\n")
    return ProbeAnswer(HTTPStatus.SERVICE_UNAVAILABLE, f"not ready: {reason}\n".encode())
