"""What the daemons export to Prometheus: each role its own metrics, stream latencies, disk,
refused calls (counted and logged), and every metric the Grafana dashboard in deploy/ queries."""

from __future__ import annotations

import importlib.metadata
import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import promql_parser
import pytest

from external_shuffle.local_cluster import LocalCluster
from external_shuffle.wire.stubs import pb, pb_grpc
from tests.metric_samples import sample_names
from tests.reliability.external_cluster import (
    ALL,
    PARTITIONS,
    ROWS,
    SUBPARTITIONS,
    batches,
    rows_of,
    scenario_on,
    scrape,
)
from tests.reliability.raw_worker import code_of

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "pyshuffle-dashboard.json"
WORKERS = 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("metrics"), workers=WORKERS, metrics=True) as running:
        # Traffic first: a job that pushes and fetches, so every metric has been touched.
        with scenario_on(running) as scenario:
            descriptors, _ = scenario.produce(
                batches(), partitions=PARTITIONS, subpartitions=SUBPARTITIONS
            )
            assert rows_of(scenario.read(scenario.consumer, descriptors, ALL)) == list(range(ROWS))
        yield running


def _names(samples: dict[str, float]) -> set[str]:
    return {sample.partition("{")[0] for sample in samples}


def _workers(cluster: LocalCluster) -> list[dict[str, float]]:
    return [scrape(cluster, f"worker-{index}") for index in range(WORKERS)]


def test_each_role_exports_its_own_metrics(cluster: LocalCluster) -> None:
    coordinator = _names(scrape(cluster, "coordinator"))
    assert {"pyshuffle_workers_alive", "pyshuffle_applications"} <= coordinator
    assert not {
        name for name in coordinator if name.startswith(("pyshuffle_bytes_", "pyshuffle_push_"))
    }
    for worker in map(_names, _workers(cluster)):
        assert {"pyshuffle_bytes_in_total", "pyshuffle_store_free_bytes"} <= worker
        assert not {"pyshuffle_workers_alive", "pyshuffle_applications"} & worker


def test_each_daemon_exports_its_process_and_build(cluster: LocalCluster) -> None:
    version = importlib.metadata.version("pyshuffle")
    for name, roles in (("coordinator", "coordinator"), ("worker-0", "worker")):
        samples = scrape(cluster, name)
        assert samples[f'pyshuffle_build_info{{roles="{roles}",version="{version}"}}'] == 1
        assert samples["process_resident_memory_bytes"] > 10 << 20
        assert samples["process_open_fds"] > 0
        assert samples["process_cpu_seconds_total"] > 0
        assert any(sample.startswith("python_info{") for sample in samples)


def test_workers_export_stream_latencies_and_disk(cluster: LocalCluster) -> None:
    workers = _workers(cluster)
    # One push (a PushPartition call, these partitions being under a chunk) per partition and
    # replica (two replicas, the default), and a fetch stream per partition read.
    assert sum(worker["pyshuffle_push_seconds_count"] for worker in workers) >= PARTITIONS
    assert sum(worker["pyshuffle_fetch_seconds_count"] for worker in workers) >= PARTITIONS
    for worker in workers:
        assert worker["pyshuffle_store_free_bytes"] > 0
        assert worker["pyshuffle_open_streams"] == 0


def _auth_failures(cluster: LocalCluster, method: str) -> float:
    return sum(
        value
        for sample, value in scrape(cluster, "worker-0").items()
        if sample.startswith("pyshuffle_auth_failures_total{") and f'{method}"' in sample
    )


def test_a_call_with_a_wrong_token_is_counted_and_logged(cluster: LocalCluster) -> None:
    method = "Worker/GetPartitionStatus"
    before = _auth_failures(cluster, method)
    with grpc.insecure_channel(cluster.worker_target(0)) as channel:
        stub = pb_grpc.WorkerStub(channel)
        code = code_of(
            lambda: stub.GetPartitionStatus(
                pb.WorkerPartitionStatusRequest(),
                metadata=[("authorization", "Bearer not-the-token")],
                timeout=10,
            )
        )
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert _auth_failures(cluster, method) == before + 1
    log = (cluster.directory / "worker-0.log").read_text()
    assert re.search(rf"refused /\S+{re.escape(method)} from \S+: wrong token", log)


def _exported(cluster: LocalCluster, name: str) -> set[str]:
    """Every sample name one daemon exports or will (a labelled metric with no sample yet
    has only its HELP and TYPE lines)."""
    url = f"http://127.0.0.1:{cluster.metrics_ports[name]}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        lines = response.read().decode().splitlines()
    names = {line.partition(" ")[0].partition("{")[0] for line in lines if not line.startswith("#")}
    for line in lines:
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split(" ")
            names.update(sample_names(family, kind))
    return names


def test_every_dashboard_panel_queries_a_metric_the_daemons_export(
    cluster: LocalCluster,
) -> None:
    daemons = ["coordinator", *(f"worker-{index}" for index in range(WORKERS))]
    exported = set().union(*(_exported(cluster, name) for name in daemons))
    panels = json.loads(DASHBOARD.read_text())["panels"]
    assert panels
    for panel in panels:
        queried = {
            name
            for target in panel["targets"]
            for name in re.findall(r"\bpyshuffle_\w+", target["expr"])
        }
        assert queried, f"panel {panel['title']!r} queries no pyshuffle metric"
        assert queried <= exported, f"panel {panel['title']!r}: {sorted(queried - exported)}"


def test_every_dashboard_query_parses_and_keeps_to_the_chosen_daemons() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    [instance] = [v for v in dashboard["templating"]["list"] if v["name"] == "instance"]
    assert "pyshuffle_build_info" in instance["definition"]
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expression = target["expr"]
            promql_parser.parse(expression.replace("$instance", ".*"))  # as Grafana sends it
            selectors = re.findall(r"\bpyshuffle_\w+(\{[^}]*\})?", expression)
            assert selectors, f"panel {panel['title']!r} queries no pyshuffle metric"
            assert all('instance=~"$instance"' in found for found in selectors), expression
