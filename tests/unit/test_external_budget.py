"""The worker's memory budget for pushed bytes: pushes wait for room (backpressure), one larger
than the whole budget is admitted alone, and a wait past the configured timeout fails clearly."""

from __future__ import annotations

import threading
import time

import pytest

from external_shuffle.daemon.worker.state import MemoryBudget
from external_shuffle.options import WORKER_MEMORY_BUDGET_TIMEOUT
from shuffle_api import Configuration, DataTooLargeError


def test_a_reservation_waits_until_earlier_ones_leave_room() -> None:
    budget = MemoryBudget(100, timeout=10.0)
    admitted = threading.Event()

    def second() -> None:
        with budget.reserve(60):
            admitted.set()

    with budget.reserve(60):
        waiting = threading.Thread(target=second)
        waiting.start()
        assert not admitted.wait(0.2)  # 60 + 60 > 100: it waits
        assert budget.used == 60
    assert admitted.wait(10)
    waiting.join(10)
    assert budget.used == 0


def test_a_reservation_larger_than_the_budget_is_admitted_alone() -> None:
    budget = MemoryBudget(100, timeout=10.0)
    with budget.reserve(500):
        assert budget.used == 500
    assert budget.used == 0


def test_a_budget_full_past_the_timeout_fails_naming_the_budget_and_the_wait() -> None:
    timeout = Configuration.load({WORKER_MEMORY_BUDGET_TIMEOUT.key: "0.2"}).get(
        WORKER_MEMORY_BUDGET_TIMEOUT
    )
    budget = MemoryBudget(100, timeout=timeout)
    with budget.reserve(80):
        started = time.monotonic()
        with (
            pytest.raises(DataTooLargeError, match=r"\(100 bytes\) stayed full for 0.2 s"),
            budget.reserve(40),
        ):
            pass
        assert 0.15 <= time.monotonic() - started < 5
    assert budget.used == 0
