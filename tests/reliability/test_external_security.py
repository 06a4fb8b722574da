"""The external shuffle daemons under hostile or careless callers, over raw gRPC: the token is
required everywhere but on the health service, ids cannot name paths, oversize messages are
refused, pushes are idempotent, a commit that disagrees with the pushed bytes is refused; TLS
carries a real shuffle and refuses plaintext; a daemon without a token does not start."""

from __future__ import annotations

import dataclasses
import itertools
import os
import socket
import ssl
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import grpc
import pyarrow as pa
import pytest
import trustme
import xxhash
from grpc_health.v1 import health_pb2, health_pb2_grpc

from external_shuffle.client.descriptor import ExternalShuffleDescriptor
from external_shuffle.client.push import PushSettings, PushSink
from external_shuffle.local_cluster import LocalCluster
from external_shuffle.options import MIN_CHUNK_SIZE
from external_shuffle.wire.channels import ChannelPool, ClientSettings
from external_shuffle.wire.messages import WorkerAddress, key_of
from external_shuffle.wire.stubs import pb, pb_grpc
from shuffle_api import (
    AuthenticationError,
    Configuration,
    SubpartitionRange,
)
from shuffle_api.testing import ConformanceHarness, ShuffleScenario, make_batches
from shuffle_runtime.format import (
    PartitionManifest,
    decode_run,
    partition_directory,
)
from shuffle_runtime.format.manifest import DATA_FILE
from shuffle_runtime.ports import free_ports
from shuffle_runtime.sockets import open_connection
from shuffle_runtime.store import Store
from shuffle_runtime.tls import TlsFiles
from tests.reliability.external_cluster import scrape
from tests.reliability.raw_worker import (
    BIG_CHANNEL,
    CHUNK,
    SUBPARTITIONS,
    BuiltPartition,
    auth,
    build_partition,
    code_of,
    fetch_all,
    fetch_messages,
    new_partition,
    partition_exists,
    push_requests,
    runs_in,
    tree,
)
from tests.tls_files import write_tls_files

# --- the cluster ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("security")


@pytest.fixture(scope="module")
def cluster(root: Path) -> Iterator[LocalCluster]:
    with LocalCluster(root / "cluster", workers=1) as running:
        yield running


@pytest.fixture(scope="module")
def coordinator(cluster: LocalCluster) -> Iterator[pb_grpc.CoordinatorStub]:
    channel = grpc.insecure_channel(cluster.coordinator_address)
    yield pb_grpc.CoordinatorStub(channel)
    channel.close()


@pytest.fixture(scope="module")
def committed(cluster: LocalCluster, worker: pb_grpc.WorkerStub) -> BuiltPartition:
    """A partition pushed and committed with the token."""
    built = build_partition(rows=1_000)
    chunks = built.chunks()
    answer = worker.PushData(
        push_requests(built.key, chunks, range(len(chunks))), metadata=auth(cluster), timeout=30
    )
    assert answer.received_bytes == len(built.data)
    worker.CommitPartition(
        pb.CommitPartitionRequest(partition=built.key, index=built.index, manifest=built.manifest),
        metadata=auth(cluster),
        timeout=30,
    )
    return built


# --- the token --------------------------------------------------------------------------------

BAD_CREDENTIALS: dict[str, Callable[[str], list[tuple[str, str]]]] = {
    "no-token": lambda token: [],
    "wrong-token": lambda token: [("authorization", "Bearer " + "x" * len(token))],
    "token-without-bearer": lambda token: [("authorization", token)],
    "token-with-suffix": lambda token: [("authorization", f"Bearer {token}x")],
    "other-header": lambda token: [("x-authorization", f"Bearer {token}")],
}


@pytest.fixture(params=sorted(BAD_CREDENTIALS))
def bad_metadata(request: pytest.FixtureRequest, cluster: LocalCluster) -> list[tuple[str, str]]:
    make = BAD_CREDENTIALS[request.param]
    return make(cluster.token_file.read_text().strip())


def test_coordinator_unary_calls_without_the_token_are_unauthenticated(
    cluster: LocalCluster,
    coordinator: pb_grpc.CoordinatorStub,
    bad_metadata: list[tuple[str, str]],
) -> None:
    assert (
        code_of(lambda: coordinator.ListWorkers(pb.ListWorkersRequest(), metadata=bad_metadata))
        == grpc.StatusCode.UNAUTHENTICATED
    )
    # A rogue worker cannot join the cluster.
    rogue = pb.WorkerInfo(worker_id="worker-rogue", host="127.0.0.1", port=1, store_url="/tmp")
    assert (
        code_of(
            lambda: coordinator.RegisterWorker(
                pb.RegisterWorkerRequest(worker=rogue), metadata=bad_metadata, timeout=10
            )
        )
        == grpc.StatusCode.UNAUTHENTICATED
    )
    answer = coordinator.ListWorkers(pb.ListWorkersRequest(), metadata=auth(cluster), timeout=10)
    assert [entry.worker.port for entry in answer.workers] == [cluster.worker_ports[0]]


def test_worker_unary_calls_without_the_token_are_unauthenticated_and_change_nothing(
    cluster: LocalCluster,
    worker: pb_grpc.WorkerStub,
    committed: BuiltPartition,
    bad_metadata: list[tuple[str, str]],
) -> None:
    status = pb.WorkerPartitionStatusRequest(partitions=[committed.key])
    assert (
        code_of(lambda: worker.GetPartitionStatus(status, metadata=bad_metadata, timeout=10))
        == grpc.StatusCode.UNAUTHENTICATED
    )
    release = pb.WorkerReleasePartitionsRequest(partitions=[committed.key])
    assert (
        code_of(lambda: worker.ReleasePartitions(release, metadata=bad_metadata, timeout=10))
        == grpc.StatusCode.UNAUTHENTICATED
    )
    assert (
        code_of(
            lambda: worker.Decommission(pb.DecommissionRequest(), metadata=bad_metadata, timeout=10)
        )
        == grpc.StatusCode.UNAUTHENTICATED
    )
    merge = pb.MergePartitionsRequest(
        merged=key_of(new_partition()),
        sources=[committed.key],
        number_of_subpartitions=SUBPARTITIONS,
    )
    assert (
        code_of(lambda: worker.MergePartitions(merge, metadata=bad_metadata, timeout=10))
        == grpc.StatusCode.UNAUTHENTICATED
    )
    # The release did not happen, and the worker still takes partitions.
    [entry] = worker.GetPartitionStatus(status, metadata=auth(cluster), timeout=10).partitions
    assert entry.committed
    assert partition_exists(cluster, committed.partition)
    fresh = new_partition()
    answer = worker.PushData(
        iter([pb.PushDataRequest(partition=key_of(fresh), sequence=0, data=b"x")]),
        metadata=auth(cluster),
        timeout=10,
    )
    assert answer.received_bytes == 1
    worker.ReleasePartitions(
        pb.WorkerReleasePartitionsRequest(partitions=[key_of(fresh)]),
        metadata=auth(cluster),
        timeout=10,
    )


def test_push_without_the_token_is_unauthenticated_and_writes_nothing(
    cluster: LocalCluster, worker: pb_grpc.WorkerStub, bad_metadata: list[tuple[str, str]]
) -> None:
    built = build_partition(rows=500)
    chunks = built.chunks()
    before = tree(cluster.worker_store(0))
    assert (
        code_of(
            lambda: worker.PushData(
                push_requests(built.key, chunks, range(len(chunks))),
                metadata=bad_metadata,
                timeout=30,
            )
        )
        == grpc.StatusCode.UNAUTHENTICATED
    )
    commit = pb.CommitPartitionRequest(
        partition=built.key, index=built.index, manifest=built.manifest
    )
    assert (
        code_of(lambda: worker.CommitPartition(commit, metadata=bad_metadata, timeout=10))
        == grpc.StatusCode.UNAUTHENTICATED
    )
    assert tree(cluster.worker_store(0)) == before
    assert not partition_exists(cluster, built.partition)


def test_fetch_without_the_token_is_unauthenticated_and_returns_no_data(
    cluster: LocalCluster,
    worker: pb_grpc.WorkerStub,
    committed: BuiltPartition,
    bad_metadata: list[tuple[str, str]],
) -> None:
    received: list[pb.FetchDataResponse] = []

    def fetch() -> None:
        for message in worker.FetchData(
            pb.FetchDataRequest(partition=committed.key, last_subpartition=SUBPARTITIONS - 1),
            metadata=bad_metadata,
            timeout=10,
        ):
            received.append(message)

    assert code_of(fetch) == grpc.StatusCode.UNAUTHENTICATED
    assert received == []
    # The same fetch with the token succeeds: the partition is there.
    manifest, runs = fetch_all(worker, committed.key, auth(cluster))
    assert manifest == committed.manifest
    assert runs


def test_health_service_answers_without_a_token(cluster: LocalCluster) -> None:
    for target in (cluster.coordinator_address, cluster.worker_target(0)):
        with grpc.insecure_channel(target) as channel:
            answer = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=10
            )
        assert answer.status == health_pb2.HealthCheckResponse.SERVING


# --- ids that could name paths ------------------------------------------------------------------

UNSAFE_IDS = ["../escape", "..", "a/b", ""]


@pytest.mark.parametrize("unsafe", UNSAFE_IDS)
@pytest.mark.parametrize("field", ["result_id", "producer_attempt_id"])
def test_unsafe_partition_ids_are_invalid_arguments_and_touch_no_file(
    cluster: LocalCluster,
    worker: pb_grpc.WorkerStub,
    coordinator: pb_grpc.CoordinatorStub,
    field: str,
    unsafe: str,
) -> None:
    built = build_partition(rows=300)
    key = pb.PartitionKey()
    key.CopyFrom(built.key)
    setattr(key, field, unsafe)
    metadata = auth(cluster)
    root = cluster.directory.parent  # the cluster's and anything beside it
    before = tree(root)

    calls: dict[str, Callable[[], object]] = {
        "PushData": lambda: worker.PushData(
            push_requests(key, built.chunks(), range(len(built.chunks()))),
            metadata=metadata,
            timeout=30,
        ),
        "FetchData": lambda: list(
            worker.FetchData(
                pb.FetchDataRequest(partition=key, last_subpartition=SUBPARTITIONS - 1),
                metadata=metadata,
                timeout=10,
            )
        ),
        "CommitPartition": lambda: worker.CommitPartition(
            pb.CommitPartitionRequest(partition=key, index=built.index, manifest=built.manifest),
            metadata=metadata,
            timeout=10,
        ),
        "Coordinator.RegisterPartition": lambda: coordinator.RegisterPartition(
            pb.RegisterPartitionRequest(partition=key, number_of_subpartitions=SUBPARTITIONS),
            metadata=metadata,
            timeout=10,
        ),
    }
    codes = {name: code_of(call) for name, call in calls.items()}
    assert codes == dict.fromkeys(calls, grpc.StatusCode.INVALID_ARGUMENT)
    assert tree(root) == before


# --- message limits -----------------------------------------------------------------------------

OVERSIZE = (16 << 20) + (64 << 10)  # past the default external-shuffle.max-message-size


def test_oversize_push_is_resource_exhausted_and_writes_nothing(
    cluster: LocalCluster, worker: pb_grpc.WorkerStub
) -> None:
    partition = new_partition()
    before = tree(cluster.worker_store(0))
    big = pb.PushDataRequest(partition=key_of(partition), sequence=0, data=b"x" * OVERSIZE)
    assert (
        code_of(lambda: worker.PushData(iter([big]), metadata=auth(cluster), timeout=30))
        == grpc.StatusCode.RESOURCE_EXHAUSTED
    )
    assert tree(cluster.worker_store(0)) == before
    assert not partition_exists(cluster, partition)


@pytest.mark.parametrize(
    "message",
    [
        b"\x1a\x05abc",  # the data field announces 5 bytes, 3 follow
        b"\x0a\x02\xff\xff",  # the partition key is not a message
        b"\x0e",  # wire type 6 does not exist
    ],
)
def test_malformed_push_is_invalid_argument_and_writes_nothing(
    cluster: LocalCluster, message: bytes
) -> None:
    """The worker reads pushed messages by hand (see external_shuffle.wire.framing): bytes that are
    not a PushDataRequest are refused as such, not as an internal error."""
    before = tree(cluster.worker_store(0))
    channel = grpc.insecure_channel(cluster.worker_target(0))
    path = f"/{pb.DESCRIPTOR.services_by_name['Worker'].full_name}/PushData"
    push: grpc.StreamUnaryMultiCallable[bytes, bytes] = channel.stream_unary(path)
    metadata = tuple(auth(cluster))
    try:
        call = lambda: push(iter([message]), metadata=metadata, timeout=30)  # noqa: E731
        assert code_of(call) == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        channel.close()
    assert tree(cluster.worker_store(0)) == before


def test_oversize_commit_is_resource_exhausted_and_commits_nothing(
    cluster: LocalCluster, worker: pb_grpc.WorkerStub
) -> None:
    built = build_partition(rows=300)
    chunks = built.chunks()
    worker.PushData(
        push_requests(built.key, chunks, range(len(chunks))), metadata=auth(cluster), timeout=30
    )
    commit = pb.CommitPartitionRequest(
        partition=built.key, index=b"i" * OVERSIZE, manifest=built.manifest
    )
    assert (
        code_of(lambda: worker.CommitPartition(commit, metadata=auth(cluster), timeout=30))
        == grpc.StatusCode.RESOURCE_EXHAUSTED
    )
    status = pb.WorkerPartitionStatusRequest(partitions=[built.key])
    [entry] = worker.GetPartitionStatus(status, metadata=auth(cluster), timeout=10).partitions
    assert not entry.committed
    assert code_of(lambda: fetch_all(worker, built.key, auth(cluster))) == grpc.StatusCode.NOT_FOUND
    release = pb.WorkerReleasePartitionsRequest(partitions=[built.key])
    assert worker.ReleasePartitions(release, metadata=auth(cluster), timeout=10).released == 1
    assert not partition_exists(cluster, built.partition)


def run_ranges(built: BuiltPartition) -> list[tuple[int, int]]:
    """Each run's (offset, length) in the data file, in the order a fetch of every
    subpartition sends them."""
    index = pa.ipc.open_file(pa.py_buffer(built.index)).read_all().to_pydict()
    runs = zip(
        index["subpartition"], index["region"], index["offset"], index["length"], strict=True
    )
    return [(offset, length) for _, _, offset, length in sorted(runs)]


def assert_runs_in_chunks(
    messages: Sequence[pb.FetchDataResponse], built: BuiltPartition, chunk: int
) -> None:
    """Each run arrived whole, with its checksum, cut into messages of ``chunk`` data bytes
    (the last one of a run may be shorter)."""
    runs = runs_in(messages)
    ranges = run_ranges(built)
    assert len(runs) == len(ranges)
    for run, (offset, length) in zip(runs, ranges, strict=True):
        assert [len(m.data) for m in run[:-1]] == [chunk] * (len(run) - 1)
        assert 0 < len(run[-1].data) <= chunk
        data = b"".join(message.data for message in run)
        assert data == built.data[offset : offset + length]
        assert xxhash.xxh3_64_intdigest(data) == run[-1].run_checksum


@pytest.mark.parametrize(
    ("asked", "chunk"),
    [
        (0, None),  # the worker's chunk size (4 MiB): each run in one message
        (1 << 20, None),  # a run fits: one message each
        (5_000, 5_000),
        (1, MIN_CHUNK_SIZE),  # never smaller than this
    ],
)
def test_a_fetch_sends_each_run_whole_or_in_chunks_of_what_the_client_takes(
    cluster: LocalCluster,
    worker: pb_grpc.WorkerStub,
    committed: BuiltPartition,
    asked: int,
    chunk: int | None,
) -> None:
    messages = fetch_messages(worker, committed.key, auth(cluster), max_chunk_bytes=asked)
    longest = max(length for _, length in run_ranges(committed))
    assert chunk is None or longest > 2 * chunk, "the runs are long enough to be cut"
    assert_runs_in_chunks(messages, committed, longest if chunk is None else chunk)
    if chunk is None:
        assert all(len(run) == 1 for run in runs_in(messages))


def test_a_fetch_never_sends_more_than_the_worker_limit_whatever_the_client_asks(
    tmp_path: Path,
) -> None:
    settings = {"external-shuffle.max-message-size": "128k"}  # 64 KiB of data a message
    built = build_partition(rows=20_000, memory_budget=4 << 20)
    assert max(length for _, length in run_ranges(built)) > 3 * (64 << 10)
    with LocalCluster(tmp_path / "cluster", workers=1, settings=settings) as small:
        channel = grpc.insecure_channel(small.worker_target(0), options=BIG_CHANNEL)
        try:
            stub = pb_grpc.WorkerStub(channel)
            chunks = [built.data[i : i + CHUNK] for i in range(0, len(built.data), CHUNK)]
            stub.PushData(
                push_requests(built.key, chunks, range(len(chunks))),
                metadata=auth(small),
                timeout=30,
            )
            stub.CommitPartition(
                pb.CommitPartitionRequest(
                    partition=built.key, index=built.index, manifest=built.manifest
                ),
                metadata=auth(small),
                timeout=30,
            )
            messages = fetch_messages(stub, built.key, auth(small), max_chunk_bytes=1 << 40)
        finally:
            channel.close()
    assert_runs_in_chunks(messages, built, 64 << 10)


# --- duplicates and commits ---------------------------------------------------------------------


def test_duplicate_pushes_are_dropped_and_the_partition_reads_back_exactly(
    cluster: LocalCluster, worker: pb_grpc.WorkerStub
) -> None:
    built = build_partition()
    chunks = built.chunks()
    assert len(chunks) >= 4, "several messages"
    metadata = auth(cluster)
    # Every message twice in one stream: a retry resending from the start.
    sequences = [*range(len(chunks)), *range(len(chunks))]
    first = worker.PushData(
        push_requests(built.key, chunks, sequences), metadata=metadata, timeout=30
    )
    assert first.received_bytes == len(built.data)
    assert first.duplicates_dropped == len(chunks)
    worker.CommitPartition(
        pb.CommitPartitionRequest(partition=built.key, index=built.index, manifest=built.manifest),
        metadata=metadata,
        timeout=30,
    )
    # After the commit, a whole push again is nothing but duplicates; a retried commit is fine.
    again = worker.PushData(
        push_requests(built.key, chunks, range(len(chunks))), metadata=metadata, timeout=30
    )
    assert again.duplicates_dropped == len(chunks)
    assert again.received_bytes == 0
    worker.CommitPartition(
        pb.CommitPartitionRequest(partition=built.key, index=built.index, manifest=built.manifest),
        metadata=metadata,
        timeout=30,
    )

    store = Store(str(cluster.worker_store(0)))
    directory = Path(partition_directory(store, built.partition))
    assert (directory / DATA_FILE).read_bytes() == built.data

    manifest_bytes, runs = fetch_all(worker, built.key, metadata)
    assert manifest_bytes == built.manifest
    manifest = PartitionManifest.from_json(manifest_bytes, "fetched")
    assert manifest.statistics == built.statistics
    index = pa.ipc.open_file(pa.py_buffer(built.index)).read_all()
    assert len(runs) == index.num_rows
    assert sorted(checksum for _, checksum in runs) == sorted(index.column("checksum").to_pylist())
    rows: list[int] = []
    for data, checksum in runs:
        assert xxhash.xxh3_64_intdigest(data) == checksum
        assert manifest.schema is not None
        for batch in decode_run(pa.py_buffer(data), manifest.schema, built.partition):
            rows.extend(batch.column("row").to_pylist())
    assert sorted(rows) == built.rows
    # Each subpartition's rows come from its own runs only.
    by_subpartition = [
        fetch_range(worker, built, metadata, SubpartitionRange(s, s)) for s in range(SUBPARTITIONS)
    ]
    assert [len(r) for r in by_subpartition] == list(built.statistics.rows_per_subpartition)
    assert sorted(row for part in by_subpartition for row in part) == built.rows


def fetch_range(
    worker: pb_grpc.WorkerStub,
    built: BuiltPartition,
    metadata: list[tuple[str, str]],
    subpartitions: SubpartitionRange,
) -> list[int]:
    schema = PartitionManifest.from_json(built.manifest, "built").schema
    assert schema is not None
    rows: list[int] = []
    pieces: list[bytes] = []
    for message in worker.FetchData(
        pb.FetchDataRequest(
            partition=built.key,
            first_subpartition=subpartitions.start,
            last_subpartition=subpartitions.end,
        ),
        metadata=metadata,
        timeout=30,
    ):
        if message.manifest:
            continue
        pieces.append(message.data)
        if message.end_of_run:
            data = b"".join(pieces)
            pieces = []
            assert xxhash.xxh3_64_intdigest(data) == message.run_checksum
            for batch in decode_run(pa.py_buffer(data), schema, built.partition):
                rows.extend(batch.column("row").to_pylist())
    return rows


def test_the_push_stream_sends_every_write_once_whatever_its_buffer_does_after(
    cluster: LocalCluster, coordinator: pb_grpc.CoordinatorStub, worker: pb_grpc.WorkerStub
) -> None:
    """A client's data stream keeps views of immutable writes (bytes, Arrow buffers) until a
    chunk is framed, and copies the others: a bytearray its owner clears right after the
    write still arrives as written. Chunks are cut across writes at the chunk size."""
    built = build_partition(rows=600)
    answer = coordinator.ListWorkers(pb.ListWorkersRequest(), metadata=auth(cluster), timeout=10)
    [entry] = answer.workers
    channels = ChannelPool(
        ClientSettings(cluster.token_file.read_text().strip(), None, 16 << 20, 30.0)
    )
    settings = PushSettings(chunk_size=4 << 10, max_in_flight=64 << 10, timeout=30.0)
    unreachable: list[WorkerAddress] = []
    sink = PushSink(
        ExternalShuffleDescriptor(built.partition, (WorkerAddress.from_pb(entry.worker),)),
        channels,
        settings,
        lambda address, _: unreachable.append(address),
    )
    stream = sink.open_data()
    data = memoryview(built.data)
    cuts = [0, 100, 5_000, 5_001, 12_000, 20_000, len(data)]
    assert cuts[-2] < len(data), "the partition is larger than the pieces written"
    for number, (start, end) in enumerate(itertools.pairwise(cuts)):
        piece = data[start:end]
        if number % 3 == 0:
            reused = bytearray(piece)
            stream.write(memoryview(reused))
            reused[:] = b"\0" * len(reused)  # the owner reuses its buffer
        elif number % 3 == 1:
            stream.write(pa.py_buffer(bytes(piece)))
        else:
            stream.write(bytes(piece))
    stream.close()
    sink.commit(built.index, built.manifest)
    channels.close()
    assert not unreachable

    store = Store(str(cluster.worker_store(0)))
    directory = Path(partition_directory(store, built.partition))
    assert (directory / DATA_FILE).read_bytes() == built.data
    release = pb.WorkerReleasePartitionsRequest(partitions=[built.key])
    worker.ReleasePartitions(release, metadata=auth(cluster), timeout=10)


def _wrong_data_bytes(built: BuiltPartition) -> tuple[bytes, bytes]:
    manifest = PartitionManifest.from_json(built.manifest, "built")
    wrong = dataclasses.replace(manifest, data_bytes=manifest.data_bytes + 1)
    return built.index, wrong.to_json()


def _corrupt_index(built: BuiltPartition) -> tuple[bytes, bytes]:
    index = bytearray(built.index)
    index[len(index) // 2] ^= 0xFF
    return bytes(index), built.manifest


def _other_partition(built: BuiltPartition) -> tuple[bytes, bytes]:
    manifest = PartitionManifest.from_json(built.manifest, "built")
    return built.index, dataclasses.replace(manifest, partition=new_partition()).to_json()


@pytest.mark.parametrize(
    "tamper",
    [_wrong_data_bytes, _corrupt_index, _other_partition],
    ids=["manifest-data-bytes-disagree", "index-corrupt", "manifest-of-another-partition"],
)
def test_commit_that_disagrees_with_the_push_is_data_loss_and_unreadable(
    cluster: LocalCluster,
    worker: pb_grpc.WorkerStub,
    tamper: Callable[[BuiltPartition], tuple[bytes, bytes]],
) -> None:
    built = build_partition(rows=1_000)
    chunks = built.chunks()
    metadata = auth(cluster)
    worker.PushData(
        push_requests(built.key, chunks, range(len(chunks))), metadata=metadata, timeout=30
    )
    index, manifest = tamper(built)
    assert (
        code_of(
            lambda: worker.CommitPartition(
                pb.CommitPartitionRequest(partition=built.key, index=index, manifest=manifest),
                metadata=metadata,
                timeout=30,
            )
        )
        == grpc.StatusCode.DATA_LOSS
    )
    assert code_of(lambda: fetch_all(worker, built.key, metadata)) == grpc.StatusCode.NOT_FOUND
    status = pb.WorkerPartitionStatusRequest(partitions=[built.key])
    [entry] = worker.GetPartitionStatus(status, metadata=metadata, timeout=10).partitions
    assert not entry.committed
    # The pushed bytes are still there: the right commit afterwards succeeds.
    worker.CommitPartition(
        pb.CommitPartitionRequest(partition=built.key, index=built.index, manifest=built.manifest),
        metadata=metadata,
        timeout=30,
    )
    manifest_bytes, runs = fetch_all(worker, built.key, metadata)
    assert manifest_bytes == built.manifest
    assert all(xxhash.xxh3_64_intdigest(data) == checksum for data, checksum in runs)


# --- TLS ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_cluster(root: Path) -> Iterator[tuple[LocalCluster, TlsFiles]]:
    directory = root / "tls"
    files = write_tls_files(directory)
    settings = {
        "external-shuffle.tls.cert-file": files.cert_file,
        "external-shuffle.tls.key-file": files.key_file,
        "external-shuffle.tls.ca-file": files.ca_file,
    }
    with LocalCluster(directory / "cluster", workers=1, settings=settings, metrics=True) as running:
        yield running, files


def test_tls_cluster_carries_a_shuffle_through_the_encrypted_data_port(
    tls_cluster: tuple[LocalCluster, TlsFiles],
) -> None:
    cluster, files = tls_cluster
    config = Configuration.load(
        cluster.client_config(
            **{
                "external-shuffle.tls.ca-file": files.ca_file,
                "external-shuffle.client.read-from-store": False,
                "external-shuffle.client.sort-buffer.size": "64k",
            }
        ),
        environ={},
    )
    batches = make_batches(3_000, batch_rows=500)
    before = scrape(cluster, "worker-0").get("pyshuffle_data_port_requests_total", 0.0)
    with ShuffleScenario.open(ConformanceHarness(config)) as scenario:
        descriptors, _ = scenario.produce(batches, partitions=2, subpartitions=3)
        table = scenario.read(scenario.consumer, descriptors, SubpartitionRange(0, 2))
    assert sorted(table.column("row").to_pylist()) == list(range(3_000))
    assert scrape(cluster, "worker-0")["pyshuffle_data_port_requests_total"] > before


def test_tls_cluster_refuses_plaintext_and_untrusted_clients(
    tls_cluster: tuple[LocalCluster, TlsFiles],
) -> None:
    cluster, files = tls_cluster
    untrusted = trustme.CA()

    def health_of(channel: grpc.Channel) -> grpc.StatusCode:
        stub = health_pb2_grpc.HealthStub(channel)
        return code_of(lambda: stub.Check(health_pb2.HealthCheckRequest(), timeout=10))

    for target in (cluster.coordinator_address, cluster.worker_target(0)):
        with grpc.insecure_channel(target) as plain:
            assert health_of(plain) == grpc.StatusCode.UNAVAILABLE
        with grpc.secure_channel(
            target, grpc.ssl_channel_credentials(root_certificates=untrusted.cert_pem.bytes())
        ) as other_ca:
            assert health_of(other_ca) == grpc.StatusCode.UNAVAILABLE
    # The TLS port with the right CA and the token answers, and offers its data port.
    with grpc.secure_channel(
        cluster.coordinator_address,
        grpc.ssl_channel_credentials(root_certificates=Path(files.ca_file).read_bytes()),
    ) as trusted:
        answer = pb_grpc.CoordinatorStub(trusted).ListWorkers(
            pb.ListWorkersRequest(), metadata=auth(cluster), timeout=10
        )
    assert [entry.alive for entry in answer.workers] == [True]
    [data_port] = [entry.worker.data_port for entry in answer.workers]
    assert data_port == cluster.worker_data_ports[0]
    secret = cluster.token_file.read_text().strip().encode()
    refused = scrape(cluster, "worker-0").get(
        'pyshuffle_auth_failures_total{method="DataPort.Fetch"}', 0.0
    )
    # The data port speaks TLS only: a plaintext client, one trusting another authority.
    with socket.create_connection(("127.0.0.1", data_port), timeout=10) as sock:
        sock.sendall(b"\x00" * 64)
        assert sock.recv(100) == b""
    trusting_other = ssl.create_default_context(cadata=untrusted.cert_pem.bytes().decode())
    with pytest.raises(AuthenticationError, match="does not trust"):
        open_connection("127.0.0.1", data_port, secret=secret, timeout=10, tls=trusting_other)
    trusting = files.client_context()
    open_connection("127.0.0.1", data_port, secret=secret, timeout=10, tls=trusting).close()
    failures = scrape(cluster, "worker-0")
    assert failures['pyshuffle_auth_failures_total{method="DataPort.Fetch"}'] == refused + 2


# --- a daemon without a token -------------------------------------------------------------------


@pytest.mark.parametrize("token_file", ["absent", "empty"])
def test_daemon_without_a_token_refuses_to_start(tmp_path: Path, token_file: str) -> None:
    lines = [
        f'"external-shuffle.coordinator.address" = "127.0.0.1:{free_ports(1)[0]}"',
        '"external-shuffle.daemon.metrics-port" = -1',
    ]
    if token_file == "empty":
        (tmp_path / "token").write_text("")
        lines.append(f'"external-shuffle.auth.token-file" = "{tmp_path / "token"}"')
    config = tmp_path / "coordinator.toml"
    config.write_text("\n".join(lines) + "\n")
    finished = _start_daemon("coordinator", config)
    assert finished.returncode != 0
    assert "external-shuffle.auth.token-file" in finished.stderr


def _start_daemon(role: str, config: Path) -> subprocess.CompletedProcess[str]:
    """A daemon process that is expected to refuse to start (it is killed after a minute)."""
    return subprocess.run(
        [
            *(sys.executable, "-m", "external_shuffle.daemon.main"),
            *("--role", role, "--config", str(config)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("PYSHUFFLE_")},
        check=False,
    )


def test_a_second_daemon_on_a_port_in_use_refuses_to_start(tmp_path: Path) -> None:
    # gRPC binds with SO_REUSEPORT unless told not to: two daemons on one port would each
    # take part of the connections, and clients would reach the wrong one.
    with LocalCluster(tmp_path / "cluster", workers=1) as cluster:
        finished = _start_daemon("worker", cluster.directory / "worker-0.toml")
        assert finished.returncode != 0
        assert f"cannot listen on 127.0.0.1:{cluster.worker_ports[0]}" in finished.stderr
        assert cluster.alive_workers() == {cluster.worker_target(0)}
