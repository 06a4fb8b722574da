"""Waiting, in tests, for what another thread or process does soon."""

from __future__ import annotations

import time
from collections.abc import Callable


def eventually(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.05)
