"""Progress of a running map stage: its Spark jobs labelled inside the user's own job group
and description (under Spark Connect: tagged, besides the user's own tags), a progress line
logged every few seconds, and a progress bar on the driver's stderr where it is a console."""

from __future__ import annotations

import itertools
import logging
import sys
import threading
import time
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Final, Self, TextIO

from pyspark_shuffle.driver.progress_bar import (
    BAR_REFRESH,
    ConsoleBar,
    StageCounts,
    auto_bar,
    console_width,
    is_console,
    spark_boolean,
)
from pyspark_shuffle.spark.internals import connect_progress_bar, submitted_to_terminal
from pyspark_shuffle.spark.link import TaskAccumulator, is_connect, spark_settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["JobLabel", "StageProgress", "StageTallies", "bar_stream"]

_LOG = logging.getLogger(__name__)

JOB_GROUP: Final = "spark.jobGroup.id"
JOB_DESCRIPTION: Final = "spark.job.description"
INTERRUPT_ON_CANCEL: Final = "spark.job.interruptOnCancel"
# What setJobGroup sets (all per thread): restored as they were when a stage ends.
JOB_PROPERTIES: Final = (JOB_GROUP, JOB_DESCRIPTION, INTERRUPT_ON_CANCEL)
PYSHUFFLE_TAG: Final = "pyshuffle"
"""Under Spark Connect, the tag on every job pyshuffle runs (``spark.interruptTag`` of it
stops them all; the user's own tags are on them too, so theirs stop them as well)."""
SHOW_CONSOLE_PROGRESS: Final = "spark.ui.showConsoleProgress"
_BAR_NUMBERS = itertools.count(1)
"""Numbers the bars of this driver's map stages, as Spark's bars show stage ids."""


class JobLabel:
    """Within it, the Spark jobs of this thread carry the user's job group (so
    cancelJobGroup still reaches them; a group of pyshuffle's own when the user set none)
    and a description that names pyshuffle's step after the user's own. On exit the job
    properties are as they were. Under Spark Connect (no job groups) the jobs carry
    :data:`PYSHUFFLE_TAG` and the user's tags."""

    def __init__(self, spark: SparkSession, step: str) -> None:
        self._spark = spark
        self.connect = is_connect(spark)
        self._label = f"pyshuffle: {step}"
        self._saved: dict[str, str | None] = {}
        self._tagged = False
        self.group = ""
        self.jobs_before: frozenset[int] = frozenset()
        """The group's jobs known when the label was put on (not this step's)."""

    def __enter__(self) -> Self:
        if self.connect:
            self._tagged = PYSHUFFLE_TAG not in self._spark.getTags()
            if self._tagged:
                self._spark.addTag(PYSHUFFLE_TAG)
            return self
        context = self._spark.sparkContext
        self._saved = {key: context.getLocalProperty(key) for key in JOB_PROPERTIES}
        user_group, user_description = self._saved[JOB_GROUP], self._saved[JOB_DESCRIPTION]
        if user_group is None:
            self.group = f"pyshuffle-{id(self)}"
            context.setJobGroup(self.group, self._label)
        else:
            self.group = user_group
            self.jobs_before = frozenset(context.statusTracker().getJobIdsForGroup(user_group))
            label = (
                self._label if user_description is None else f"{user_description} | {self._label}"
            )
            context.setJobDescription(label)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.connect:
            if self._tagged:
                self._spark.removeTag(PYSHUFFLE_TAG)
            return
        for key, value in self._saved.items():
            # None removes the property (SparkContext.setLocalProperty in the JVM).
            self._spark.sparkContext.setLocalProperty(key, value)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class StageTallies:
    """What a map stage's tasks add as each finishes: 1, its rows and its bytes written."""

    tasks: TaskAccumulator[int]
    rows: TaskAccumulator[int]
    size: TaskAccumulator[int]

    def values(self) -> tuple[int, int, int]:
        return self.tasks.value, self.rows.value, self.size.value


def bar_stream(spark: SparkSession, setting: str) -> TextIO | None:
    """The driver's stderr when a map stage's bar is drawn on it, by
    ``pyspark-shuffle.progress.bar`` (``setting``: true, false, or auto, see
    :func:`auto_bar`), else ``None``."""
    stream = sys.stderr
    if setting != "auto":
        return stream if setting == "true" else None
    console_progress = spark_settings(spark).get(SHOW_CONSOLE_PROGRESS)
    if is_connect(spark):
        console, spark_draws = is_console(stream), connect_progress_bar()
    else:
        # spark-submit relays a Python driver's stderr (a pipe) to its terminal. A classic
        # session's SparkContext draws its own bar when the setting is true, as PySpark
        # makes it for every session it starts itself.
        console = is_console(stream) or submitted_to_terminal(spark)
        spark_draws = spark_boolean(console_progress) is True
    wanted = auto_bar(console=console, console_progress=console_progress, spark_draws=spark_draws)
    return stream if wanted else None


class _DrawnBar:
    """A stage's bar on the console it is drawn on."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._bar = ConsoleBar(f"pyshuffle map {next(_BAR_NUMBERS)}")

    def update(self, elapsed: float, counts: StageCounts | None) -> None:
        self._write(self._bar.update(elapsed, counts, console_width(self._stream)))

    def clear(self) -> None:
        self._write(self._bar.clear())

    def _write(self, text: str) -> None:
        if text:
            self._stream.write(text)
            self._stream.flush()


class StageProgress:
    """A map stage's jobs under a :class:`JobLabel`; every ``interval`` seconds (0: never)
    a line with its map tasks done, the Spark tasks running (its inputs' too) and the rows
    and bytes written, is logged at INFO. Where the tasks cannot count as they go (Spark
    Connect), the line says only that the stage runs. On ``bar`` (a console, or ``None``),
    a one-line bar of its ``tasks`` map tasks, as Spark draws its stages."""

    def __init__(
        self,
        spark: SparkSession,
        description: str,
        *,
        tallies: StageTallies | None,
        interval: float,
        tasks: int | None,
        bar: TextIO | None,
    ) -> None:
        self._spark = spark
        self._description = description
        self._tallies = tallies
        self._interval = interval
        self._tasks = tasks
        self._bar = None if bar is None else _DrawnBar(bar)
        self._label = JobLabel(spark, description)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._report, name="pyshuffle-progress", daemon=True)
        self._started = 0.0
        self._before = (0, 0, 0)
        """The tallies when the stage started: a rerun counts only its own tasks."""

    def _running(self) -> int:
        """Tasks running in the stage's jobs: the group's jobs since entry (another thread's
        jobs in the user's group at the same time are counted too)."""
        tracker = self._spark.sparkContext.statusTracker()
        running = 0
        for job_id in set(tracker.getJobIdsForGroup(self._label.group)) - self._label.jobs_before:
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job is not None else ():
                stage = tracker.getStageInfo(stage_id)
                if stage is not None:
                    running += stage.numActiveTasks
        return running

    def line(self) -> str:
        seconds = f"{time.perf_counter() - self._started:.0f} s"
        if self._label.connect or self._tallies is None:
            return f"{self._description}: running, {seconds}"
        tasks, rows, size = (
            now - before for now, before in zip(self._tallies.values(), self._before, strict=True)
        )
        return (
            f"{self._description}: {tasks} done, {self._running()} Spark tasks running,"
            f" {rows:,} rows, {size / 1e6:,.1f} MB written, {seconds}"
        )

    def _counts(self) -> StageCounts | None:
        if self._label.connect or self._tallies is None or self._tasks is None:
            return None
        done = self._tallies.tasks.value - self._before[0]
        return StageCounts(done, self._running(), self._tasks)

    def _report(self) -> None:
        # One thread logs and draws: a line is logged with the bar erased, not behind it.
        bar = self._bar
        tick = min(p for p in (self._interval, BAR_REFRESH if bar else 0.0) if p > 0)
        every = round(self._interval / tick) if self._interval > 0 else 0
        for ticks in itertools.count(1):
            if self._done.wait(tick):
                break
            if every and ticks % every == 0 and _LOG.isEnabledFor(logging.INFO):
                if bar is not None:
                    bar.clear()
                _LOG.info("%s", self.line())
            if bar is not None:
                bar.update(time.perf_counter() - self._started, self._counts())
        if bar is not None:
            bar.clear()

    def __enter__(self) -> Self:
        self._started = time.perf_counter()
        if self._tallies is not None and not self._label.connect:
            self._before = self._tallies.values()
        self._label.__enter__()
        if self._interval > 0 or self._bar is not None:
            self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()
        self._label.__exit__(exc_type, exc, traceback)
