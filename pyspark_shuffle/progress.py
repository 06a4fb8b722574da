"""Progress of a running map stage, printed on the driver's terminal."""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING, Self, TextIO

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.accumulators import Accumulator

__all__ = ["StageProgress"]


class StageProgress:
    """While the stage runs (Spark jobs of one job group), print every ``interval`` seconds
    its finished tasks and the rows and bytes they wrote; an interval of 0 prints nothing."""

    def __init__(
        self,
        spark_context: SparkContext,
        description: str,
        *,
        rows: Accumulator[int],
        size: Accumulator[int],
        interval: float,
        out: TextIO = sys.stderr,
    ) -> None:
        self._context = spark_context
        self._description = description
        self._rows = rows
        self._size = size
        self._interval = interval
        self._out = out
        self._group = f"pyshuffle-{id(self)}"
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._report, name="pyshuffle-progress", daemon=True)
        self._started = 0.0

    def _tasks(self) -> tuple[int, int]:
        tracker = self._context.statusTracker()
        finished = total = 0
        for job_id in tracker.getJobIdsForGroup(self._group):
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job is not None else ():
                stage = tracker.getStageInfo(stage_id)
                if stage is not None:
                    finished += stage.numCompletedTasks
                    total += stage.numTasks
        return finished, total

    def line(self) -> str:
        finished, total = self._tasks()
        return (
            f"pyshuffle: {self._description}: {finished}/{total} tasks,"
            f" {self._rows.value:,} rows, {self._size.value / 1e6:,.1f} MB written,"
            f" {time.perf_counter() - self._started:.0f} s"
        )

    def _report(self) -> None:
        while not self._done.wait(self._interval):
            print(self.line(), file=self._out, flush=True)

    def __enter__(self) -> Self:
        self._started = time.perf_counter()
        self._context.setJobGroup(self._group, self._description)
        if self._interval > 0:
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
        self._context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
