"""Raw gRPC calls to a worker daemon, and partitions built in memory with the real writer to
push by hand: shared by the tests of hostile and careless callers."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import grpc

from external_shuffle.daemon.streams import OpenStreamLimits
from external_shuffle.daemon.worker.service import WorkerService
from external_shuffle.local_cluster import LocalCluster
from external_shuffle.ops.metrics import DaemonMetrics
from external_shuffle.wire.framing import worker_rpc_handler
from external_shuffle.wire.messages import key_of
from external_shuffle.wire.stubs import pb, pb_grpc
from shuffle_api import (
    IntermediateResultPartitionID,
    PartitionStatistics,
    ResultPartitionID,
)
from shuffle_api.ids import new_id
from shuffle_api.testing import make_batches
from shuffle_runtime.format import PartitionFileWriter, PartitionSink, partition_directory
from shuffle_runtime.store import Store

SUBPARTITIONS = 4
CHUNK = 16 << 10
BIG_CHANNEL = [
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.max_receive_message_length", 64 << 20),
]


# --- a partition built in memory with the real writer ------------------------------------------


class _Bytes:
    """The data file as a byte string (a BytesIO forgets its content when closed)."""

    def __init__(self) -> None:
        self.content = bytearray()

    def write(self, data: bytes | memoryview, /) -> int:
        self.content += data
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class CapturingSink(PartitionSink):
    """Keeps the data file, index and manifest the writer produces, to push them by hand."""

    def __init__(self, partition: ResultPartitionID) -> None:
        self._partition = partition
        self.data = _Bytes()
        self.index = b""
        self.manifest = b""

    @property
    def partition(self) -> ResultPartitionID:
        return self._partition

    @property
    def where(self) -> str:
        return "memory"

    def open_data(self) -> _Bytes:
        return self.data

    def commit(self, index: bytes, manifest: bytes) -> None:
        self.index, self.manifest = index, manifest

    def abort(self) -> None:
        self.data.content.clear()


@dataclasses.dataclass(frozen=True)
class BuiltPartition:
    partition: ResultPartitionID
    data: bytes
    index: bytes
    manifest: bytes
    statistics: PartitionStatistics
    rows: list[int]

    @property
    def key(self) -> pb.PartitionKey:
        return key_of(self.partition)

    def chunks(self) -> list[bytes]:
        return [self.data[offset : offset + CHUNK] for offset in range(0, len(self.data), CHUNK)]


def new_partition() -> ResultPartitionID:
    return ResultPartitionID(
        IntermediateResultPartitionID("result-" + new_id(), 0), "attempt-" + new_id()
    )


def build_partition(
    rows: int = 4_000,
    memory_budget: int = 64 << 10,
    partition: ResultPartitionID | None = None,
) -> BuiltPartition:
    """A real partition (several regions, every subpartition) in the on-store format, of a
    new id unless given; a run holds at most about ``memory_budget / SUBPARTITIONS`` bytes."""
    partition = partition or new_partition()
    sink = CapturingSink(partition)
    writer = PartitionFileWriter(sink, SUBPARTITIONS, codec="none", memory_budget=memory_budget)
    batches = make_batches(rows, batch_rows=250)
    for number, batch in enumerate(batches):
        writer.add(number % SUBPARTITIONS, batch)
    statistics = writer.commit()
    assert sink.manifest, "the writer committed"
    every_row = sorted(row for batch in batches for row in batch.column("row").to_pylist())
    return BuiltPartition(
        partition, bytes(sink.data.content), sink.index, sink.manifest, statistics, every_row
    )


# --- raw calls ----------------------------------------------------------------------------------


def auth(cluster: LocalCluster) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {cluster.token_file.read_text().strip()}")]


def code_of(call: Callable[[], object]) -> grpc.StatusCode:
    """The status a call fails with (the test fails if it succeeds)."""
    try:
        call()
    except grpc.RpcError as error:
        assert isinstance(error, grpc.Call)
        code: grpc.StatusCode = error.code()
        return code
    raise AssertionError("the call succeeded")


def push_requests(
    key: pb.PartitionKey,
    chunks: Sequence[bytes],
    sequences: Sequence[int],
    placement: bytes = b"",
) -> Iterator[pb.PushDataRequest]:
    for sequence in sequences:
        yield pb.PushDataRequest(
            partition=key, sequence=sequence, data=chunks[sequence], placement=placement
        )


def push(cluster: LocalCluster, worker: pb_grpc.WorkerStub, built: BuiltPartition) -> None:
    chunks = built.chunks()
    worker.PushData(
        push_requests(built.key, chunks, range(len(chunks))), metadata=auth(cluster), timeout=30
    )


def commit(
    cluster: LocalCluster,
    worker: pb_grpc.WorkerStub,
    built: BuiltPartition,
    *,
    index: bytes | None = None,
    manifest: bytes | None = None,
) -> None:
    worker.CommitPartition(
        pb.CommitPartitionRequest(
            partition=built.key,
            index=built.index if index is None else index,
            manifest=built.manifest if manifest is None else manifest,
        ),
        metadata=auth(cluster),
        timeout=30,
    )


def committed(cluster: LocalCluster, worker: pb_grpc.WorkerStub, built: BuiltPartition) -> bool:
    status = pb.WorkerPartitionStatusRequest(partitions=[built.key])
    [entry] = worker.GetPartitionStatus(status, metadata=auth(cluster), timeout=10).partitions
    return bool(entry.committed)


def stored(cluster: LocalCluster, worker: pb_grpc.WorkerStub, built: BuiltPartition) -> None:
    """``built`` pushed whole to ``worker`` and committed there."""
    push(cluster, worker, built)
    commit(cluster, worker, built)


def fetch_messages(
    stub: pb_grpc.WorkerStub,
    key: pb.PartitionKey,
    metadata: list[tuple[str, str]],
    max_chunk_bytes: int = 0,
) -> list[pb.FetchDataResponse]:
    """Every message of a fetch of all subpartitions."""
    return list(
        stub.FetchData(
            pb.FetchDataRequest(
                partition=key,
                first_subpartition=0,
                last_subpartition=SUBPARTITIONS - 1,
                max_chunk_bytes=max_chunk_bytes,
            ),
            metadata=metadata,
            timeout=30,
        )
    )


def runs_in(messages: Sequence[pb.FetchDataResponse]) -> list[list[pb.FetchDataResponse]]:
    """A fetch's data messages, run by run (each run ends with an end_of_run message)."""
    runs: list[list[pb.FetchDataResponse]] = [[]]
    for message in messages:
        if message.manifest:
            continue
        runs[-1].append(message)
        if message.end_of_run:
            runs.append([])
    assert runs.pop() == [], "the last run ended"
    return runs


def fetch_all(
    stub: pb_grpc.WorkerStub, key: pb.PartitionKey, metadata: list[tuple[str, str]]
) -> tuple[bytes, list[tuple[bytes, int]]]:
    """The manifest and each run's bytes with the checksum the worker sent for it."""
    messages = fetch_messages(stub, key, metadata)
    manifest = next(message.manifest for message in messages if message.manifest)
    runs = [
        (b"".join(message.data for message in run), run[-1].run_checksum)
        for run in runs_in(messages)
    ]
    return manifest, runs


def tree(directory: Path) -> set[str]:
    """Every path under ``directory`` (logs are written to, but no path appears or vanishes
    unless something creates or deletes it)."""
    return {str(path.relative_to(directory)) for path in directory.rglob("*")}


def partition_exists(cluster: LocalCluster, partition: ResultPartitionID) -> bool:
    store = Store(str(cluster.worker_store(0)))
    return Path(partition_directory(store, partition)).exists()


# --- a worker service in this process -----------------------------------------------------------


@contextmanager
def serving(
    store: Store, service_type: type[WorkerService] = WorkerService
) -> Iterator[tuple[WorkerService, pb_grpc.WorkerStub, str]]:
    """A ``service_type`` on ``store``, served in this process on a free port (no token): the
    service, a stub of it and its target."""
    service = service_type(
        store,
        host="127.0.0.1",
        port=0,
        data_port=0,
        store_shared=False,
        memory_budget=1 << 20,
        budget_timeout=10,
        chunk_size=64 << 10,
        message_data_limit=1 << 20,
        metrics=DaemonMetrics(),
        stream_limits=OpenStreamLimits(idle_timeout=30, max_streams=8, max_streams_per_peer=8),
    )
    server = grpc.server(ThreadPoolExecutor(16))
    server.add_generic_rpc_handlers((worker_rpc_handler(service),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    target = f"127.0.0.1:{port}"
    try:
        with grpc.insecure_channel(target, options=BIG_CHANNEL) as channel:
            yield service, pb_grpc.WorkerStub(channel), target
    finally:
        server.stop(None)
