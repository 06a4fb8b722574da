"""An executor's partition host: the process that serves what every process of one executor
wrote, for as long as that executor lives (as Flink's TaskExecutor hosts its partitions).

An engine recycles the processes that run its tasks (PySpark's Python workers come and go); a
partition must stay readable from other executors after the process that wrote it is gone. The
first writer of an executor starts this process (:mod:`netty_like.executor_host`); writers hand it
each partition they write to the executor's store, and it serves them on its data port, answers
the driver's status and release requests, and deletes them all when the executor's process
dies or the driver shuts the application down.

:func:`main` reads its launch (JSON) on standard input, prints its address on standard
output, then serves.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from netty_like.partition_manager import ResultPartitionManager
from netty_like.server import DataServer, NettyDataPortLimits
from shuffle_runtime.store import Store
from shuffle_runtime.tls import TlsFiles

__all__ = ["HostLaunch", "HostReady", "process_start_time", "serve_host"]

_LOG = logging.getLogger(__name__)
# The launch is a few kilobytes; refuse anything that is not.
_MAX_LAUNCH = 1 << 20
_WATCH_SECONDS = 0.5


def process_start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot), or ``None`` if no such process runs (a
    zombie has stopped running): a pid alone may be reused by a new process once the old one
    is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in (b"Z", b"X") else int(fields[19])


@dataclass(frozen=True, slots=True)
class HostLaunch:
    """What a host is started with: the executor's process it lives for, the application's
    secret, and its settings as the writer that starts it resolved them."""

    owner_pid: int
    owner_start_time: int
    secret_hex: str
    resource_id: str
    store_url: str
    bind_host: str
    max_frame_size: int
    request_timeout: float
    idle_timeout: float
    idle_exit_seconds: float
    rendezvous: str
    """The file through which the executor's processes find this host; removed at exit."""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    """What it serves TLS with (empty: plaintext)."""

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_json(cls, data: bytes) -> HostLaunch:
        fields: dict[str, Any] = json.loads(data)
        return cls(**fields)


@dataclass(frozen=True, slots=True)
class HostReady:
    """What a started host prints: where it serves."""

    pid: int
    port: int

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, line: str) -> HostReady:
        fields: dict[str, Any] = json.loads(line)
        return cls(**fields)


def serve_host(
    launch: HostLaunch,
    on_ready: Callable[[HostReady], None],
    *,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Serve until the owner process is gone, a SHUTDOWN request, or ``idle_exit_seconds``
    holding nothing; then delete every partition held or being written."""
    manager = ResultPartitionManager(Store(launch.store_url), launch.request_timeout)
    stopping = threading.Event()
    server = DataServer(
        manager,
        launch.bind_host,
        0,
        secret=bytes.fromhex(launch.secret_hex),
        limits=NettyDataPortLimits(
            max_frame_size=launch.max_frame_size, idle_timeout=launch.idle_timeout
        ),
        hosts_partitions=True,
        on_shutdown=stopping.set,
        tls=TlsFiles(cert_file=launch.tls_cert_file, key_file=launch.tls_key_file).server_context(),
    )
    port = server.start()
    on_ready(HostReady(os.getpid(), port))
    idle_since = clock()
    try:
        while not stopping.wait(_WATCH_SECONDS):
            if process_start_time(launch.owner_pid) != launch.owner_start_time:
                _LOG.info("executor process %d is gone: deleting its partitions", launch.owner_pid)
                break
            if manager.occupying():
                idle_since = clock()
            elif clock() - idle_since > launch.idle_exit_seconds:
                _LOG.info("held no partition for %.0f s: exiting", launch.idle_exit_seconds)
                break
    finally:
        server.stop()
        manager.release(manager.occupying())
        _forget(Path(launch.rendezvous))


def _forget(rendezvous: Path) -> None:
    """Remove the rendezvous file if it still names this process (a later host may have
    replaced it)."""
    try:
        if json.loads(rendezvous.read_text()).get("pid") == os.getpid():
            rendezvous.unlink()
    except (OSError, ValueError, AttributeError):
        pass


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="pyshuffle host: %(levelname)s %(message)s")
    launch = HostLaunch.from_json(sys.stdin.buffer.read(_MAX_LAUNCH))
    sys.stdin.close()

    def announce(ready: HostReady) -> None:
        print(ready.to_json(), flush=True)
        sys.stdout.close()

    serve_host(launch, announce)
    return 0
