"""A running map stage's one-line progress bar on the driver's stderr, drawn as Spark's console
progress draws its stages: what it shows and when (:class:`ConsoleBar`, given the time its
caller reads), and whether a driver draws one by default (:func:`auto_bar`). No Spark here."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Final, TextIO

__all__ = [
    "BAR_DELAY",
    "BAR_REFRESH",
    "ConsoleBar",
    "StageCounts",
    "auto_bar",
    "console_width",
    "is_console",
    "spark_boolean",
]

BAR_DELAY: Final = 0.5
"""Seconds a stage runs before its bar is drawn (Spark's, fixed there too): a short stage
draws nothing."""
BAR_REFRESH: Final = 0.2
"""Seconds between looks at a stage (the default of Spark's
``spark.ui.consoleProgress.update.interval``)."""
_REDRAW: Final = 60.0
"""An unchanged bar is drawn again after this long, as Spark's is: other output on the
console may have moved it up."""
_WIDTH: Final = 80
"""Columns where the console does not say (Spark's too)."""


@dataclass(frozen=True, slots=True)
class StageCounts:
    """A map stage's tasks: finished, running, and in all."""

    done: int
    running: int
    total: int


class ConsoleBar:
    """What to write for one stage's bar, given how long it has run: nothing in its first
    :data:`BAR_DELAY` seconds, then the bar from the line's start (``\\r``) whenever it
    changes, and at the end what erases it."""

    def __init__(self, label: str) -> None:
        self._label = label
        self._shown = ""
        """The bar on the console now ("" when none is)."""
        self._shown_at = 0.0

    def text(self, counts: StageCounts | None, elapsed: float, width: int) -> str:
        """The bar in at most ``width - 1`` columns (a line's last column makes some
        terminals wrap): ``[pyshuffle map 3: ====>     (12 + 2) / 40]``; where the tasks
        are not counted (``None``), the seconds the stage has run."""
        head = f"[{self._label}:"
        if counts is None:
            return f"{head} running, {elapsed:.0f} s]"
        # Retried or speculative attempts may count twice; the bar never runs over.
        done = min(counts.done, counts.total)
        running = max(0, min(counts.running, counts.total - done))
        tail = f"({done} + {running}) / {counts.total}]"
        room = width - 1 - len(head) - len(tail) - 2
        if room <= 0:
            return f"{head} {tail}"
        filled = room if counts.total == 0 else room * done // counts.total
        bar = "=" * room if filled == room else ("=" * filled + ">").ljust(room)
        return f"{head} {bar} {tail}"

    def update(self, elapsed: float, counts: StageCounts | None, width: int) -> str:
        """What to write after ``elapsed`` seconds of the stage ("" for nothing): the bar
        once it changed (or :data:`_REDRAW` seconds on), padded over a longer one before."""
        if elapsed < BAR_DELAY:
            return ""
        text = self.text(counts, elapsed, width)
        if text == self._shown and elapsed - self._shown_at < _REDRAW:
            return ""
        written = "\r" + text.ljust(len(self._shown))
        self._shown, self._shown_at = text, elapsed
        return written

    def clear(self) -> str:
        """What erases the bar ("" when none is shown); the next update draws it anew."""
        if not self._shown:
            return ""
        erased = "\r" + " " * len(self._shown) + "\r"
        self._shown = ""
        return erased


def spark_boolean(text: str | None) -> bool | None:
    """A Spark boolean setting as Spark reads it (``None`` where unset or not a boolean)."""
    return {"true": True, "false": False}.get((text or "").strip().lower())


def is_console(stream: TextIO) -> bool:
    """Whether ``stream`` shows a line redrawn in place: a terminal, or a Jupyter/IPython
    kernel's stream (ipykernel's, which the notebook shows with its carriage returns)."""
    if any(kind.__module__.startswith("ipykernel.") for kind in type(stream).__mro__):
        return True
    try:
        return stream.isatty()
    except ValueError:  # closed
        return False


def console_width(stream: TextIO) -> int:
    """Columns of the terminal ``stream`` writes to; else ``COLUMNS``, else 80 (as Spark)."""
    with contextlib.suppress(OSError, ValueError):
        if stream.isatty() and (columns := os.get_terminal_size(stream.fileno()).columns) > 0:
            return columns
    variable = os.environ.get("COLUMNS", "")
    return int(variable) if variable.isdigit() and int(variable) > 0 else _WIDTH


def auto_bar(*, console: bool, console_progress: str | None, spark_draws: bool) -> bool:
    """Whether pyshuffle draws its bar where ``pyspark-shuffle.progress.bar`` is ``auto``:
    when stderr is a ``console``, unless Spark's ``spark.ui.showConsoleProgress``
    (``console_progress``; ``None`` where unset) is false, or Spark draws its own bar there
    (``spark_draws``), which shows the same stage: two bars on one line would overwrite
    each other."""
    return console and spark_boolean(console_progress) is not False and not spark_draws
