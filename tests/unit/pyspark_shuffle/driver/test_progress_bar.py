"""A map stage's console bar, in-process with the times given: what it draws for given
counts and widths, when (not before half a second, again only when it changes), how it is
erased, and which consoles get one by default."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import struct
import termios
from collections.abc import Iterator

import pytest

from pyspark_shuffle.driver.progress_bar import (
    BAR_DELAY,
    ConsoleBar,
    StageCounts,
    auto_bar,
    console_width,
    is_console,
)


def test_the_bar_is_sparks_console_progress_labelled_as_pyshuffles() -> None:
    bar = ConsoleBar("pyshuffle map 3")
    assert bar.text(StageCounts(12, 2, 40), 1.0, 60) == (
        "[pyshuffle map 3: =======>                   (12 + 2) / 40]"
    )
    assert bar.text(StageCounts(0, 0, 40), 1.0, 60) == (
        "[pyshuffle map 3: >                           (0 + 0) / 40]"
    )
    assert bar.text(StageCounts(40, 0, 40), 1.0, 60) == (
        "[pyshuffle map 3: ========================== (40 + 0) / 40]"
    )


@pytest.mark.parametrize("width", [60, 80, 200])
def test_the_bar_fills_the_line_but_its_last_column(width: int) -> None:
    assert len(ConsoleBar("pyshuffle map 1").text(StageCounts(5, 2, 9), 1.0, width)) == width - 1


def test_a_narrow_console_gets_the_counts_without_a_bar() -> None:
    assert ConsoleBar("pyshuffle map 1").text(StageCounts(1, 1, 4), 1.0, 20) == (
        "[pyshuffle map 1: (1 + 1) / 4]"
    )


def test_retried_attempts_never_run_the_bar_over() -> None:
    assert ConsoleBar("pyshuffle map 1").text(StageCounts(7, 3, 6), 1.0, 40) == (
        "[pyshuffle map 1: ======== (6 + 0) / 6]"
    )


def test_uncounted_tasks_show_the_time_the_stage_has_run() -> None:
    assert ConsoleBar("pyshuffle map 2").text(None, 12.4, 80) == "[pyshuffle map 2: running, 12 s]"


def test_a_short_stage_draws_nothing() -> None:
    bar = ConsoleBar("pyshuffle map 1")
    assert bar.update(0.2, StageCounts(0, 2, 4), 80) == ""
    assert bar.update(BAR_DELAY - 0.01, StageCounts(3, 1, 4), 80) == ""
    assert bar.clear() == ""


def test_the_bar_is_redrawn_in_place_only_when_it_changes() -> None:
    bar = ConsoleBar("pyshuffle map 1")
    first = bar.update(0.6, StageCounts(0, 2, 4), 40)
    assert first == "\r[pyshuffle map 1: >        (0 + 2) / 4]"
    assert bar.update(0.8, StageCounts(0, 2, 4), 40) == ""
    assert bar.update(1.0, StageCounts(2, 2, 4), 40) == "\r[pyshuffle map 1: ====>    (2 + 2) / 4]"
    # Unchanged for a minute: drawn again, in case other output moved it up.
    assert bar.update(61.1, StageCounts(2, 2, 4), 40) != ""


def test_a_shorter_bar_is_padded_over_the_longer_one_before() -> None:
    bar = ConsoleBar("pyshuffle map 1")
    long = bar.update(0.6, StageCounts(0, 2, 4), 60)
    short = bar.update(0.8, StageCounts(1, 1, 4), 40)
    assert short.startswith("\r[pyshuffle map 1: ")
    assert len(short) == len(long)


def test_clearing_erases_the_line_and_the_next_update_draws_again() -> None:
    bar = ConsoleBar("pyshuffle map 1")
    drawn = bar.update(0.6, StageCounts(1, 1, 4), 40)
    assert bar.clear() == "\r" + " " * (len(drawn) - 1) + "\r"
    assert bar.clear() == ""
    assert bar.update(0.8, StageCounts(1, 1, 4), 40) == drawn


@pytest.mark.parametrize(
    ("console", "console_progress", "spark_draws", "drawn"),
    [
        (True, None, False, True),  # a terminal; Spark draws no bar (spark-submit, Connect)
        (False, None, False, False),  # a pipe or a file (pytest's capture among them)
        (True, "false", False, False),  # Spark's console progress turned off
        (True, " FALSE ", False, False),
        (True, "true", True, False),  # Spark's own bar shows the stage on this console
        (False, "true", True, False),
        (True, None, True, False),  # a Spark Connect shell's bar
        (True, "true", False, True),  # Spark's bar goes elsewhere (a Connect server's)
    ],
)
def test_by_default_one_bar_on_a_console(
    console: bool, console_progress: str | None, spark_draws: bool, drawn: bool
) -> None:
    assert (
        auto_bar(console=console, console_progress=console_progress, spark_draws=spark_draws)
        is drawn
    )


@pytest.fixture
def terminal() -> Iterator[io.TextIOWrapper]:
    """The secondary side of a pseudo-terminal of 123 columns, as a text stream."""
    primary, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 123, 0, 0))
    with open(secondary, "w", closefd=True) as stream:
        yield stream
    os.close(primary)


def test_a_terminal_is_a_console_of_its_own_width(terminal: io.TextIOWrapper) -> None:
    assert is_console(terminal)
    assert console_width(terminal) == 123


def test_a_kernels_stream_is_a_console() -> None:
    kernel_stream = type("OutStream", (io.StringIO,), {"__module__": "ipykernel.iostream"})
    assert is_console(kernel_stream())
    assert not is_console(io.StringIO())


def test_elsewhere_the_width_is_columns_or_80(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    assert console_width(io.StringIO()) == 100
    monkeypatch.delenv("COLUMNS")
    assert console_width(io.StringIO()) == 80
