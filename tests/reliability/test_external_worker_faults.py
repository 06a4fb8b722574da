"""A worker daemon under files that change, a full disk and commits that lie: each gives its
caller a typed error and the daemon serves on. Real daemons on 127.0.0.1, raw gRPC; the race
of a commit and a release in-process, on a real store."""

from __future__ import annotations

import base64
import json
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import grpc
import pyarrow as pa
import pytest
import xxhash
from grpc_health.v1 import health_pb2, health_pb2_grpc

from external_shuffle.local_cluster import LocalCluster
from external_shuffle.options import MIN_CHUNK_SIZE
from external_shuffle.wire.channels import translate_rpc_error
from external_shuffle.wire.errors import TooManyStreamsError
from external_shuffle.wire.stubs import pb, pb_grpc
from shuffle_api import (
    PartitionCorruptedError,
    PartitionNotFoundError,
    PartitionStatistics,
    StorageFullError,
)
from shuffle_runtime.format import partition_directory
from shuffle_runtime.format.manifest import DATA_FILE, MANIFEST_FILE
from shuffle_runtime.format.reader import MAX_SUBPARTITIONS
from shuffle_runtime.store import Store
from tests.reliability.external_cluster import partition_files
from tests.reliability.raw_worker import (
    BIG_CHANNEL,
    BuiltPartition,
    auth,
    build_partition,
    code_of,
    commit,
    committed,
    fetch_all,
    push,
    push_requests,
    serving,
    stored,
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("worker-faults"), workers=1) as running:
        yield running


def serves(cluster: LocalCluster, worker: pb_grpc.WorkerStub) -> None:
    """The daemon answers health checks and takes and returns a new partition whole."""
    with grpc.insecure_channel(cluster.worker_target(0)) as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=10
        )
    assert answer.status == health_pb2.HealthCheckResponse.SERVING
    built = build_partition(rows=500)
    stored(cluster, worker, built)
    manifest, runs = fetch_all(worker, built.key, auth(cluster))
    assert manifest == built.manifest
    assert all(xxhash.xxh3_64_intdigest(data) == checksum for data, checksum in runs)


def data_file(cluster: LocalCluster, built: BuiltPartition) -> Path:
    store = Store(str(cluster.worker_store(0)))
    return Path(partition_directory(store, built.partition)) / DATA_FILE


# --- a file changed under a fetch ---------------------------------------------------------------


def test_a_data_file_truncated_during_a_fetch_fails_that_fetch_only(
    cluster: LocalCluster, worker: pb_grpc.WorkerStub
) -> None:
    # Many runs of small chunks: the worker is still reading runs when the file is cut.
    built = build_partition(rows=600_000, memory_budget=256 << 10)
    stored(cluster, worker, built)
    stream = worker.FetchData(
        pb.FetchDataRequest(
            partition=built.key,
            first_subpartition=0,
            last_subpartition=3,
            max_chunk_bytes=MIN_CHUNK_SIZE,
        ),
        metadata=auth(cluster),
        timeout=30,
    )
    with pytest.raises(grpc.RpcError) as failed:
        for number, _ in enumerate(stream):
            if number == 1:
                os.truncate(data_file(cluster, built), 100)
    assert isinstance(failed.value, grpc.Call)
    assert failed.value.code() == grpc.StatusCode.DATA_LOSS, failed.value.details()
    error = translate_rpc_error(failed.value, "fetch")
    assert isinstance(error, PartitionCorruptedError)
    assert error.partition_id == built.partition
    serves(cluster, worker)


def test_a_data_file_deleted_before_a_fetch_is_not_found(
    cluster: LocalCluster, worker: pb_grpc.WorkerStub
) -> None:
    built = build_partition(rows=1_000)
    stored(cluster, worker, built)
    data_file(cluster, built).unlink()
    assert code_of(lambda: fetch_all(worker, built.key, auth(cluster))) in (
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.DATA_LOSS,
    )
    serves(cluster, worker)


def test_a_partition_deleted_under_the_worker_and_pushed_anew_is_served_anew(
    cluster: LocalCluster, worker: pb_grpc.WorkerStub
) -> None:
    first = build_partition(rows=1_000)
    stored(cluster, worker, first)
    assert fetch_all(worker, first.key, auth(cluster))[0] == first.manifest
    shutil.rmtree(data_file(cluster, first).parent)
    assert not committed(cluster, worker, first), "the worker sees its files gone"
    again = build_partition(rows=3_000, partition=first.partition)
    stored(cluster, worker, again)
    manifest, runs = fetch_all(worker, again.key, auth(cluster))
    assert manifest == again.manifest != first.manifest
    assert all(xxhash.xxh3_64_intdigest(data) == checksum for data, checksum in runs)


# --- a full disk --------------------------------------------------------------------------------


def test_a_full_disk_is_resource_exhausted_a_storage_full_error_and_leaves_nothing(
    cluster: LocalCluster, worker: pb_grpc.WorkerStub
) -> None:
    """The data file is a link to /dev/full: every write of it fails with the kernel's own
    ENOSPC, as on a full filesystem."""
    built = build_partition(rows=2_000)
    path = data_file(cluster, built)
    path.parent.mkdir(parents=True)
    path.symlink_to("/dev/full")
    with pytest.raises(grpc.RpcError) as failed:
        push(cluster, worker, built)
    assert isinstance(failed.value, grpc.Call)
    assert failed.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, failed.value.details()
    error = translate_rpc_error(failed.value, "push")
    assert type(error) is StorageFullError
    assert "no space left" in str(error)
    assert not path.parent.exists(), "what arrived of it is deleted"
    assert not committed(cluster, worker, built)
    serves(cluster, worker)


# --- commits that lie ---------------------------------------------------------------------------


def _manifest_with(built: BuiltPartition, **changes: object) -> bytes:
    document = json.loads(built.manifest)
    document.update(changes)
    return json.dumps(document).encode()


def _index_shifted(built: BuiltPartition, by: int) -> bytes:
    table = pa.ipc.open_file(pa.py_buffer(built.index)).read_all()
    offsets = pa.array(
        [value + by for value in table.column("offset").to_pylist()],
        type=table.schema.field("offset").type,
    )
    shifted = table.set_column(table.schema.get_field_index("offset"), "offset", offsets)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, shifted.schema) as writer:
        writer.write_table(shifted)
    return bytes(sink.getvalue())


def _lies(built: BuiltPartition) -> dict[str, tuple[bytes, bytes]]:
    index = _index_shifted(built, 1 << 40)
    one_subpartition = PartitionStatistics((1,), (1,), (1,)).encode()
    return {
        "2,000,000 subpartitions": (
            built.index,
            _manifest_with(built, number_of_subpartitions=2_000_000),
        ),
        "statistics of other subpartitions": (
            built.index,
            _manifest_with(
                built,
                statistics=base64.b64encode(one_subpartition).decode(),
            ),
        ),
        "runs 1 TiB past the data": (
            index,
            _manifest_with(built, index_checksum=xxhash.xxh3_64_intdigest(index)),
        ),
    }


@pytest.mark.parametrize(
    "lie",
    ["2,000,000 subpartitions", "statistics of other subpartitions", "runs 1 TiB past the data"],
)
def test_a_commit_that_lies_about_what_arrived_is_refused(
    cluster: LocalCluster, worker: pb_grpc.WorkerStub, lie: str
) -> None:
    assert MAX_SUBPARTITIONS < 2_000_000
    built = build_partition(rows=1_000)
    push(cluster, worker, built)
    index, manifest = _lies(built)[lie]
    with pytest.raises(grpc.RpcError) as failed:
        commit(cluster, worker, built, index=index, manifest=manifest)
    assert isinstance(failed.value, grpc.Call)
    assert failed.value.code() == grpc.StatusCode.DATA_LOSS
    error = translate_rpc_error(failed.value, "commit")
    assert isinstance(error, PartitionCorruptedError)
    assert error.partition_id == built.partition
    assert not committed(cluster, worker, built)
    assert code_of(lambda: fetch_all(worker, built.key, auth(cluster))) == grpc.StatusCode.NOT_FOUND
    # The pushed bytes stay for the commit that tells the truth.
    commit(cluster, worker, built)
    assert committed(cluster, worker, built)
    serves(cluster, worker)


# --- a commit and a release of one partition, at once -------------------------------------------


class _HeldStore(Store):
    """A store whose manifest writes wait until the test lets them go."""

    def __init__(self, url: str) -> None:
        super().__init__(url, memory_map=False)
        self.writing_manifest = threading.Event()
        self.go = threading.Event()

    def put_atomic(self, path: str, data: bytes) -> None:
        if path.endswith(MANIFEST_FILE):
            self.writing_manifest.set()
            assert self.go.wait(30)
        super().put_atomic(path, data)


def test_a_release_during_a_commit_waits_for_it_and_then_deletes_everything(
    tmp_path: Path,
) -> None:
    store = _HeldStore(str(tmp_path / "store"))
    built = build_partition(rows=1_000)
    with serving(store) as (service, stub, _):
        chunks = built.chunks()
        stub.PushData(push_requests(built.key, chunks, range(len(chunks))), timeout=30)
        request = pb.CommitPartitionRequest(
            partition=built.key, index=built.index, manifest=built.manifest
        )
        committing = threading.Thread(target=stub.CommitPartition, args=(request,))
        committing.start()
        assert store.writing_manifest.wait(30)
        releasing = threading.Thread(target=service.state.release, args=([built.partition],))
        releasing.start()
        releasing.join(0.2)
        assert releasing.is_alive(), "the release waits for the commit under way"
        store.go.set()
        committing.join(30)
        releasing.join(30)
        assert built.partition not in service.state.committed_partitions()
        assert not Path(partition_directory(store, built.partition)).exists()


def test_a_commit_after_a_release_is_not_found_and_leaves_nothing(
    cluster: LocalCluster, worker: pb_grpc.WorkerStub
) -> None:
    built = build_partition(rows=1_000)
    push(cluster, worker, built)
    worker.ReleasePartitions(
        pb.WorkerReleasePartitionsRequest(partitions=[built.key]),
        metadata=auth(cluster),
        timeout=10,
    )
    with pytest.raises(grpc.RpcError) as failed:
        commit(cluster, worker, built)
    assert isinstance(failed.value, grpc.Call)
    assert failed.value.code() == grpc.StatusCode.NOT_FOUND
    error = translate_rpc_error(failed.value, "commit")
    assert isinstance(error, PartitionNotFoundError)
    assert error.partition_id == built.partition
    assert not committed(cluster, worker, built)
    assert not data_file(cluster, built).parent.exists()


# --- clients that open streams and go silent ----------------------------------------------------


@pytest.fixture
def strict(tmp_path: Path) -> Iterator[LocalCluster]:
    settings = {
        "external-shuffle.worker.stream-idle-timeout": 3.0,
        "external-shuffle.worker.max-streams": 4,
        "external-shuffle.worker.max-streams-per-peer": 3,
    }
    with LocalCluster(tmp_path, workers=1, settings=settings) as running:
        yield running


def _silent_pushes(
    worker: pb_grpc.WorkerStub, cluster: LocalCluster, count: int, stop: threading.Event
) -> list[grpc.Future[pb.PushDataResponse]]:
    """``count`` pushes that send their first message (a partition's first bytes) and then
    nothing, until ``stop``."""

    def half_sent(built: BuiltPartition) -> Iterator[pb.PushDataRequest]:
        yield pb.PushDataRequest(partition=built.key, sequence=0, data=built.chunks()[0])
        stop.wait()

    # Built first: the pushes start together, well within one idle timeout.
    partitions = [build_partition(rows=500) for _ in range(count)]
    return [
        worker.PushData.future(half_sent(built), metadata=auth(cluster)) for built in partitions
    ]


def test_silent_streams_are_capped_cancelled_and_their_uploads_deleted(
    strict: LocalCluster,
) -> None:
    cluster = strict
    stop = threading.Event()
    with grpc.insecure_channel(cluster.worker_target(0), options=BIG_CHANNEL) as channel:
        worker = pb_grpc.WorkerStub(channel)
        try:
            pushes = _silent_pushes(worker, cluster, 6, stop)
            # Past the cap of one client: refused at once (the others wait for the idle
            # timeout), and the daemon still answers.
            deadline = time.monotonic() + 10
            while sum(p.done() for p in pushes) < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
            refused = [p for p in pushes if p.done()]
            assert [_code(p) for p in refused] == [grpc.StatusCode.RESOURCE_EXHAUSTED] * 3
            error = translate_rpc_error(cast(grpc.RpcError, refused[0].exception()), "push")
            assert isinstance(error, TooManyStreamsError)
            with grpc.insecure_channel(cluster.worker_target(0)) as health:
                answer = health_pb2_grpc.HealthStub(health).Check(
                    health_pb2.HealthCheckRequest(), timeout=5
                )
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
            # The silent ones are cancelled after the idle timeout...
            for push in pushes:
                assert _code(push, timeout=30) in (
                    grpc.StatusCode.CANCELLED,
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                )
        finally:
            stop.set()
        # ... their partial uploads deleted after as long again ...
        deadline = time.monotonic() + 30
        while _arrow_files(cluster) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _arrow_files(cluster)
        # ... and the worker takes new pushes whole.
        serves(cluster, worker)


def _arrow_files(cluster: LocalCluster) -> list[Path]:
    return [path for path in partition_files(cluster, 0) if path.suffix == ".arrow"]


def _code(call: grpc.Future[pb.PushDataResponse], timeout: float = 0.0) -> grpc.StatusCode | None:
    """The status a call ended with (None: still open after ``timeout`` seconds)."""
    try:
        call.result(timeout=timeout)
    except grpc.FutureTimeoutError:
        return None
    except grpc.RpcError as error:
        assert isinstance(error, grpc.Call)
        code: grpc.StatusCode = error.code()
        return code
    return grpc.StatusCode.OK


def test_a_worker_shutting_down_stays_drained_when_its_decommission_is_cancelled(
    tmp_path: Path,
) -> None:
    with serving(Store(str(tmp_path / "store"))) as (service, stub, _):
        stub.Decommission(pb.DecommissionRequest(), timeout=10)
        stub.Decommission(pb.DecommissionRequest(cancel=True), timeout=10)
        assert not service.state.draining
        stub.Decommission(pb.DecommissionRequest(), timeout=10)
        service.state.drain()  # SIGTERM
        cancel = pb.DecommissionRequest(cancel=True)
        code = code_of(lambda: stub.Decommission(cancel, timeout=10))
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        assert service.state.draining
        assert service.state.load().decommissioning
