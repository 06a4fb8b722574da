"""Clients and daemons of different wire versions (``external_shuffle.wire.version``).

The previous wire version's client is pyshuffle itself as it was at PREVIOUS_WIRE_COMMIT
(before calls carried a version), taken from this repository's history and run in a process of
its own against today's daemons: it writes and reads its own partitions, reads today's, and
today's client reads its. A client newer than the daemon is refused, typed, on every kind of
call."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pyarrow as pa
import pytest

from external_shuffle.local_cluster import LocalCluster
from external_shuffle.wire.channels import translate_rpc_error
from external_shuffle.wire.stubs import pb, pb_grpc
from external_shuffle.wire.version import WIRE_VERSION, WIRE_VERSION_HEADER
from shuffle_api import (
    InputGateDeploymentDescriptor,
    ResultPartitionType,
    ShuffleDescriptor,
    ShuffleIOOwner,
    SubpartitionRange,
    UnsupportedFormatVersionError,
    deserialize,
    serialize,
)
from shuffle_api.testing import make_batches
from tests.reliability.external_cluster import rows_of, scenario_on
from tests.reliability.raw_worker import auth, build_partition, push_requests
from tests.source_tree import ROOT

PREVIOUS_WIRE_COMMIT = "36cb3f9ba176497bd2e11f37bb7412e50a375bf2"
"""The last commit of wire version 1 (calls carry no version)."""
CLIENT_PACKAGES = ("shuffle_api", "external_shuffle", "scheduling", "blob")
SUBPARTITIONS = 3
EVERYTHING = SubpartitionRange(0, SUBPARTITIONS - 1)

# Runs in the previous version's source tree: its own round trip, a read of today's
# partitions, then its partitions for today's client, kept until told "done".
PREVIOUS_CLIENT = """
import json, sys
import external_shuffle
from shuffle_api import (Configuration, InputGateDeploymentDescriptor, ResultPartitionType,
    ShuffleIOOwner, SubpartitionRange, deserialize, serialize)
from shuffle_api.testing import ConformanceHarness, ShuffleScenario, make_batches

asked = json.loads(sys.stdin.readline())
everything = SubpartitionRange(0, asked["subpartitions"] - 1)
configuration = Configuration.load(asked["config"], environ={})

def rows(environment, result_id, descriptors):
    [gate] = environment.create_input_gates(ShuffleIOOwner("reader", "previous"), [
        InputGateDeploymentDescriptor(result_id, ResultPartitionType.BLOCKING, everything,
            tuple(descriptors))])
    with gate:
        return sorted(row for batch in gate for row in batch.column("row").to_pylist())

with ShuffleScenario.open(ConformanceHarness(configuration)) as scenario:
    written, _ = scenario.produce(make_batches(asked["rows"], batch_rows=500, seed=11),
        partitions=2, subpartitions=asked["subpartitions"])
    theirs = [deserialize(bytes.fromhex(text)) for text in asked["descriptors"]]
    print(json.dumps({
        "module": external_shuffle.__file__,
        "own": rows(scenario.consumer, scenario.result_id, written),
        "theirs": rows(scenario.consumer, asked["result_id"], theirs),
        "result_id": scenario.result_id,
        "descriptors": [serialize(descriptor).hex() for descriptor in written],
    }), flush=True)
    assert sys.stdin.readline().strip() == "done"
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("versions"), workers=2) as running:
        yield running


def _shuffle_descriptor(text: str) -> ShuffleDescriptor:
    descriptor = deserialize(bytes.fromhex(text))
    assert isinstance(descriptor, ShuffleDescriptor)
    return descriptor


def _git(*arguments: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(ROOT), *arguments], capture_output=True, check=False)


def _previous_source(destination: Path) -> Path:
    """The client packages as they were at PREVIOUS_WIRE_COMMIT, under ``destination``."""
    if _git("cat-file", "-e", f"{PREVIOUS_WIRE_COMMIT}^{{commit}}").returncode:
        _git("fetch", "--quiet", "origin", PREVIOUS_WIRE_COMMIT)  # a shallow clone
    archive = _git("archive", "--format=tar", PREVIOUS_WIRE_COMMIT, *CLIENT_PACKAGES)
    assert archive.returncode == 0, (
        f"this test needs the repository's history back to {PREVIOUS_WIRE_COMMIT[:12]}:"
        f" {archive.stderr.decode(errors='replace')}"
    )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(destination, filter="data")
    return destination


def test_a_client_of_the_previous_wire_version_works_with_todays_daemons(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    previous = _previous_source(tmp_path / "previous")
    assert not (previous / "external_shuffle" / "wire").exists(), "a tree of wire version 1"
    # First on the path: the previous tree shadows today's (installed in development mode).
    environment = {**os.environ, "PYTHONPATH": str(previous)}
    with scenario_on(cluster) as today:
        written, _ = today.produce(
            make_batches(3_000, batch_rows=500), partitions=2, subpartitions=SUBPARTITIONS
        )
        asked = {
            "config": cluster.client_config(**{"external-shuffle.replication-factor": 2}),
            "subpartitions": SUBPARTITIONS,
            "rows": 2_000,
            "result_id": today.result_id,
            "descriptors": [serialize(descriptor).hex() for descriptor in written],
        }
        client = subprocess.Popen(
            [sys.executable, "-c", PREVIOUS_CLIENT],
            cwd=tmp_path,
            env=environment,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert client.stdin is not None and client.stdout is not None
            client.stdin.write(json.dumps(asked) + "\n")
            client.stdin.flush()
            answer = client.stdout.readline()
            assert answer, client.stderr.read() if client.stderr else "no answer"
            told = json.loads(answer)
            assert Path(told["module"]).is_relative_to(previous)
            assert told["own"] == list(range(2_000))
            assert told["theirs"] == list(range(3_000))
            # Today's client reads what the previous one wrote.
            [gate] = today.consumer.create_input_gates(
                ShuffleIOOwner("reader", "today"),
                [
                    InputGateDeploymentDescriptor(
                        told["result_id"],
                        ResultPartitionType.BLOCKING,
                        EVERYTHING,
                        tuple(_shuffle_descriptor(text) for text in told["descriptors"]),
                    )
                ],
            )
            with gate:
                assert rows_of(pa.Table.from_batches(list(gate))) == list(range(2_000))
            client.stdin.write("done\n")
            client.stdin.flush()
            assert client.wait(120) == 0, client.stderr.read() if client.stderr else ""
        finally:
            if client.poll() is None:
                client.kill()
                client.wait()
        assert rows_of(today.read(today.consumer, written, EVERYTHING)) == list(range(3_000))


def _metadata(cluster: LocalCluster, version: str) -> list[tuple[str, str]]:
    return [*auth(cluster), (WIRE_VERSION_HEADER, version)]


@pytest.mark.parametrize("version", [str(WIRE_VERSION + 1), "99999999", "two"])
@pytest.mark.parametrize("kind", ["unary", "client stream", "server stream"])
def test_a_client_of_a_wire_version_the_daemon_does_not_serve_is_refused_typed(
    cluster: LocalCluster, kind: str, version: str
) -> None:
    metadata = _metadata(cluster, version)
    built = build_partition(rows=200)
    with (
        grpc.insecure_channel(cluster.coordinator_targets[0]) as coordinator_channel,
        grpc.insecure_channel(cluster.worker_target(0)) as worker_channel,
    ):
        coordinator = pb_grpc.CoordinatorStub(coordinator_channel)
        worker = pb_grpc.WorkerStub(worker_channel)
        with pytest.raises(grpc.RpcError) as refused:
            if kind == "unary":
                coordinator.ListWorkers(pb.ListWorkersRequest(), metadata=metadata, timeout=10)
            elif kind == "client stream":
                chunks = built.chunks()
                worker.PushData(
                    push_requests(built.key, chunks, range(len(chunks))),
                    metadata=metadata,
                    timeout=10,
                )
            else:
                list(
                    worker.FetchData(
                        pb.FetchDataRequest(partition=built.key), metadata=metadata, timeout=10
                    )
                )
        # The same call of today's version goes through.
        coordinator.ListWorkers(
            pb.ListWorkersRequest(), metadata=_metadata(cluster, str(WIRE_VERSION)), timeout=10
        )
    error = translate_rpc_error(refused.value, kind)
    assert isinstance(error, UnsupportedFormatVersionError)
    if version.isdigit() and len(version) <= 6:
        assert f"wire version {version}" in str(error) and f"1 to {WIRE_VERSION}" in str(error)
    else:
        assert "is not a version" in str(error)
