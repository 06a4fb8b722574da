"""A coordinator and N workers as real daemon processes on 127.0.0.1: the Python twin of
``deploy/local-cluster.sh``, used by the tests and benchmarks.

    with LocalCluster(tmp_path, workers=2) as cluster:
        config = Configuration.load(cluster.client_config(), environ={})
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from external_shuffle.daemon import main as daemon_main
from external_shuffle.options import TLS_CA_FILE
from external_shuffle.wire.channels import ChannelPool, ClientSettings
from external_shuffle.wire.stubs import pb, pb_grpc
from shuffle_api import Configuration, ShuffleError
from shuffle_api.testing import LocalDeployment
from shuffle_runtime.ports import address_in_use, free_ports

__all__ = ["LocalCluster", "chaos_deployment"]

_START_TIMEOUT = 60.0
_START_ATTEMPTS = 3

logger = logging.getLogger(__name__)


def _write_toml(path: Path, values: Mapping[str, object]) -> Path:
    path.write_text(
        "".join(f"{json.dumps(key)} = {_toml_value(value)}\n" for key, value in values.items())
    )
    return path


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))  # a TOML basic string


@dataclass
class _Process:
    name: str
    role: str
    config: Path
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    log_start: int = 0  # where this run's lines begin in the log


class LocalCluster(LocalDeployment):
    """Daemons of one cluster, their configs, logs and stores under ``directory``."""

    def __init__(
        self,
        directory: Path,
        *,
        workers: int = 2,
        coordinators: int = 1,
        store_shared: bool = True,
        store_root: str | None = None,
        settings: Mapping[str, object] | None = None,
        metrics: bool = False,
        status_page: bool = False,
    ) -> None:
        """``store_root``: an fsspec URL under which each worker gets a store of its own
        (``<root>/worker-<i>``, an object store's say); None: directories under ``directory``.
        ``status_page``: the first coordinator serves its status page on ``status_port``."""
        self.directory = directory
        self._store_root = store_root
        directory.mkdir(parents=True, exist_ok=True)
        self.token_file = directory / "token"
        self.token_file.write_text(secrets.token_urlsafe(32))
        self.token_file.chmod(0o600)
        self._coordinators = coordinators
        self._workers = workers
        self._store_shared = store_shared
        self._settings = dict(settings or {})
        self._metrics = metrics
        self._status_page = status_page
        self._ca_file = str(self._settings.get(TLS_CA_FILE.key, ""))
        self._processes: list[_Process] = []
        self._draw_ports()
        self._channels = ChannelPool(ClientSettings.from_configuration(self._admin_config()))

    def _draw_ports(self) -> None:
        """Every port of the cluster, drawn at once (all distinct: gRPC servers share a port
        silently), and the daemons' configs that name them."""
        coordinators, workers = self._coordinators, self._workers
        coordinator_names = ["coordinator", *(f"coordinator-{i}" for i in range(1, coordinators))]
        worker_names = [f"worker-{i}" for i in range(workers)]
        ports = free_ports(
            coordinators
            + 2 * workers
            + (coordinators + workers if self._metrics else 0)
            + (1 if self._status_page else 0)
        )
        self.status_port = ports.pop() if self._status_page else None
        self.coordinator_targets = [f"127.0.0.1:{port}" for port in ports[:coordinators]]
        # The option's value: every coordinator, comma-separated.
        self.coordinator_address = ",".join(self.coordinator_targets)
        self.worker_ports = ports[coordinators : coordinators + workers]
        self.worker_data_ports = ports[coordinators + workers : coordinators + 2 * workers]
        shared: dict[str, object] = {
            "external-shuffle.coordinator.address": self.coordinator_address,
            "external-shuffle.auth.token-file": str(self.token_file),
            "external-shuffle.daemon.metrics-port": -1,
            "external-shuffle.coordinator.worker-timeout": 5.0,
            "external-shuffle.worker.heartbeat-interval": 0.5,
            "external-shuffle.daemon.shutdown-grace": 5.0,
            **self._settings,
        }
        # metrics: each process serves /metrics on a port of its own (by process name).
        self.metrics_ports: dict[str, int] = {}
        if self._metrics:
            names = [*coordinator_names, *worker_names]
            self.metrics_ports = dict(zip(names, ports[coordinators + 2 * workers :], strict=True))
        self._processes = [
            self._process(
                name,
                "coordinator",
                {
                    **shared,
                    **self._metrics_setting(name),
                    **self._status_page_setting(name),
                    "external-shuffle.coordinator.port": int(target.rpartition(":")[2]),
                },
            )
            for name, target in zip(coordinator_names, self.coordinator_targets, strict=True)
        ]
        for index, port in enumerate(self.worker_ports):
            self._processes.append(
                self._process(
                    f"worker-{index}",
                    "worker",
                    {
                        **shared,
                        **self._metrics_setting(f"worker-{index}"),
                        "external-shuffle.worker.port": port,
                        "external-shuffle.worker.data-port": self.worker_data_ports[index],
                        "external-shuffle.worker.store-url": self.worker_store_url(index),
                        "external-shuffle.worker.store-shared": self._store_shared,
                    },
                )
            )

    def _metrics_setting(self, name: str) -> dict[str, object]:
        if name not in self.metrics_ports:
            return {}
        return {"external-shuffle.daemon.metrics-port": self.metrics_ports[name]}

    def _status_page_setting(self, name: str) -> dict[str, object]:
        if self.status_port is None or name != "coordinator":
            return {}
        return {"external-shuffle.coordinator.status-port": self.status_port}

    def _process(self, name: str, role: str, values: Mapping[str, object]) -> _Process:
        config = _write_toml(self.directory / f"{name}.toml", values)
        return _Process(name, role, config, self.directory / f"{name}.log")

    def client_config_file(self, **extra: object) -> Path:
        """:meth:`client_config` as a TOML file (``client.toml`` in the cluster's directory)."""
        return _write_toml(self.directory / "client.toml", self.client_config(**extra))

    def _admin_config(self) -> Configuration:
        return Configuration.load(
            {
                "external-shuffle.coordinator.address": self.coordinator_address,
                "external-shuffle.auth.token-file": str(self.token_file),
                "external-shuffle.client.timeout": 5.0,
                # TLS daemons: the health checks and admin calls trust their CA.
                TLS_CA_FILE.key: self._ca_file,
            },
            environ={},
        )

    def client_config(self, **extra: object) -> dict[str, object]:
        """pyshuffle options of a client of this cluster."""
        return {
            "shuffle-service-factory.class": "external_shuffle",
            "external-shuffle.coordinator.address": self.coordinator_address,
            "external-shuffle.auth.token-file": str(self.token_file),
            **extra,
        }

    def worker_store(self, index: int) -> Path:
        """A worker's store directory (when the cluster has no ``store_root``)."""
        return self.directory / f"worker-{index}-store"

    def worker_store_url(self, index: int) -> str:
        if self._store_root is None:
            return str(self.worker_store(index))
        return f"{self._store_root.rstrip('/')}/worker-{index}"

    def worker_target(self, index: int) -> str:
        return f"127.0.0.1:{self.worker_ports[index]}"

    # --- processes ----------------------------------------------------------------------------

    def _launch(self, process: _Process) -> None:
        log = process.log.open("ab")
        process.log_start = log.tell()
        process.popen = subprocess.Popen(
            [
                *(sys.executable, "-m", daemon_main.__name__),
                *("--role", process.role, "--config", str(process.config)),
            ],
            stdout=log,
            stderr=log,
            env={k: v for k, v in os.environ.items() if not k.startswith("PYSHUFFLE_")},
        )
        log.close()

    def _port(self, process: _Process) -> str:
        if process.role == "coordinator":
            return self.coordinator_targets[self._processes.index(process)]
        return self.worker_target(self._worker_index(process))

    @staticmethod
    def _worker_index(process: _Process) -> int:
        return int(process.name.rsplit("-", 1)[1])

    def _wait_serving(self, process: _Process) -> None:
        deadline = time.monotonic() + _START_TIMEOUT
        stub = health_pb2_grpc.HealthStub(self._channels.get(self._port(process)))
        while time.monotonic() < deadline:
            assert process.popen is not None
            if process.popen.poll() is not None:
                raise ShuffleError(f"{process.name} exited at start:\n{self._tail(process)}")
            try:
                answer = stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                if answer.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
        raise ShuffleError(f"{process.name} did not start serving:\n{self._tail(process)}")

    def _tail(self, process: _Process) -> str:
        with process.log.open("rb") as log:
            log.seek(process.log_start)
            lines = log.read().decode(errors="replace").splitlines()
        return "\n".join(lines[-20:])

    def coordinator_stub(self, index: int = 0) -> pb_grpc.CoordinatorStub:
        """A stub of a coordinator, on a channel that carries the token."""
        return pb_grpc.CoordinatorStub(self._channels.get(self.coordinator_targets[index]))

    def alive_workers(self, coordinator: int = 0) -> set[str]:
        """Targets of the workers a coordinator sees alive."""
        answer = self.coordinator_stub(coordinator).ListWorkers(
            pb.ListWorkersRequest(), timeout=5.0
        )
        return {
            f"{entry.worker.host}:{entry.worker.port}" for entry in answer.workers if entry.alive
        }

    def wait_for_workers(self, targets: set[str], *, alive: bool = True) -> None:
        """Until every running coordinator sees ``targets`` alive (or none of them)."""
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            views = [
                self.alive_workers(index)
                for index, process in enumerate(self._processes[: len(self.coordinator_targets)])
                if process.popen is not None and process.popen.poll() is None
            ]
            if all((targets <= seen) if alive else not (targets & seen) for seen in views):
                return
            time.sleep(0.1)
        raise ShuffleError(f"workers {sorted(targets)} never became {'alive' if alive else 'dead'}")

    def start(self) -> Self:
        for attempt in range(1, _START_ATTEMPTS + 1):
            try:
                self._start_processes()
                break
            except ShuffleError as error:
                if attempt == _START_ATTEMPTS or not address_in_use(str(error)):
                    raise
                # Another process took a port between its drawing and the daemon's bind.
                logger.warning("a port was taken at start; drawing others: %s", error)
                for process in self._processes:
                    self._terminate(process)
                self._draw_ports()
        self.wait_for_workers({self.worker_target(i) for i in range(len(self.worker_ports))})
        return self

    def _start_processes(self) -> None:
        for process in self._processes:
            self._launch(process)
        for process in self._processes:
            self._wait_serving(process)

    @property
    def daemons(self) -> tuple[str, ...]:
        return tuple(process.name for process in self._processes)

    def _named(self, daemon: str) -> _Process:
        for process in self._processes:
            if process.name == daemon:
                return process
        raise ShuffleError(f"no daemon {daemon!r} in this cluster: {', '.join(self.daemons)}")

    def kill(self, daemon: str) -> None:
        self._kill(self._named(daemon))

    def terminate(self, daemon: str) -> int:
        return self._terminate(self._named(daemon))

    def restart(self, daemon: str) -> None:
        process = self._named(daemon)
        self._launch(process)
        self._wait_serving(process)
        if process.role == "worker":
            self.wait_for_workers({self._port(process)})

    def running(self, daemon: str) -> bool:
        popen = self._named(daemon).popen
        return popen is not None and popen.poll() is None

    def process_id(self, daemon: str) -> int | None:
        popen = self._named(daemon).popen
        return popen.pid if popen is not None and popen.poll() is None else None

    def ports(self, daemon: str) -> tuple[int, ...]:
        process = self._named(daemon)
        metrics = (self.metrics_ports[daemon],) if daemon in self.metrics_ports else ()
        if process.role == "coordinator":
            index = self._processes.index(process)
            status = (self.status_port,) if index == 0 and self.status_port is not None else ()
            return (int(self.coordinator_targets[index].rpartition(":")[2]), *status, *metrics)
        index = self._worker_index(process)
        return (self.worker_ports[index], self.worker_data_ports[index], *metrics)

    def store_directories(self) -> dict[str, Path]:
        if self._store_root is not None:
            return {}
        return {
            f"worker-{index}": self.worker_store(index) for index in range(len(self.worker_ports))
        }

    def partition_files(self, index: int) -> list[Path]:
        """Files of partitions on a worker's local store (not its identity file). A directory
        the worker deletes during the walk is skipped (``os.walk`` ignores it; ``rglob``
        raises)."""
        return sorted(
            Path(directory, name)
            for directory, _, names in os.walk(self.worker_store(index))
            for name in names
            if not name.startswith(".")
        )

    def stored_files(self) -> list[str]:
        if self._store_root is not None:
            raise ShuffleError("stored_files lists the workers' local stores only")
        return [
            str(path)
            for index in range(len(self.worker_ports))
            for path in self.partition_files(index)
        ]

    def _worker(self, index: int) -> _Process:
        return self._processes[len(self.coordinator_targets) + index]

    def worker_pid(self, index: int) -> int:
        process = self._worker(index)
        assert process.popen is not None
        return process.popen.pid

    def worker_running(self, index: int) -> bool:
        popen = self._worker(index).popen
        return popen is not None and popen.poll() is None

    def kill_worker(self, index: int) -> None:
        """SIGKILL: the worker dies without a word (its store stays)."""
        self.kill(self._worker(index).name)

    def stop_worker(self, index: int) -> int:
        """SIGTERM: the worker drains and exits; returns its exit code."""
        return self.terminate(self._worker(index).name)

    def kill_coordinator(self, index: int = 0) -> None:
        """SIGKILL: the coordinator dies without a word, and with it all it knew."""
        self.kill(self._processes[index].name)

    def stop_coordinator(self, index: int = 0) -> int:
        """SIGTERM: the coordinator drains and exits; returns its exit code."""
        return self.terminate(self._processes[index].name)

    def start_coordinator(self, index: int = 0) -> None:
        """(Re)start a coordinator on its port; it knows nothing until told."""
        self.restart(self._processes[index].name)

    @staticmethod
    def _kill(process: _Process) -> None:
        assert process.popen is not None
        process.popen.kill()
        process.popen.wait()

    def start_worker(self, index: int) -> None:
        """(Re)start a worker on its port and store."""
        self.restart(self._worker(index).name)

    def _terminate(self, process: _Process) -> int:
        if process.popen is None or process.popen.poll() is not None:
            return 0 if process.popen is None else process.popen.returncode
        process.popen.send_signal(signal.SIGTERM)
        try:
            return process.popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.popen.kill()
            process.popen.wait()
            raise ShuffleError(f"{process.name} ignored SIGTERM:\n{self._tail(process)}") from None

    def stop(self) -> None:
        self._channels.close()
        for process in reversed(self._processes):
            self._terminate(process)


# What a chaos run breaks: a worker or a coordinator may go at any moment, so each partition
# has two replicas and two coordinators answer; failures are seen within seconds.
_CHAOS_SETTINGS: Mapping[str, object] = {
    "external-shuffle.worker.heartbeat-interval": 0.25,
    "external-shuffle.coordinator.worker-timeout": 3.0,
}


def chaos_deployment(directory: Path, settings: Mapping[str, object]) -> LocalCluster:
    """The ``pyshuffle.local_deployments`` entry of the external service: three workers and
    two coordinators, failures seen within seconds."""
    return LocalCluster(
        directory, workers=3, coordinators=2, settings={**_CHAOS_SETTINGS, **settings}
    )
