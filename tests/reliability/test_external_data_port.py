"""The worker's data port on real daemons: it serves what gRPC serves, and under hostile or
careless peers it holds what the gRPC port holds (the token, typed errors, bounded connections
and threads, no path outside the store); a client that cannot reach it fetches over gRPC."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import xxhash

from external_shuffle.client import gate as external_gate
from external_shuffle.client.descriptor import ExternalShuffleDescriptor
from external_shuffle.client.fetch import (
    DataPortUnreachableError,
    FetchedRun,
    Received,
    fetch_over_data_port,
)
from external_shuffle.local_cluster import LocalCluster
from external_shuffle.wire.data_frames import FAILED, FETCH, FETCH_BATCH, MANIFEST
from external_shuffle.wire.errors import TooManyStreamsError, error_from_pb
from external_shuffle.wire.messages import WorkerAddress
from external_shuffle.wire.stubs import pb, pb_grpc
from shuffle_api import (
    AuthenticationError,
    ChecksumMismatchError,
    DataTooLargeError,
    InvalidIdentifierError,
    PartitionNotFoundError,
    SerializationError,
    ShuffleError,
    TransportError,
)
from shuffle_runtime.connections import ConnectionPool
from shuffle_runtime.format import PartitionManifest, partition_directory
from shuffle_runtime.format.manifest import DATA_FILE
from shuffle_runtime.gate import END_OF_PARTITION
from shuffle_runtime.sockets import (
    CHALLENGE,
    MAX_BATCH,
    REFUSED,
    open_handshake,
    read_frame,
    write_frame,
)
from shuffle_runtime.store import Store
from tests.eventually import eventually
from tests.refused_port import refused_port
from tests.reliability.external_cluster import (
    ALL,
    batches,
    list_workers,
    replicas,
    rows_of,
    scenario_on,
    scrape,
)
from tests.reliability.raw_worker import (
    SUBPARTITIONS,
    BuiltPartition,
    auth,
    build_partition,
    commit,
    fetch_all,
    new_partition,
    push,
)

IDLE_TIMEOUT = 2.0
MAX_STREAMS = 6


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    settings = {
        "external-shuffle.worker.stream-idle-timeout": IDLE_TIMEOUT,
        "external-shuffle.worker.max-streams": MAX_STREAMS,
    }
    directory = tmp_path_factory.mktemp("data-port")
    with LocalCluster(directory, workers=1, settings=settings, metrics=True) as running:
        yield running


@pytest.fixture(scope="module")
def address(cluster: LocalCluster) -> WorkerAddress:
    [entry] = list_workers(cluster)
    worker = WorkerAddress.from_pb(entry.worker)
    assert worker.data_port == cluster.worker_data_ports[0]
    return worker


@pytest.fixture(scope="module")
def secret(cluster: LocalCluster) -> bytes:
    return cluster.token_file.read_text().strip().encode()


@pytest.fixture(scope="module")
def stored(cluster: LocalCluster, worker: pb_grpc.WorkerStub) -> BuiltPartition:
    built = build_partition(rows=4_000)
    push(cluster, worker, built)
    commit(cluster, worker, built)
    return built


@pytest.fixture(scope="module")
def large(cluster: LocalCluster, worker: pb_grpc.WorkerStub) -> BuiltPartition:
    """Far more than the sockets between a worker and a client that reads nothing hold."""
    built = build_partition(rows=600_000, memory_budget=8 << 20)
    push(cluster, worker, built)
    commit(cluster, worker, built)
    return built


def _request(built: BuiltPartition, first: int = 0, last: int = SUBPARTITIONS - 1) -> bytes:
    return pb.FetchDataRequest(
        partition=built.key, first_subpartition=first, last_subpartition=last
    ).SerializeToString()


def _fetch(address: WorkerAddress, secret: bytes, *requests: bytes) -> list[Received]:
    connections = ConnectionPool(secret)
    try:
        return _fetch_on(connections, address, *requests)
    finally:
        connections.close()


def _fetch_on(
    connections: ConnectionPool, address: WorkerAddress, *requests: bytes
) -> list[Received]:
    """What the worker sends for ``requests``, asked in one request."""
    return [
        answer
        for answer in fetch_over_data_port(
            address,
            [(pb.FetchDataRequest.FromString(request), new_partition()) for request in requests],
            connections=connections,
            timeout=10,
            max_frame_size=64 << 20,
        )
        if answer is not END_OF_PARTITION
    ]


def _connect(address: WorkerAddress) -> socket.socket:
    return socket.create_connection((address.host, address.data_port), timeout=10)


def _authenticated(address: WorkerAddress, secret: bytes) -> socket.socket:
    sock = _connect(address)
    open_handshake(sock, secret, "the worker")
    return sock


def _failure(sock: socket.socket) -> ShuffleError:
    """The error a FAILED frame reports; the worker then hangs up."""
    frame = read_frame(sock, 1 << 20)
    assert frame is not None
    frame_type, body = frame
    assert frame_type == FAILED
    assert sock.recv(1) == b""
    return error_from_pb(pb.DataPortError.FromString(bytes(body)), "test", None)


def _serves(address: WorkerAddress, secret: bytes, built: BuiltPartition) -> None:
    received = _fetch(address, secret, _request(built))
    runs = [item for item in received if isinstance(item, FetchedRun)]
    assert runs and all(xxhash.xxh3_64_intdigest(run.data) == run.checksum for run in runs)


# --- what it serves ------------------------------------------------------------------------------


def test_a_fetch_over_the_data_port_gets_what_grpc_gets(
    cluster: LocalCluster,
    worker: pb_grpc.WorkerStub,
    address: WorkerAddress,
    secret: bytes,
    stored: BuiltPartition,
) -> None:
    manifest, grpc_runs = fetch_all(worker, stored.key, auth(cluster))
    received = _fetch(address, secret, _request(stored))
    assert received[0] == PartitionManifest.from_json(manifest, "gRPC", statistics=False)
    runs = [
        (run.data.to_pybytes(), run.checksum) for run in received if isinstance(run, FetchedRun)
    ]
    assert len(runs) == len(received) - 1 > SUBPARTITIONS
    assert runs == grpc_runs
    # One subpartition: only its runs.
    one = _fetch(address, secret, _request(stored, 2, 2))
    assert 0 < len(one) - 1 < len(runs)


def test_a_process_decodes_a_partition_s_manifest_once_for_all_its_fetches(
    address: WorkerAddress, secret: bytes, stored: BuiltPartition
) -> None:
    """Each reducer of a map output gets its manifest with its block: decoding it (JSON,
    base64, the Arrow schema) cost more than a small block."""
    partition = new_partition()
    connections = ConnectionPool(secret)

    def manifest_of(request: bytes) -> PartitionManifest:
        answers = fetch_over_data_port(
            address,
            [(pb.FetchDataRequest.FromString(request), partition)],
            connections=connections,
            timeout=10,
            max_frame_size=64 << 20,
        )
        [manifest] = [answer for answer in answers if isinstance(answer, PartitionManifest)]
        return manifest

    try:
        first, second = manifest_of(_request(stored, 0, 0)), manifest_of(_request(stored, 1, 1))
    finally:
        connections.close()
    assert first is second
    assert first.number_of_subpartitions == SUBPARTITIONS


def test_fetches_share_a_connection_and_survive_its_idle_close(
    cluster: LocalCluster, address: WorkerAddress, secret: bytes, stored: BuiltPartition
) -> None:
    def counted() -> tuple[float, float]:
        samples = scrape(cluster, "worker-0")
        return (
            samples.get("pyshuffle_data_port_connections_total", 0.0),
            samples.get("pyshuffle_fetch_seconds_count", 0.0),
        )

    connections = ConnectionPool(secret, max_idle_seconds=IDLE_TIMEOUT * 3)
    try:
        before = counted()
        fetches = [_fetch_on(connections, address, _request(stored)) for _ in range(5)]
        assert all(fetch == fetches[0] for fetch in fetches)
        # The worker counts a fetch once it has sent the end (the client may be faster).
        deadline = time.monotonic() + 10
        while (after := counted())[1] - before[1] < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (after[0] - before[0], after[1] - before[1]) == (1, 5)
        # The worker closes the idle connection; the next fetch finds it closed and opens one.
        time.sleep(IDLE_TIMEOUT * 2.5)  # a late worker thread still closes it (pool keeps 6 s)
        assert _fetch_on(connections, address, _request(stored)) == fetches[0]
        assert counted()[0] - after[0] == 1
    finally:
        connections.close()


def test_a_batch_gets_what_its_fetches_get_one_by_one_in_one_request(
    cluster: LocalCluster, address: WorkerAddress, secret: bytes, stored: BuiltPartition
) -> None:
    requests = [_request(stored, 2, 2), _request(stored), _request(stored, 0, 1)]
    one_by_one = [answer for request in requests for answer in _fetch(address, secret, request)]
    before = scrape(cluster, "worker-0").get("pyshuffle_data_port_requests_total", 0.0)

    batched = _fetch(address, secret, *requests)

    assert batched == one_by_one
    after = scrape(cluster, "worker-0").get("pyshuffle_data_port_requests_total", 0.0)
    assert after - before == 1


def test_a_batch_stops_at_a_missing_partition_with_its_error(
    address: WorkerAddress, secret: bytes, stored: BuiltPartition
) -> None:
    missing = build_partition(rows=100)  # never pushed
    answers: list[Received | None] = []
    connections = ConnectionPool(secret)
    try:
        with pytest.raises(PartitionNotFoundError):
            for answer in fetch_over_data_port(
                address,
                [
                    (pb.FetchDataRequest.FromString(_request(stored)), stored.partition),
                    (pb.FetchDataRequest.FromString(_request(missing)), missing.partition),
                    (pb.FetchDataRequest.FromString(_request(stored)), stored.partition),
                ],
                connections=connections,
                timeout=10,
                max_frame_size=64 << 20,
            ):
                answers.append(answer)
    finally:
        connections.close()
    # The first partition whole, then the error: nothing of the third.
    assert answers.count(END_OF_PARTITION) == 1 and answers[-1] is END_OF_PARTITION
    _serves(address, secret, stored)


def test_a_batch_of_none_or_too_many_fetches_is_refused(
    address: WorkerAddress, secret: bytes, stored: BuiltPartition
) -> None:
    request = pb.FetchDataRequest.FromString(_request(stored))
    for count in (0, MAX_BATCH + 1):
        with _authenticated(address, secret) as sock:
            batch = pb.FetchBatchRequest(fetches=[request] * count)
            write_frame(sock, FETCH_BATCH, batch.SerializeToString())
            assert isinstance(_failure(sock), SerializationError)
    _serves(address, secret, stored)


def test_a_reducer_asks_each_worker_once_for_its_partitions(
    cluster: LocalCluster, address: WorkerAddress, secret: bytes
) -> None:
    data = batches()
    expected = sorted(row for batch in data for row in batch.column("row").to_pylist())
    with scenario_on(cluster) as scenario:
        descriptors, _ = scenario.produce(data, partitions=12, subpartitions=2)
        before = scrape(cluster, "worker-0").get("pyshuffle_data_port_requests_total", 0.0)
        table = scenario.read(scenario.consumer, descriptors, ALL)
        after = scrape(cluster, "worker-0").get("pyshuffle_data_port_requests_total", 0.0)
    assert rows_of(table) == expected
    assert after - before == 1


@pytest.mark.parametrize("in_flight", [1, 2])
def test_a_reducer_asks_the_next_worker_ahead_within_its_budget(
    tmp_path: Path, in_flight: int
) -> None:
    """Partitions on two workers: when the reducer has its first rows from one, the other
    has been asked already with two sources in flight, and not with one; each is asked once."""
    data = batches()
    expected = sorted(row for batch in data for row in batch.column("row").to_pylist())
    with (
        LocalCluster(tmp_path, workers=2, metrics=True) as two,
        scenario_on(two, **{"shuffle.read.sources-in-flight": in_flight}) as scenario,
    ):
        descriptors, _ = scenario.produce(data, partitions=8, subpartitions=2)
        assert len({replicas(descriptor)[0].port for descriptor in descriptors}) == 2

        def requests() -> list[float]:
            return [
                scrape(two, name).get("pyshuffle_data_port_requests_total", 0.0)
                for name in ("worker-0", "worker-1")
            ]

        def asked_since(before: list[float]) -> list[float]:
            return sorted(now - then for now, then in zip(requests(), before, strict=True))

        before = requests()
        with scenario.gate(scenario.consumer, descriptors, ALL) as gate:
            reading = iter(gate)
            rows = next(reading).column("row").to_pylist()
            # A request sent ahead is counted by its worker a moment later; then no more
            # come while the reducer waits.
            ahead = [1, 1] if in_flight == 2 else [0, 1]
            eventually(lambda: asked_since(before) == ahead, f"workers asked {ahead} times")
            time.sleep(0.3)
            assert asked_since(before) == ahead
            rows.extend(row for batch in reading for row in batch.column("row").to_pylist())
        after = requests()
    assert [now - then for now, then in zip(after, before, strict=True)] == [1, 1]
    assert sorted(rows) == expected


def test_a_batch_cut_while_its_reader_paused_is_asked_again(
    cluster: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    # Far more than the sockets hold: the worker waits on the reader, then ends the batch.
    data = batches(rows=300_000)
    expected = sorted(row for batch in data for row in batch.column("row").to_pylist())
    with scenario_on(cluster) as scenario:
        descriptors, _ = scenario.produce(data, partitions=4, subpartitions=2)
        with (
            caplog.at_level(logging.INFO, logger="shuffle_runtime.gate"),
            scenario.gate(scenario.consumer, descriptors, ALL) as gate,
        ):
            reading = iter(gate)
            rows = next(reading).column("row").to_pylist()
            time.sleep(IDLE_TIMEOUT * 4)  # past the send timeout and the reaper, with margin
            rows.extend(row for batch in reading for row in batch.column("row").to_pylist())
    assert sorted(rows) == expected
    assert "asking again" in caplog.text


def test_a_batch_that_breaks_again_is_asked_once_more_then_given_up(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    with scenario_on(cluster) as scenario:
        descriptors, _ = scenario.produce(batches(), partitions=1, subpartitions=2)
        asked: list[int] = []

        def breaks(*args: Any, **kwargs: Any) -> Iterator[object]:
            """The worker's first answer (the manifest), then the batch ends."""
            asked.append(1)
            if len(asked) > 5:
                raise AssertionError("asked again and again")
            yield next(fetch_over_data_port(*args, **kwargs))
            raise TransportError("the worker ended the batch")

        monkeypatch.setattr(external_gate, "fetch_over_data_port", breaks)
        with pytest.raises(PartitionNotFoundError, match="could not be read from any replica"):
            scenario.read(scenario.consumer, descriptors, ALL)
    assert len(asked) == 2


def test_the_gate_reads_over_the_data_port_or_else_over_grpc(
    cluster: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    data = batches()
    expected = sorted(row for batch in data for row in batch.column("row").to_pylist())
    with scenario_on(cluster) as scenario:
        descriptors, _ = scenario.produce(data, partitions=2, subpartitions=2)
        assert all(
            replica.data_port
            for descriptor in descriptors
            if isinstance(descriptor, ExternalShuffleDescriptor)
            for replica in descriptor.replicas
        )
        assert rows_of(scenario.read(scenario.consumer, descriptors, ALL)) == expected
        # A data port the client cannot reach (a network that lets only gRPC through).
        with refused_port() as unreachable:
            blocked = [
                dataclasses.replace(
                    descriptor,
                    replicas=tuple(
                        dataclasses.replace(replica, data_port=unreachable)
                        for replica in descriptor.replicas
                    ),
                )
                for descriptor in descriptors
                if isinstance(descriptor, ExternalShuffleDescriptor)
            ]
            with caplog.at_level(logging.WARNING, logger="external_shuffle.client.gate"):
                table = scenario.read(scenario.consumer, blocked, ALL)
        assert rows_of(table) == expected
        assert "fetching from it over gRPC" in caplog.text
    with scenario_on(cluster, **{"external-shuffle.client.use-data-port": False}) as scenario:
        descriptors, _ = scenario.produce(data, partitions=2, subpartitions=2)
        assert rows_of(scenario.read(scenario.consumer, descriptors, ALL)) == expected


# --- peers without the token ---------------------------------------------------------------------


def _auth_failures(cluster: LocalCluster) -> float:
    sample = 'pyshuffle_auth_failures_total{method="DataPort.Fetch"}'
    return scrape(cluster, "worker-0").get(sample, 0.0)


def test_a_peer_without_the_token_is_refused_and_reads_nothing(
    cluster: LocalCluster, address: WorkerAddress, secret: bytes, stored: BuiltPartition
) -> None:
    before = _auth_failures(cluster)
    # The client then asks gRPC, with the same token, which gives the AuthenticationError.
    with pytest.raises(DataPortUnreachableError, match="refused") as raised:
        _fetch(address, b"not the token", _request(stored))
    assert isinstance(raised.value.__cause__, AuthenticationError)
    # Skipping the handshake: the request is refused unread.
    with _connect(address) as sock:
        frame = read_frame(sock, 1024)
        assert frame is not None and frame[0] == CHALLENGE
        write_frame(sock, FETCH, _request(stored))
        frame = read_frame(sock, 1 << 20)
        assert frame is not None and frame[0] == REFUSED
        assert sock.recv(1) == b""
    assert _auth_failures(cluster) == before + 2  # each counted
    _serves(address, secret, stored)


# --- bad requests get typed errors ---------------------------------------------------------------


def test_bad_requests_get_typed_errors_and_the_worker_serves_on(
    address: WorkerAddress, secret: bytes, stored: BuiltPartition, cluster: LocalCluster
) -> None:
    with _authenticated(address, secret) as sock:
        write_frame(sock, FETCH, b"\xff\xff\xff not a protobuf")
        assert isinstance(_failure(sock), SerializationError)
    # A partition id that names a path outside the store.
    escape = pb.FetchDataRequest(
        partition=pb.PartitionKey(
            result_id="../../etc", partition_index=0, producer_attempt_id="passwd"
        ),
        last_subpartition=0,
    )
    with _authenticated(address, secret) as sock:
        write_frame(sock, FETCH, escape.SerializeToString())
        assert isinstance(_failure(sock), InvalidIdentifierError)
    with _authenticated(address, secret) as sock:
        write_frame(sock, FETCH, _request(stored, 0, SUBPARTITIONS))
        assert isinstance(_failure(sock), InvalidIdentifierError)
    with _authenticated(address, secret) as sock:
        write_frame(sock, FETCH, _request(stored, 3, 1))
        assert isinstance(_failure(sock), InvalidIdentifierError)
    with pytest.raises(PartitionNotFoundError):
        _fetch(address, secret, _request(build_partition(rows=100)))  # never pushed
    with _authenticated(address, secret) as sock:
        write_frame(sock, MANIFEST, b"{}")
        assert isinstance(_failure(sock), TransportError)
    # A frame header announcing 64 MiB: refused before its body is read.
    with _authenticated(address, secret) as sock:
        sock.sendall(struct.pack("!IB", 64 << 20, FETCH))
        assert isinstance(_failure(sock), DataTooLargeError)
    _serves(address, secret, stored)
    assert "Traceback" not in (cluster.directory / "worker-0.log").read_text()


def test_a_truncated_data_file_is_a_checksum_error_not_a_short_run(
    cluster: LocalCluster, worker: pb_grpc.WorkerStub, address: WorkerAddress, secret: bytes
) -> None:
    built = build_partition(rows=2_000)
    push(cluster, worker, built)
    commit(cluster, worker, built)
    store = Store(str(cluster.worker_store(0)))
    data_file = Path(partition_directory(store, built.partition)) / DATA_FILE
    os.truncate(data_file, len(built.data) // 2)
    with pytest.raises(ChecksumMismatchError, match="truncated") as raised:
        _fetch(address, secret, _request(built))
    assert raised.value.partition_id == built.partition


# --- bounds --------------------------------------------------------------------------------------


def test_idle_and_half_sent_connections_are_closed(
    address: WorkerAddress, secret: bytes, stored: BuiltPartition
) -> None:
    with _authenticated(address, secret) as idle:
        started = time.monotonic()
        assert idle.recv(1) == b""  # no request within the idle timeout
        assert time.monotonic() - started < IDLE_TIMEOUT + 5
    with _authenticated(address, secret) as half:
        half.sendall(struct.pack("!IB", 100, FETCH) + b"x" * 10)
        started = time.monotonic()
        assert isinstance(_failure(half), TransportError)
        assert time.monotonic() - started < IDLE_TIMEOUT + 5
    _serves(address, secret, stored)


def test_a_client_that_stops_reading_loses_its_connection(
    address: WorkerAddress, secret: bytes, stored: BuiltPartition, large: BuiltPartition
) -> None:
    with _authenticated(address, secret) as sock:
        write_frame(sock, FETCH, _request(large))
        # Reads nothing: the worker's sends stall, and the fetch is ended after the timeout.
        time.sleep(IDLE_TIMEOUT * 3)
        sock.settimeout(10)
        received = 0
        while chunk := sock.recv(1 << 20):
            received += len(chunk)
        assert received < len(large.data)
    _serves(address, secret, stored)


def _refused_for_streams(address: WorkerAddress, secret: bytes, stored: BuiltPartition) -> bool:
    """Whether a fetch is refused as one stream too many (the held ones all counted)."""
    try:
        _fetch(address, secret, _request(stored))
    except TooManyStreamsError:
        return True
    return False


def test_connections_and_fetches_are_capped(
    address: WorkerAddress, secret: bytes, stored: BuiltPartition, large: BuiltPartition
) -> None:
    # Connections that hold fetches open (they read nothing), up to the worker's stream cap.
    holding = []
    try:
        for _ in range(MAX_STREAMS):
            sock = _authenticated(address, secret)
            write_frame(sock, FETCH, _request(large))
            holding.append(sock)
        eventually(
            lambda: _refused_for_streams(address, secret, stored),
            "a fetch past the stream cap is refused",
        )
        # Past the connection cap (the stream cap and some spare), connections are refused
        # (more are accepted only where the worker has closed some held ones as idle).
        waiting = []
        refused = 0
        for _ in range(40):
            sock = _connect(address)
            waiting.append(sock)
            frame = read_frame(sock, 1 << 20)
            assert frame is not None
            refused += frame[0] == REFUSED
        assert refused >= 40 - 16 - MAX_STREAMS
        for sock in waiting:
            sock.close()
    finally:
        for sock in holding:
            sock.close()
    deadline = time.monotonic() + 10
    while True:
        try:
            _serves(address, secret, stored)
            break
        except (TooManyStreamsError, TransportError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
