"""A push stream that ends with its commit (``PushDataRequest.commit``), and a partition
pushed whole with its commit in one message (``PushPartition``): a map task's replica takes
one call, not a push and a commit. Real daemons on 127.0.0.1 and raw gRPC; workers of the
protocols before them (which take the commit message for an empty chunk, and know no
``PushPartition``) in this process."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import grpc
import pytest
import xxhash

from external_shuffle.client.descriptor import ExternalShuffleDescriptor
from external_shuffle.client.push import PushSettings, PushSink
from external_shuffle.daemon.worker.service import WorkerService
from external_shuffle.local_cluster import LocalCluster
from external_shuffle.wire.channels import ChannelPool, ClientSettings, translate_rpc_error
from external_shuffle.wire.framing import PushChunk
from external_shuffle.wire.messages import WorkerAddress
from external_shuffle.wire.stubs import pb, pb_grpc
from shuffle_api import InvalidOperationError, PartitionCorruptedError, SerializationError
from shuffle_runtime.store import Store
from tests.reliability.raw_worker import (
    BuiltPartition,
    auth,
    build_partition,
    commit,
    committed,
    fetch_all,
    push_requests,
    serving,
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("push-commit"), workers=1) as running:
        yield running


def _ending_with(
    built: BuiltPartition, index: bytes, manifest: bytes, after: bytes | None = None
) -> Iterator[pb.PushDataRequest]:
    """``built``'s chunks, then the commit (with ``after`` as one more chunk past it)."""
    chunks = built.chunks()
    yield from push_requests(built.key, chunks, range(len(chunks)))
    yield pb.PushDataRequest(
        partition=built.key,
        sequence=len(chunks),
        commit=pb.PushCommit(index=index, manifest=manifest),
    )
    if after is not None:
        yield pb.PushDataRequest(partition=built.key, sequence=len(chunks) + 1, data=after)


def test_a_push_stream_that_ends_with_its_commit_commits_what_it_carried(
    cluster: LocalCluster, worker: pb_grpc.WorkerStub
) -> None:
    built = build_partition(rows=2_000)
    response = worker.PushData(
        _ending_with(built, built.index, built.manifest), metadata=auth(cluster), timeout=30
    )
    assert response.committed
    assert response.received_bytes == len(built.data)
    manifest, runs = fetch_all(worker, built.key, auth(cluster))
    assert manifest == built.manifest
    assert all(xxhash.xxh3_64_intdigest(data) == checksum for data, checksum in runs)


def test_a_stream_whose_commit_lies_is_refused_and_keeps_the_bytes_for_the_truth(
    cluster: LocalCluster, worker: pb_grpc.WorkerStub
) -> None:
    built = build_partition(rows=1_000)
    index = bytearray(built.index)
    index[len(index) // 2] ^= 0xFF
    with pytest.raises(grpc.RpcError) as failed:
        worker.PushData(
            _ending_with(built, bytes(index), built.manifest), metadata=auth(cluster), timeout=30
        )
    assert isinstance(failed.value, grpc.Call)
    assert isinstance(translate_rpc_error(failed.value, "push"), PartitionCorruptedError)
    assert not committed(cluster, worker, built)
    commit(cluster, worker, built)
    assert committed(cluster, worker, built)


@pytest.mark.parametrize("wrong", ["a message after the commit", "a commit with data"])
def test_a_stream_that_breaks_the_commit_rule_is_refused_typed_and_commits_nothing(
    cluster: LocalCluster, worker: pb_grpc.WorkerStub, wrong: str
) -> None:
    built = build_partition(rows=1_000)
    if wrong == "a message after the commit":
        requests = _ending_with(built, built.index, built.manifest, after=b"more")
    else:
        chunks = built.chunks()
        *first, last = range(len(chunks))
        requests = iter(
            [
                *push_requests(built.key, chunks, first),
                pb.PushDataRequest(
                    partition=built.key,
                    sequence=last,
                    data=chunks[last],
                    commit=pb.PushCommit(index=built.index, manifest=built.manifest),
                ),
            ]
        )
    with pytest.raises(grpc.RpcError) as failed:
        worker.PushData(requests, metadata=auth(cluster), timeout=30)
    assert isinstance(failed.value, grpc.Call)
    assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert isinstance(translate_rpc_error(failed.value, "push"), InvalidOperationError)
    assert not committed(cluster, worker, built)


def _whole(built: BuiltPartition, index: bytes | None = None) -> pb.PushDataRequest:
    return pb.PushDataRequest(
        partition=built.key,
        data=built.data,
        commit=pb.PushCommit(
            index=built.index if index is None else index, manifest=built.manifest
        ),
    )


def test_a_partition_pushed_whole_in_one_message_is_committed_and_a_retry_changes_nothing(
    cluster: LocalCluster, worker: pb_grpc.WorkerStub
) -> None:
    built = build_partition(rows=800)
    first = worker.PushPartition(_whole(built), metadata=auth(cluster), timeout=30)
    assert first.committed
    assert first.received_bytes == len(built.data)
    assert worker.PushPartition(_whole(built), metadata=auth(cluster), timeout=30).committed
    manifest, runs = fetch_all(worker, built.key, auth(cluster))
    assert manifest == built.manifest
    assert all(xxhash.xxh3_64_intdigest(data) == checksum for data, checksum in runs)
    assert sum(len(data) for data, _ in runs) < len(built.data)  # the runs, not the file twice


def test_a_whole_partition_without_its_commit_is_refused_typed_and_commits_nothing(
    cluster: LocalCluster, worker: pb_grpc.WorkerStub
) -> None:
    built = build_partition(rows=800)
    request = _whole(built)
    request.ClearField("commit")
    with pytest.raises(grpc.RpcError) as failed:
        worker.PushPartition(request, metadata=auth(cluster), timeout=30)
    assert isinstance(failed.value, grpc.Call)
    assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert isinstance(translate_rpc_error(failed.value, "push"), InvalidOperationError)
    assert not committed(cluster, worker, built)


def test_a_whole_partition_whose_commit_lies_is_refused_and_keeps_its_bytes_for_the_truth(
    cluster: LocalCluster, worker: pb_grpc.WorkerStub
) -> None:
    built = build_partition(rows=800)
    index = bytearray(built.index)
    index[len(index) // 2] ^= 0xFF
    with pytest.raises(grpc.RpcError) as failed:
        worker.PushPartition(_whole(built, bytes(index)), metadata=auth(cluster), timeout=30)
    assert isinstance(failed.value, grpc.Call)
    assert isinstance(translate_rpc_error(failed.value, "push"), PartitionCorruptedError)
    assert not committed(cluster, worker, built)
    commit(cluster, worker, built)
    assert committed(cluster, worker, built)


class _CountingWorker(WorkerService):
    """Counts the calls that carry or commit a partition."""

    calls: ClassVar[Counter[str]] = Counter()

    def PushData(  # noqa: N802
        self,
        request_iterator: Iterator[PushChunk | SerializationError],
        context: grpc.ServicerContext,
    ) -> pb.PushDataResponse:
        type(self).calls["PushData"] += 1
        return super().PushData(request_iterator, context)

    def PushPartition(  # noqa: N802
        self, request: PushChunk | SerializationError, context: grpc.ServicerContext
    ) -> pb.PushDataResponse:
        type(self).calls["PushPartition"] += 1
        return super().PushPartition(request, context)

    def CommitPartition(  # noqa: N802
        self, request: pb.CommitPartitionRequest, context: grpc.ServicerContext
    ) -> pb.CommitPartitionResponse:
        type(self).calls["CommitPartition"] += 1
        return super().CommitPartition(request, context)


class _PreviousWorker(_CountingWorker):
    """A worker of the protocol before a push's commit and ``PushPartition``: it does not know
    the call, and its PushData knows no ``commit`` field, so the message is an empty chunk."""

    def PushData(  # noqa: N802
        self,
        request_iterator: Iterator[PushChunk | SerializationError],
        context: grpc.ServicerContext,
    ) -> pb.PushDataResponse:
        def without_commits() -> Iterator[PushChunk | SerializationError]:
            for chunk in request_iterator:
                if isinstance(chunk, PushChunk):
                    chunk.header.ClearField("commit")
                yield chunk

        return super().PushData(without_commits(), context)

    def PushPartition(  # noqa: N802
        self, request: PushChunk | SerializationError, context: grpc.ServicerContext
    ) -> pb.PushDataResponse:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")


@pytest.mark.parametrize(
    ("worker_type", "chunk_size", "calls"),
    [
        (_CountingWorker, 4 << 10, {"PushData": 1}),
        (_CountingWorker, 1 << 20, {"PushPartition": 1}),
        (_CountingWorker, None, {"PushData": 1}),
        (_PreviousWorker, 4 << 10, {"PushData": 1, "CommitPartition": 1}),
        (_PreviousWorker, 1 << 20, {"PushData": 1, "CommitPartition": 1}),
    ],
    ids=[
        "stream",
        "whole",
        "stream-as-the-commit-would-take-it-past-a-chunk",
        "stream-to-an-older-worker",
        "whole-to-an-older-worker",
    ],
)
def test_the_client_pushes_whole_streams_or_commits_by_a_call_as_the_worker_takes_it(
    tmp_path: Path,
    worker_type: type[_CountingWorker],
    chunk_size: int | None,
    calls: dict[str, int],
) -> None:
    """A data file that fits a chunk with its index and manifest goes whole in one call; a
    larger one, or one to a worker that does not know that call, by a stream; to a worker
    before a push's commit, with a commit call. (None: a chunk just over the data file.)"""
    built = build_partition(rows=1_500)
    chunk_size = chunk_size or len(built.data) + 1
    _CountingWorker.calls.clear()
    with serving(Store(str(tmp_path / "store")), worker_type) as (service, stub, target):
        host, port = target.rsplit(":", 1)
        address = WorkerAddress("worker-0", host, int(port), service.address.store_url, False)
        channels = ChannelPool(ClientSettings("", None, 16 << 20, 30.0))
        unreachable: list[WorkerAddress] = []
        sink = PushSink(
            ExternalShuffleDescriptor(built.partition, (address,)),
            channels,
            PushSettings(chunk_size=chunk_size, max_in_flight=64 << 10, timeout=30.0),
            lambda worker, _: unreachable.append(worker),
        )
        stream = sink.open_data()
        stream.write(built.data)
        stream.close()
        sink.commit(built.index, built.manifest)
        channels.close()
        assert not unreachable
        assert service.state.committed(built.partition) is not None
        [entry] = stub.GetPartitionStatus(
            pb.WorkerPartitionStatusRequest(partitions=[built.key]), timeout=10
        ).partitions
        assert entry.committed
        manifest, runs = fetch_all(stub, built.key, [])
    assert manifest == built.manifest
    assert all(xxhash.xxh3_64_intdigest(data) == checksum for data, checksum in runs)
    assert 4 << 10 < len(built.data) < 1 << 20
    assert _CountingWorker.calls == Counter(calls)
