"""A writer's side of its executor's partition host (:mod:`netty_like.host_process`): find the host
this executor runs for the application, or start it, and hand it each partition written.

Processes of one executor find their host through a small file in the temp directory, named
for the executor's process (pid and start time) and a digest of the application's secret, and
start it under a file lock so that only one is started.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import selectors
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from netty_like.control import ControlConnection
from netty_like.host_process import HostLaunch, HostReady, process_start_time
from netty_like.host_process import main as host_main
from netty_like.protocol import HostedState
from shuffle_api import ResultPartitionID, ShuffleError, TransportError
from shuffle_runtime.tls import TlsFiles

__all__ = ["ExecutorHost", "ExecutorHostSettings"]

_LOG = logging.getLogger(__name__)
_START_TIMEOUT = 60.0


@dataclass(frozen=True, slots=True)
class ExecutorHostSettings:
    """How to reach or start an executor's host."""

    owner_pid: int
    secret: bytes
    store_url: str
    bind_host: str
    advertised_host: str
    max_frame_size: int
    request_timeout: float
    idle_timeout: float
    tls: TlsFiles
    idle_exit_seconds: float = 600.0


@dataclass(frozen=True, slots=True)
class _Found:
    resource_id: str
    pid: int
    port: int


def _rendezvous_directory() -> Path:
    directory = Path(tempfile.gettempdir()) / f"pyshuffle-hosts-{os.getuid()}"
    directory.mkdir(mode=0o700, exist_ok=True)
    if directory.stat().st_uid != os.getuid():  # made by someone else, to steer us
        raise ShuffleError(f"{directory} belongs to another user; remove it or set TMPDIR")
    return directory


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class ExecutorHost:
    """This executor's host for one application: its address, and a connection to hand it
    partitions (reconnecting, or starting a new host, if the one known is gone)."""

    def __init__(self, settings: ExecutorHostSettings) -> None:
        self._settings = settings
        start_time = process_start_time(settings.owner_pid)
        if start_time is None:
            raise ShuffleError(f"executor process {settings.owner_pid} is not running")
        self._start_time = start_time
        digest = hashlib.sha256(settings.secret).hexdigest()[:16]
        self._key = f"{settings.owner_pid}-{start_time}-{digest}"
        self._lock = threading.Lock()
        self._tls = settings.tls.client_context()
        self._control: ControlConnection | None = None
        self._found = self._find_or_start()

    @property
    def resource_id(self) -> str:
        return self._found.resource_id

    @property
    def address(self) -> str:
        return self._settings.advertised_host

    @property
    def port(self) -> int:
        return self._found.port

    def hand_over(self, state: HostedState, partition: ResultPartitionID) -> None:
        """Tell the host of a partition being written, or committed (then it serves it).

        A connection the host closed while idle is opened again. A host that is gone before a
        partition's first byte (it exited idle, or was killed) is found again, or started
        again: the partition is then that host's."""
        with self._lock:
            try:
                self._send(state, partition)
                return
            except TransportError:
                pass  # a kept connection the host closed while idle, or the host is gone
            try:
                self._send(state, partition)  # both requests are idempotent
            except ShuffleError:
                if state is not HostedState.WRITING:
                    raise
                self._found = self._find_or_start()
                self._send(state, partition)

    def _send(self, state: HostedState, partition: ResultPartitionID) -> None:
        if self._control is None:
            self._control = self._connect()
        try:
            self._control.hand_over(state, partition)
        except TransportError:
            # A committed partition cannot move to another host: its producer descriptor
            # names this one.
            self._control.close()
            self._control = None
            raise

    def close(self) -> None:
        with self._lock:
            if self._control is not None:
                self._control.close()
                self._control = None

    def _connect(self) -> ControlConnection:
        return ControlConnection(
            "127.0.0.1"
            if self._settings.bind_host in ("", "0.0.0.0")
            else self._settings.bind_host,
            self._found.port,
            self._settings.secret,
            timeout=self._settings.request_timeout,
            max_frame_size=self._settings.max_frame_size,
            tls=self._tls,
            server_name=self._settings.advertised_host,
        )

    def _find_or_start(self) -> _Found:
        directory = _rendezvous_directory()
        info = directory / f"{self._key}.json"
        with _locked(directory / f"{self._key}.lock"):
            found = self._read(info)
            if found is not None and process_start_time(found.pid) is not None:
                self._found = found
                try:
                    self._connect().close()
                    return found
                except ShuffleError as error:
                    _LOG.info(
                        "executor host %d does not answer (%s): starting another", found.pid, error
                    )
            found = self._start(info)
            temporary = info.with_suffix(".tmp")
            temporary.write_text(
                json.dumps({"resource_id": found.resource_id, "pid": found.pid, "port": found.port})
            )
            temporary.replace(info)
            return found

    @staticmethod
    def _read(info: Path) -> _Found | None:
        try:
            fields = json.loads(info.read_text())
            return _Found(str(fields["resource_id"]), int(fields["pid"]), int(fields["port"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _start(self, rendezvous: Path) -> _Found:
        settings = self._settings
        resource_id = f"executor-host-{self._key}"
        launch = HostLaunch(
            owner_pid=settings.owner_pid,
            owner_start_time=self._start_time,
            secret_hex=settings.secret.hex(),
            resource_id=resource_id,
            store_url=settings.store_url,
            bind_host=settings.bind_host,
            max_frame_size=settings.max_frame_size,
            request_timeout=settings.request_timeout,
            idle_timeout=settings.idle_timeout,
            idle_exit_seconds=settings.idle_exit_seconds,
            rendezvous=str(rendezvous),
            tls_cert_file=settings.tls.cert_file,
            tls_key_file=settings.tls.key_file,
        )
        # Its own session: the engine's clean-up of its worker processes must not reach it.
        process = subprocess.Popen(
            # Not ``-m``: the package imports the host's module before runpy would run it.
            [
                sys.executable,
                "-c",
                f"import sys; from {host_main.__module__} import main; sys.exit(main())",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
        )
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(launch.to_json())
        process.stdin.close()
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            ready = selector.select(_START_TIMEOUT)
        line = process.stdout.readline().decode() if ready else ""
        process.stdout.close()
        if not line:
            process.kill()
            raise ShuffleError(
                f"the executor's partition host did not start within {_START_TIMEOUT:.0f} s"
                f" (exit code {process.poll()})"
            )
        announced = HostReady.from_json(line)
        _LOG.info("started executor host %d on port %d", announced.pid, announced.port)
        return _Found(resource_id, announced.pid, announced.port)
