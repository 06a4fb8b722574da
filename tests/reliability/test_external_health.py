"""``/healthz`` and ``/readyz`` as Kubernetes' probes ask real daemons: no token, nothing said but
ok or why not; a worker is ready only while a coordinator knows it and it takes partitions."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from external_shuffle.local_cluster import LocalCluster
from external_shuffle.wire.stubs import pb, pb_grpc
from tests.eventually import eventually

DAEMONS = ("coordinator", "worker-0")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory = tmp_path_factory.mktemp("health")
    with LocalCluster(directory, workers=1, metrics=True, status_page=True) as running:
        yield running


@pytest.fixture(scope="module")
def status_port(cluster: LocalCluster) -> int:
    assert cluster.status_port is not None
    return cluster.status_port


def _get(port: int, path: str) -> tuple[int, str]:
    """Status and body of ``GET path``, with no credentials."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _ready(port: int) -> bool:
    return _get(port, "/readyz") == (200, "ready\n")


def test_every_http_port_answers_the_probes_without_a_token(
    cluster: LocalCluster, status_port: int
) -> None:
    for port in [*(cluster.metrics_ports[name] for name in DAEMONS), status_port]:
        assert _get(port, "/healthz") == (200, "ok\n")
        eventually(lambda: _ready(port), f"ready on {port}")  # noqa: B023 (called at once)


def test_an_idle_connection_to_the_metrics_port_is_closed(cluster: LocalCluster) -> None:
    port = cluster.metrics_ports["worker-0"]
    idle = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(20)]
    half_sent = socket.create_connection(("127.0.0.1", port), timeout=30)
    half_sent.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never ends its headers
    started = time.monotonic()
    assert _get(port, "/healthz") == (200, "ok\n"), "served beside them"
    for connection in [*idle, half_sent]:
        with connection:
            assert connection.recv(1) == b"", "closed by the daemon, its thread ended"
    assert time.monotonic() - started < 25


def test_only_the_probes_skip_the_status_pages_token(
    status_port: int, cluster: LocalCluster
) -> None:
    port = status_port
    for path in ("/", "/status", "/healthz/", "/readyz/x", "/metrics"):
        assert _get(port, path)[0] == 401, path


def test_a_worker_no_coordinator_knows_is_alive_but_not_ready(cluster: LocalCluster) -> None:
    port = cluster.metrics_ports["worker-0"]
    cluster.kill_coordinator()
    try:
        eventually(lambda: _get(port, "/readyz")[0] == 503, "the worker not ready")
        assert _get(port, "/readyz")[1] == (
            "not ready: the worker is registered with no coordinator\n"
        )
        assert _get(port, "/healthz") == (200, "ok\n")
    finally:
        cluster.start_coordinator()
    eventually(lambda: _ready(port), "the worker ready again")


def _decommission(cluster: LocalCluster, *, cancel: bool = False) -> None:
    token = cluster.token_file.read_text().strip()
    with grpc.insecure_channel(cluster.worker_target(0)) as channel:
        pb_grpc.WorkerStub(channel).Decommission(
            pb.DecommissionRequest(cancel=cancel),
            metadata=[("authorization", f"Bearer {token}")],
            timeout=10,
        )


def test_a_decommissioned_worker_is_not_ready_until_cancelled(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, workers=1, metrics=True) as cluster:
        _decommission(cluster)
        port = cluster.metrics_ports["worker-0"]
        assert _get(port, "/readyz") == (
            503,
            "not ready: the worker is decommissioning: it takes no new partitions\n",
        )
        assert _get(port, "/healthz") == (200, "ok\n")
        # The coordinator on its own still serves.
        assert _ready(cluster.metrics_ports["coordinator"])
        _decommission(cluster, cancel=True)
        assert _ready(port)
