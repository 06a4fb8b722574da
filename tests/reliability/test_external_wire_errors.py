"""Errors across the wire: every ShuffleError class a daemon raises arrives as the same class
with its partition; request bytes that do not decode are the client's error on every method;
no error quotes more than a short prefix of a client's input; a corrupt replica is skipped for
a whole one. Real gRPC servers and daemons on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from external_shuffle.daemon.error_statuses import reports_errors
from external_shuffle.local_cluster import LocalCluster
from external_shuffle.ops.metrics import DaemonMetrics
from external_shuffle.wire.channels import translate_rpc_error
from external_shuffle.wire.errors import MAX_DETAILS, STATUS_CODES
from external_shuffle.wire.stubs import pb
from shuffle_api import (
    IntermediateResultPartitionID,
    PartitionError,
    PartitionNotFoundError,
    ResultPartitionID,
    SerializationError,
    ShuffleError,
    StorageFullError,
    TransportError,
)
from shuffle_api.testing.harness import route
from shuffle_runtime.format import partition_directory
from shuffle_runtime.format.manifest import DATA_FILE
from shuffle_runtime.store import Store
from tests.reliability.external_cluster import (
    ALL,
    PARTITIONS,
    ROWS,
    SUBPARTITIONS,
    batches,
    placed_on,
    replicas,
    rows_of,
    scenario_on,
)

PARTITION = ResultPartitionID(IntermediateResultPartitionID("result-x", 3), "attempt-7")
_RAISE = "/pyshuffle.test.Errors/Raise"


class _Raiser:
    """Raises the ShuffleError class the request names (with PARTITION, if it takes one)."""

    def __init__(self) -> None:
        self.metrics = DaemonMetrics()

    @reports_errors
    def Raise(self, request: bytes, context: grpc.ServicerContext) -> bytes:  # noqa: N802
        cls = {error.__name__: error for error in STATUS_CODES}[request.decode()]
        if issubclass(cls, PartitionError):
            raise cls(f"{cls.__name__} raised", PARTITION)
        raise cls(f"{cls.__name__} raised")


@pytest.fixture(scope="module")
def raising() -> Iterator[grpc.Channel]:
    server = grpc.server(ThreadPoolExecutor(2))
    handler: grpc.RpcMethodHandler[bytes, bytes] = grpc.unary_unary_rpc_method_handler(
        _Raiser().Raise
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("pyshuffle.test.Errors", {"Raise": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield channel
    server.stop(None)


@pytest.mark.parametrize(
    ("cls", "code"), STATUS_CODES.items(), ids=[cls.__name__ for cls in STATUS_CODES]
)
def test_every_error_class_arrives_as_itself_with_its_partition(
    raising: grpc.Channel, cls: type[ShuffleError], code: grpc.StatusCode
) -> None:
    with pytest.raises(grpc.RpcError) as failed:
        call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = raising.unary_unary(_RAISE)
        call(cls.__name__.encode(), timeout=10)
    assert isinstance(failed.value, grpc.Call)
    assert failed.value.code() == code
    error = translate_rpc_error(failed.value, "raising")
    assert type(error) is cls
    assert f"{cls.__name__} raised" in str(error)
    assert str(error).startswith("raising failed: ")
    if isinstance(error, PartitionError):
        assert error.partition_id == PARTITION


# --- a real daemon ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("wire"), workers=1) as running:
        yield running


def _token(cluster: LocalCluster) -> tuple[tuple[str, str | bytes], ...]:
    return (("authorization", f"Bearer {cluster.token_file.read_text().strip()}"),)


# A length-delimited field 1 whose length runs past the end: no protobuf message decodes it.
UNDECODABLE = b"\x0a\xff\xff\xff\x0f\x01"


WORKER_SERVICE = pb.DESCRIPTOR.services_by_name["Worker"]


def _methods() -> list[tuple[str, str, bool, bool]]:
    coordinator = pb.DESCRIPTOR.services_by_name["Coordinator"]
    return [
        (service.full_name, method.name, method.client_streaming, method.server_streaming)
        for service in (coordinator, WORKER_SERVICE)
        for method in service.methods
    ]


@pytest.mark.parametrize(
    ("service", "method", "client_streaming", "server_streaming"),
    _methods(),
    ids=[f"{service.rsplit('.', 1)[1]}.{method}" for service, method, _, _ in _methods()],
)
def test_undecodable_request_bytes_are_invalid_argument_on_every_method(
    cluster: LocalCluster,
    service: str,
    method: str,
    client_streaming: bool,
    server_streaming: bool,
) -> None:
    target = cluster.worker_target(0) if service == WORKER_SERVICE.full_name else None
    channel = grpc.insecure_channel(target or cluster.coordinator_targets[0])
    path = f"/{service}/{method}"
    request: Any = iter([UNDECODABLE]) if client_streaming else UNDECODABLE
    with channel, pytest.raises(grpc.RpcError) as failed:
        if client_streaming:
            channel.stream_unary(path)(request, metadata=_token(cluster), timeout=10)
        elif server_streaming:
            list(channel.unary_stream(path)(request, metadata=_token(cluster), timeout=10))
        else:
            channel.unary_unary(path)(request, metadata=_token(cluster), timeout=10)
    assert isinstance(failed.value, grpc.Call)
    assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT, failed.value.details()
    assert isinstance(translate_rpc_error(failed.value, method), SerializationError)
    for daemon in (cluster.coordinator_targets[0], cluster.worker_target(0)):
        with grpc.insecure_channel(daemon) as health:
            answer = health_pb2_grpc.HealthStub(health).Check(
                health_pb2.HealthCheckRequest(), timeout=10
            )
            assert answer.status == health_pb2.HealthCheckResponse.SERVING


def test_a_huge_id_is_refused_with_a_short_error(cluster: LocalCluster) -> None:
    huge = "a" * (1 << 20)
    log = cluster.directory / "coordinator.log"
    before = log.stat().st_size
    with pytest.raises(grpc.RpcError) as failed:
        cluster.coordinator_stub().RegisterApplication(
            pb.RegisterApplicationRequest(application_id=huge), timeout=10
        )
    assert isinstance(failed.value, grpc.Call)
    assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(failed.value.details() or "") <= MAX_DETAILS + 16
    assert "1048576 characters" in (failed.value.details() or "")
    assert log.stat().st_size - before < 4 * MAX_DETAILS


# --- corrupt replicas -------------------------------------------------------------------------


def _corrupt(store_url: str, partition: ResultPartitionID) -> None:
    """Flip bytes in the middle of a replica's data file (its size stays)."""
    path = Path(partition_directory(Store(store_url), partition)) / DATA_FILE
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 16] = bytes(b ^ 0xFF for b in data[middle : middle + 16])
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def replicated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("replicated"), workers=2) as running:
        yield running


def test_a_corrupt_replica_is_skipped_for_the_whole_one(replicated: LocalCluster) -> None:
    with scenario_on(replicated, **{"external-shuffle.replication-factor": 2}) as scenario:
        written, _ = scenario.produce(batches(), partitions=PARTITIONS, subpartitions=SUBPARTITIONS)
        for descriptor in written:
            first = replicas(descriptor)[0]
            _corrupt(first.store_url, descriptor.result_partition_id)
        assert rows_of(scenario.read(scenario.consumer, written, ALL)) == list(range(ROWS))


def test_a_partition_whose_only_copy_is_corrupt_reads_as_lost_and_names_itself(
    replicated: LocalCluster,
) -> None:
    with scenario_on(replicated) as scenario:
        [descriptor], _ = scenario.produce(batches(), partitions=1, subpartitions=SUBPARTITIONS)
        [only] = replicas(descriptor)
        _corrupt(only.store_url, descriptor.result_partition_id)
        with pytest.raises(PartitionNotFoundError) as lost:
            scenario.read(scenario.consumer, [descriptor], ALL)
        assert lost.value.partition_id == descriptor.result_partition_id
        assert "ChecksumMismatch" in str(lost.value) or "checksum" in str(lost.value)


@pytest.mark.parametrize("replication", [1, 2])
def test_a_full_store_fails_the_writer_with_storage_full_error(
    replicated: LocalCluster, replication: int
) -> None:
    """Every replica's data file is a link to /dev/full, whose writes fail with the kernel's
    own ENOSPC: the writer must say so, whatever it was doing when the worker gave up."""
    settings = {
        "external-shuffle.replication-factor": replication,
        "external-shuffle.client.chunk-size": "64k",
    }
    with scenario_on(replicated, **settings) as scenario:
        descriptor = scenario.partition_descriptor(0, partitions=1, subpartitions=SUBPARTITIONS)
        shuffle_descriptor, writer = scenario.new_writer(descriptor)
        partition = shuffle_descriptor.result_partition_id
        for replica in replicas(shuffle_descriptor):
            data_file = Path(partition_directory(Store(replica.store_url), partition)) / DATA_FILE
            data_file.parent.mkdir(parents=True)
            data_file.symlink_to("/dev/full")
        with pytest.raises(StorageFullError, match="no space left"), writer:
            for batch in batches(200_000):
                writer.write(batch, route(batch, SUBPARTITIONS))
            writer.finish()


def test_a_writer_whose_only_worker_is_gone_fails_with_transport_error(
    replicated: LocalCluster,
) -> None:
    # Not a StorageError: the push sink raises it inside a write to the data file.
    settings = {
        "external-shuffle.replication-factor": 1,
        "external-shuffle.client.chunk-size": "64k",
    }
    with scenario_on(replicated, **settings) as scenario:
        descriptor = scenario.partition_descriptor(0, partitions=1, subpartitions=SUBPARTITIONS)
        shuffle_descriptor, writer = scenario.new_writer(descriptor)
        [target] = placed_on(replicated, shuffle_descriptor)
        replicated.stop_worker(target)
        try:
            with pytest.raises(TransportError) as failed, writer:
                for batch in batches(200_000):
                    writer.write(batch, route(batch, SUBPARTITIONS))
                writer.finish()
        finally:
            replicated.start_worker(target)
    assert type(failed.value) is TransportError
    assert replicated.worker_target(target) in str(failed.value)
