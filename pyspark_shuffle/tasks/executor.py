"""What a Python worker knows of the Spark executor it works for: the executor's JVM (whose
life bounds the partitions the executor hosts), the address Spark uses for it, and its local
directory (where Spark keeps its own shuffle files)."""

from __future__ import annotations

import itertools
import os
import socket
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SparkExecutor", "this_executor"]

# Python worker -> pyspark.daemon -> executor JVM; a worker without the daemon is the JVM's child.
_MAX_ANCESTORS = 4


@dataclass(frozen=True, slots=True)
class SparkExecutor:
    jvm_pid: int | None
    """``None`` where the process tree cannot be read (no ``/proc``)."""
    address: str
    local_directory: str | None


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return int(stat.rsplit(b")", 1)[1].split()[1])


def _command_line(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _jvm_pid() -> int | None:
    pid: int | None = os.getpid()
    for _ in range(_MAX_ANCESTORS):
        pid = _parent(pid) if pid is not None else None
        if pid is None or pid <= 1:
            return None
        arguments = _command_line(pid)
        if arguments and os.path.basename(arguments[0]).startswith("java"):
            return pid
    return None


def _address(jvm_pid: int | None) -> str:
    """The host name Spark gave the executor (``--hostname`` of its JVM), else the driver's
    choice of local address (``SPARK_LOCAL_IP``), else this host's name."""
    arguments = _command_line(jvm_pid) if jvm_pid is not None else []
    for flag, value in itertools.pairwise(arguments):
        if flag == "--hostname" and value:
            return value
    return (
        os.environ.get("SPARK_LOCAL_IP")
        or os.environ.get("SPARK_EXECUTOR_POD_IP")
        or socket.gethostname()
    )


def this_executor() -> SparkExecutor:
    """The executor this Python worker runs for."""
    jvm_pid = _jvm_pid()
    local_directories = os.environ.get("SPARK_LOCAL_DIRS", "")
    first = local_directories.split(",")[0].strip()
    return SparkExecutor(jvm_pid, _address(jvm_pid), first or None)
