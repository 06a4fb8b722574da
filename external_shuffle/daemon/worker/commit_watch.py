"""What a worker committed since one coordinator last heard of it."""

from __future__ import annotations

import threading

from external_shuffle.wire.messages import Commit

__all__ = ["CommitWatch"]


class CommitWatch:
    """The commits since its reader last took them, for one coordinator's heartbeats.

    A worker's registration lists what it holds then; a partition a coordinator placed before
    it restarted and that was committed after the worker registered again would stay unknown
    to it (placed anew by its driver's claim, never released). Bounded: past ``limit`` commits
    between two takes, it keeps only that it overflowed, and its reader registers again with
    the whole list."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._commits: list[Commit] = []
        self._overflowed = False
        self._lock = threading.Lock()

    def add(self, commit: Commit) -> None:
        with self._lock:
            if len(self._commits) >= self._limit:
                self._overflowed = True
                self._commits = []
            if not self._overflowed:
                self._commits.append(commit)

    def take(self) -> list[Commit] | None:
        """The commits since the last take; None if there were more than the limit."""
        with self._lock:
            commits, overflowed = self._commits, self._overflowed
            self._commits, self._overflowed = [], False
        return None if overflowed else commits
