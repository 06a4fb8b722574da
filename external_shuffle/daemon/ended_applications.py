"""Applications that ended (unregistered or expired): their credentials hold no more.

A coordinator numbers them in the order they end and tells its workers the ones after the
number each has heard of; both refuse an ended application's credential. Each remembers the
most recent :data:`MAX_ENDED` (ids of about 40 bytes: a few MiB at most); a restarted
coordinator forgets them, and then only the credentials' expiry bounds them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Final

from external_shuffle.wire.credentials import Credential, Role
from shuffle_api import AuthenticationError

__all__ = ["MAX_ENDED", "EndedApplications"]

MAX_ENDED: Final = 100_000


class EndedApplications:
    """The most recent ``limit`` applications that ended, oldest first; thread-safe."""

    def __init__(self, limit: int = MAX_ENDED) -> None:
        self._limit = limit
        self._numbers: dict[str, int] = {}  # each one's number in the order they ended
        self._count = 0
        self._lock = threading.Lock()

    def add(self, application_ids: Iterable[str]) -> None:
        with self._lock:
            for application_id in application_ids:
                self._numbers.pop(application_id, None)
                self._count += 1
                self._numbers[application_id] = self._count
            while len(self._numbers) > self._limit:
                del self._numbers[next(iter(self._numbers))]

    def __contains__(self, application_id: object) -> bool:
        with self._lock:
            return application_id in self._numbers

    def after(self, heard: int, most: int) -> tuple[list[str], int]:
        """The applications that ended after the first ``heard`` (oldest first, at most
        ``most``), and how many one has heard of once it has them."""
        with self._lock:
            later: list[str] = []
            for application_id in reversed(self._numbers):
                if self._numbers[application_id] <= heard:
                    break
                later.append(application_id)
            later = later[::-1][:most]
            return later, self._numbers[later[-1]] if later else max(heard, 0)

    def check(self, credential: Credential) -> None:
        """AuthenticationError for the credential of an application that ended."""
        if credential.role is Role.APPLICATION and credential.name in self:
            raise AuthenticationError(
                f"the credential of application {credential.name} holds no more: the"
                " application ended (it unregistered, or expired)"
            )
