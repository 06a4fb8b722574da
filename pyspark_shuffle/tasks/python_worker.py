"""What pyshuffle does to the Spark Python worker each of its tasks runs in, as the task starts.

Every Python task of Spark pays two costs that are not its work, and pyshuffle runs more Python
tasks than Spark's own shuffle does (its map tasks too):

- **A full garbage collection after the task.** PySpark's daemon collects after every task,
  and a worker with pyarrow, pandas, pyspark and pyshuffle imported holds ~100,000 objects:
  each collection walked them all, 25-45 ms a task on 2 cores, more than a small task's work.
  :class:`_LastingObjects` keeps what the worker holds between tasks out of it.
- **A delayed acknowledgement at the start of the task.** The executor sends a task's command,
  then its input, in two writes on a socket that waits (Nagle's algorithm) for the first to
  be acknowledged before it sends the second, and the worker, with nothing to answer yet,
  delays that acknowledgement (Linux: 40 ms): ~40 ms of every task on TCP, where the work of a
  small task is ~10 ms. Setting ``TCP_QUICKACK`` as the task starts sends it at once. Not
  permanent (the kernel goes back to delaying once the worker answers), so every task sets
  it again. Spark's Unix domain sockets (``spark.python.unix.domain.socket.enabled``) have
  no such wait.

And one choice of the worker's that pyarrow otherwise makes: its memory pool
(:func:`use_memory_pool`, ``pyspark-shuffle.worker.memory-pool``).
"""

from __future__ import annotations

import gc
import logging
import socket
from collections.abc import Callable
from typing import Final

import pyarrow as pa
from pyspark import TaskContext

from pyspark_shuffle.spark.internals import task_connection

__all__ = ["acknowledge_at_once", "task_starts", "use_memory_pool"]

_LOG = logging.getLogger(__name__)

# Linux only; elsewhere acknowledgements are left as the system makes them.
_TCP_QUICKACK: Final = getattr(socket, "TCP_QUICKACK", None)


class _LastingObjects:
    """Keeps what a Python worker holds between tasks out of the collection after each task.

    When a task starts, the last collection has just run, so every object still tracked is
    live: they are frozen, and the collection after the task walks only what the task made.
    What is frozen and later dropped is freed by its count; one that was in a cycle waits for
    the full collection run every ``full_every`` tasks.
    """

    def __init__(self, full_every: int) -> None:
        self._full_every = full_every
        self._tasks = 0

    def task_starts(self) -> None:
        self._tasks += 1
        if self._tasks % self._full_every == 0:
            gc.unfreeze()
            gc.collect()
        gc.freeze()


def acknowledge_at_once(descriptor: int) -> bool:
    """Make the TCP connection ``descriptor`` acknowledge what it receives without delay (and
    what it holds unacknowledged now); False where it is no TCP connection or the system has
    no such option. The descriptor stays open."""
    if _TCP_QUICKACK is None:
        return False
    try:
        connection = socket.socket(fileno=descriptor)
    except OSError:  # no socket
        return False
    try:
        if connection.family not in (socket.AF_INET, socket.AF_INET6):
            return False
        connection.setsockopt(socket.IPPROTO_TCP, _TCP_QUICKACK, 1)
        return True
    except OSError as error:
        _LOG.debug("the task's connection keeps delaying acknowledgements: %s", error)
        return False
    finally:
        connection.detach()


_MEMORY_POOLS: Final[dict[str, Callable[[], pa.MemoryPool]]] = {
    "jemalloc": pa.jemalloc_memory_pool,
    "mimalloc": pa.mimalloc_memory_pool,
    "system": pa.system_memory_pool,
}


def use_memory_pool(name: str) -> str:
    """Make the Arrow memory pool ``name`` (a ``pyspark-shuffle.worker.memory-pool`` choice)
    this process's default, for what is allocated from now on; the system's where this
    pyarrow is built without it. Returns the backend in use."""
    make = _MEMORY_POOLS.get(name)
    if make is None:  # "default": pyarrow's own choice
        return str(pa.default_memory_pool().backend_name)
    try:
        pool = make()
    except NotImplementedError:
        _LOG.info("this pyarrow has no %s memory pool; using the system's", name)
        pool = pa.system_memory_pool()
    pa.set_memory_pool(pool)
    return str(pool.backend_name)


class _TaskStarts:
    """Once per task attempt, however many of pyshuffle's steps a task runs (a fused stage's
    task is a reduce task and a map task)."""

    def __init__(self) -> None:
        self._lasting_objects = _LastingObjects(full_every=100)
        self._attempt: int | None = None

    def __call__(self) -> None:
        task = TaskContext.get()
        if task is None or task.taskAttemptId() == self._attempt:
            return
        self._attempt = task.taskAttemptId()
        self._lasting_objects.task_starts()
        descriptor = task_connection()
        if descriptor is not None:
            acknowledge_at_once(descriptor)


task_starts: Final = _TaskStarts()
"""Call first thing in a pyshuffle task, before it reads its input; nothing outside Spark's
Python workers (a test running a task in-process)."""
