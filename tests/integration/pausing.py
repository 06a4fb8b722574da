"""Holding a Spark task still while a test breaks something: one task, in its first attempt,
says it is ready (a file appears) and waits for the word to go on (another file)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

WAIT = 120.0


def wait_for(path: Path) -> None:
    deadline = time.monotonic() + WAIT
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.05)


def pausing(
    ready: Path, go: Path, partition: int
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A pass-through whose task ``partition`` (first attempt) says ``ready`` and waits for
    ``go`` before it takes its first batch."""

    def pause(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext  # noqa: PLC0415

        task = TaskContext.get()
        if task is not None and task.partitionId() == partition and task.attemptNumber() == 0:
            ready.touch()
            wait_for(go)
        yield from batches

    return pause


def paused(frame: DataFrame, ready: Path, go: Path, partition: int) -> DataFrame:
    """``frame`` with task ``partition`` held as :func:`pausing` holds it."""
    held: DataFrame = frame.mapInArrow(pausing(ready, go, partition), frame.schema)
    return held
