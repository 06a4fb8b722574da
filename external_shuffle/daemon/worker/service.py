"""The worker role: stores pushed partitions in the on-store format and serves them.

A push writes the data file's bytes as they arrive (nothing is held beyond the message being
written; a memory budget bounds those across all pushes, and a push waiting for the budget
stops reading its stream, so gRPC's flow control holds the producer back). The commit checks
the index and manifest against what arrived and writes them atomically, manifest last: a
partition is committed exactly when its manifest exists, which is what a restarted worker finds.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import grpc

from external_shuffle._proto import external_shuffle_pb2 as pb
from external_shuffle._proto import external_shuffle_pb2_grpc as pb_grpc
from external_shuffle.daemon.error_statuses import reports_errors
from external_shuffle.daemon.streams import OpenStreams, StreamLimits
from external_shuffle.daemon.worker.commit_watch import CommitWatch
from external_shuffle.ops.metrics import DaemonMetrics
from external_shuffle.options import MIN_CHUNK_SIZE
from external_shuffle.wire.errors import UnavailableError
from external_shuffle.wire.framing import PushChunk, fetch_prefix
from external_shuffle.wire.messages import (
    Commit,
    WorkerAddress,
    key_of,
    partition_of,
    statistics_to_pb,
)
from shuffle_api import (
    DataTooLargeError,
    InvalidIdentifierError,
    PartitionNotFoundError,
    PartitionStatistics,
    ResultPartitionID,
    SerializationError,
    ShuffleError,
    ShuffleServiceClosedError,
    StorageError,
    SubpartitionRange,
)
from shuffle_api.format import (
    DataStream,
    Layouts,
    PartitionFileReader,
    PartitionManifest,
    StoreSink,
    partition_directory,
    write_all,
)
from shuffle_api.format.manifest import MANIFEST_FILE
from shuffle_api.format.reader import check_commit
from shuffle_api.ids import IntermediateResultPartitionID, new_id, validate_id
from shuffle_api.store import Store, storage_errors

__all__ = ["Fetch", "MemoryBudget", "WorkerService"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_PARTITION_LOCK_STRIPES = 64
_WATCHED_COMMITS = 10_000
"""Commits a coordinator hears of in one heartbeat; beyond, the worker registers again."""

WORKER_ID_FILE = ".pyshuffle-worker-id"
"""Under the store root: the worker's id, so a restarted worker is the same worker. A name no
partition id can take (ids cannot start with a dot)."""


class MemoryBudget:
    """Bytes held by all pushes together. A reservation larger than the whole budget waits
    until nothing else is held, so it is admitted alone and never deadlocks."""

    def __init__(self, limit: int, timeout: float) -> None:
        self._limit = limit
        self._timeout = timeout
        self._used = 0
        self._condition = threading.Condition()

    @property
    def used(self) -> int:
        return self._used

    @contextlib.contextmanager
    def reserve(self, size: int) -> Iterator[None]:
        with self._condition:
            admitted = self._condition.wait_for(
                lambda: self._used == 0 or self._used + size <= self._limit, self._timeout
            )
            if not admitted:
                raise DataTooLargeError(
                    f"worker memory budget ({self._limit} bytes) stayed full for {self._timeout} s"
                )
            self._used += size
        try:
            yield
        finally:
            with self._condition:
                self._used -= size
                self._condition.notify_all()


@dataclass
class _Upload:
    """A partition attempt being pushed: its data file, open until the commit."""

    sink: StoreSink
    data: DataStream | None = None
    next_sequence: int = 0
    size: int = 0
    duplicates: int = 0
    streams: int = 0  # push streams open on it now (under the service's lock)
    last_active: float = 0.0  # when a message of it last arrived, or its last stream ended
    lock: threading.Lock = field(default_factory=threading.Lock)

    def append(self, sequence: int, data: memoryview) -> bool:
        """Write the message's bytes; False if its sequence number was already received."""
        with self.lock:
            if sequence < self.next_sequence:
                self.duplicates += 1
                return False
            if sequence > self.next_sequence:
                raise ShuffleError(
                    f"push of {self.sink.partition} skipped messages: expected sequence"
                    f" {self.next_sequence}, got {sequence}"
                )
            with storage_errors(self.sink.where):
                if self.data is None:
                    self.data = self.sink.open_data()
                write_all(self.data, data)
            self.next_sequence += 1
            self.size += len(data)
            return True

    def close(self) -> None:
        with self.lock, storage_errors(self.sink.where):
            if self.data is not None:
                self.data.close()


@dataclass(frozen=True, slots=True)
class Fetch:
    """A fetch the worker admitted: the partition's reader and the subpartitions asked for."""

    reader: PartitionFileReader
    subpartitions: SubpartitionRange
    sent: Callable[[int], None]
    """Called with the bytes of each piece sent: the fetch is not idle."""


@dataclass(frozen=True, slots=True)
class _Committed:
    """What the worker keeps of a committed partition: its statistics compressed (a few KiB
    where thousands of subpartitions' numbers take hundreds as Python integers)."""

    encoded_statistics: bytes
    subpartitions: int
    stored_bytes: int

    @classmethod
    def of(cls, statistics: PartitionStatistics, stored_bytes: int) -> _Committed:
        return cls(statistics.encode(), len(statistics.rows_per_subpartition), stored_bytes)

    def statistics(self) -> PartitionStatistics:
        return PartitionStatistics.decode(self.encoded_statistics, self.subpartitions)


def _until_cancelled(messages: Iterator[T]) -> Iterator[T]:
    """``messages`` until the stream ends or is cancelled (idle, or the client went away):
    the push then ends quietly, its upload kept for a retry or the reaper."""
    try:
        yield from messages
    except grpc.RpcError:
        logger.info("a push stream was cancelled")


class WorkerService(pb_grpc.WorkerServicer):
    """The worker's gRPC service and the partitions it holds."""

    def __init__(
        self,
        store: Store,
        *,
        host: str,
        port: int,
        data_port: int,
        store_shared: bool,
        memory_budget: int,
        budget_timeout: float,
        chunk_size: int,
        message_data_limit: int,
        metrics: DaemonMetrics,
        stream_limits: StreamLimits,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._clock = clock
        self._streams = OpenStreams(stream_limits, clock)
        self._chunk_size = chunk_size
        self._message_data_limit = message_data_limit
        self.metrics = metrics
        self._budget = MemoryBudget(memory_budget, budget_timeout)
        self._uploads: dict[ResultPartitionID, _Upload] = {}
        self._committed: dict[ResultPartitionID, _Committed] = {}
        self._commit_watches: list[CommitWatch] = []
        self._lock = threading.Lock()
        # Commit and release of one partition exclude each other (striped: file I/O happens
        # under them, and partitions apart do not wait for each other).
        self._partition_locks = [threading.Lock() for _ in range(_PARTITION_LOCK_STRIPES)]
        self._decommissioning = False  # until cancelled
        self._shutting_down = False  # for good
        self.address = WorkerAddress(
            self._load_worker_id(), host, port, store.url, store_shared, data_port
        )
        metrics.memory_in_use.set_function(lambda: self._budget.used)
        metrics.open_streams.set_function(lambda: len(self._streams))
        if store.is_local:
            metrics.store_free_bytes.set_function(lambda: store.free_bytes() or 0)
        self._recover()

    # --- identity and restart -----------------------------------------------------------------

    def _load_worker_id(self) -> str:
        path = f"{self._store.path()}/{WORKER_ID_FILE}"
        if self._store.exists(path):
            return self._store.read_bytes(path).decode("utf-8").strip()
        worker_id = "worker-" + new_id()
        self._store.put_atomic(path, worker_id.encode("utf-8"))
        return worker_id

    def _recover(self) -> None:
        """Find the committed partitions on the store; delete uncommitted leftovers (pushes cut
        off by a crash)."""
        fs, root = self._store.filesystem, self._store.path()
        directories = {path.rstrip("/") for path in fs.glob(f"{root}/*/*/*")}
        for directory in sorted(directories):
            relative = directory[len(root) :].strip("/").split("/")
            try:
                partition = ResultPartitionID(
                    IntermediateResultPartitionID(relative[0], int(relative[1])), relative[2]
                )
            except (InvalidIdentifierError, ValueError, IndexError):
                logger.warning("ignoring %s: not a partition directory", directory)
                continue
            try:
                reader = PartitionFileReader(self._store, partition)
            except PartitionNotFoundError:
                self._store.delete_tree(directory, empty_parents=2)
                logger.info("deleted uncommitted %s", partition)
                continue
            except ShuffleError as error:
                logger.warning("ignoring corrupt %s: %s", partition, error)
                continue
            self._committed[partition] = _Committed.of(
                reader.manifest.statistics, reader.manifest.data_bytes
            )
        self._update_gauges()
        if self._committed:
            logger.info("serving %d committed partitions found on the store", len(self._committed))

    def _update_gauges(self) -> None:
        self.metrics.partitions.labels(role="worker").set(len(self._committed))
        self.metrics.stored_bytes.set(sum(c.stored_bytes for c in self._committed.values()))

    # --- state for the coordinator ------------------------------------------------------------

    def watch_commits(self) -> CommitWatch:
        """Commits from now on, for one coordinator's heartbeats."""
        watch = CommitWatch(_WATCHED_COMMITS)
        with self._lock:
            self._commit_watches.append(watch)
        return watch

    def committed_partitions(self) -> list[ResultPartitionID]:
        with self._lock:
            return list(self._committed)

    def load(self) -> pb.WorkerLoad:
        with self._lock:
            return pb.WorkerLoad(
                stored_bytes=sum(c.stored_bytes for c in self._committed.values()),
                partitions=len(self._committed),
                buffered_bytes=self._budget.used,
                decommissioning=self.draining,
                store_free_bytes=self._store.free_bytes() or 0,
            )

    def drain(self) -> None:
        """Take no new partitions, for good (SIGTERM); committed ones are still served."""
        self._shutting_down = True

    @property
    def draining(self) -> bool:
        """Taking no new partitions: shutting down (:meth:`drain`), or decommissioning."""
        return self._shutting_down or self._decommissioning

    def wait_for_pushes(self, deadline: float) -> None:
        """Until ``deadline`` (``time.monotonic()``), wait for the partitions being pushed now
        to be committed or released: their commit is a call of its own, after the stream."""
        with self._lock:
            pushing = {p: u for p, u in self._uploads.items() if u.streams}
        while pushing and time.monotonic() < deadline:
            time.sleep(0.05)
            with self._lock:
                pushing = {p: u for p, u in pushing.items() if self._uploads.get(p) is u}

    def _partition_lock(self, partition: ResultPartitionID) -> threading.Lock:
        return self._partition_locks[hash(partition) % len(self._partition_locks)]

    def reap(self) -> None:
        """Cancel idle streams; delete uploads no stream has carried for the idle timeout
        (their producers are gone: a retried task pushes a new attempt)."""
        self._streams.idle()
        now = self._clock()
        timeout = self._streams.limits.idle_timeout
        with self._lock:
            abandoned = [
                partition
                for partition, upload in self._uploads.items()
                if not upload.streams and now - upload.last_active > timeout
            ]
        if abandoned:
            logger.info("deleting %d uploads abandoned for %s s", len(abandoned), timeout)
            self.release(abandoned)

    def release(self, partitions: list[ResultPartitionID]) -> int:
        released = 0
        for partition in partitions:
            with self._partition_lock(partition):
                released += self._forget(partition)
        with self._lock:
            self._update_gauges()
        return released

    def _forget(self, partition: ResultPartitionID) -> int:
        """Drop the partition and delete its files (under its partition lock); 1 if it was
        here."""
        with self._lock:
            upload = self._uploads.pop(partition, None)
            committed = self._committed.pop(partition, None)
        if upload is not None:
            upload.close()
        PartitionFileReader.forget(self._store, partition)
        self._store.delete_tree(partition_directory(self._store, partition), empty_parents=2)
        return int(upload is not None or committed is not None)

    # --- gRPC ---------------------------------------------------------------------------------

    @reports_errors
    def PushData(  # noqa: N802 (gRPC's method names)
        self,
        request_iterator: Iterator[PushChunk | SerializationError],
        context: grpc.ServicerContext,
    ) -> pb.PushDataResponse:
        first: pb.PartitionKey | None = None
        upload: _Upload | None = None
        dropped = 0
        stream = self._streams.open(context.peer(), context.cancel)
        started = time.perf_counter()
        try:
            for chunk in _until_cancelled(request_iterator):
                self._streams.touch(stream)
                if isinstance(chunk, SerializationError):
                    raise chunk
                message = chunk.header
                if first is None:
                    first = message.partition
                    upload = self._open_upload(partition_of(first))
                elif message.partition != first:
                    raise InvalidIdentifierError(
                        "one push stream carries one partition; got"
                        f" {partition_of(message.partition)} after {partition_of(first)}"
                    )
                if upload is None:
                    dropped += 1
                    self.metrics.duplicates_dropped.inc()
                    continue
                upload.last_active = self._clock()
                with self._budget.reserve(len(chunk.data)):
                    try:
                        appended = upload.append(message.sequence, chunk.data)
                    except StorageError:
                        # A full disk (or a failing one): what arrived of it is deleted.
                        self.release([partition_of(first)])
                        raise
                    if appended:
                        self.metrics.bytes_in.inc(len(chunk.data))
                    else:
                        self.metrics.duplicates_dropped.inc()
        finally:
            self._streams.close(stream)
            self.metrics.push_seconds.observe(time.perf_counter() - started)
            if upload is not None:
                with self._lock:
                    upload.streams -= 1
                    upload.last_active = self._clock()
        if upload is None:
            return pb.PushDataResponse(duplicates_dropped=dropped)
        return pb.PushDataResponse(received_bytes=upload.size, duplicates_dropped=upload.duplicates)

    def _open_upload(self, partition: ResultPartitionID) -> _Upload | None:
        with self._lock:
            existing = self._uploads.get(partition)
            if existing is not None:
                existing.streams += 1
                return existing  # a retried push: its sequence numbers drop what arrived
            if partition in self._committed:
                return None  # committed already: everything pushed again is a duplicate
            if self.draining:
                raise UnavailableError("worker is draining: it takes no new partitions")
            upload = _Upload(
                StoreSink(self._store, partition), streams=1, last_active=self._clock()
            )
            self._uploads[partition] = upload
            return upload

    @reports_errors
    def CommitPartition(  # noqa: N802
        self, request: pb.CommitPartitionRequest, context: grpc.ServicerContext
    ) -> pb.CommitPartitionResponse:
        partition = partition_of(request.partition)
        if request.application_id:
            validate_id(request.application_id, "application id")
        # A release of the same partition waits, or is waited for: never half of each.
        with self._partition_lock(partition):
            with self._lock:
                if partition in self._committed:
                    return pb.CommitPartitionResponse()  # a retried commit
                upload = self._uploads.get(partition)
            manifest = PartitionManifest.from_json(
                request.manifest, f"commit of {partition}", partition
            )
            if upload is None and manifest.data_bytes:
                raise PartitionNotFoundError(
                    f"commit of {partition}: no data of it is here (never pushed, or released)",
                    partition,
                )
            # Refused, the pushed bytes stay for a commit that agrees with them.
            check_commit(manifest, request.index, 0 if upload is None else upload.size, partition)
            sink = StoreSink(self._store, partition) if upload is None else upload.sink
            try:
                if upload is not None:
                    upload.close()
                sink.commit(request.index, request.manifest)
                # Fetches take layouts from a cache that does not look at the files again: a
                # partition deleted under this worker and pushed anew must not meet its old one.
                PartitionFileReader.forget(self._store, partition)
            except StorageError:
                self._forget(partition)  # a full disk gets its space back
                raise
            with self._lock:
                self._uploads.pop(partition, None)
                self._committed[partition] = _Committed.of(manifest.statistics, manifest.data_bytes)
                self._update_gauges()
                for watch in self._commit_watches:
                    watch.add(Commit(partition, request.application_id))
        return pb.CommitPartitionResponse()

    @contextlib.contextmanager
    def open_fetch(
        self, request: pb.FetchDataRequest, peer: str, cancel: Callable[[], object]
    ) -> Iterator[Fetch]:
        """Admit a fetch of ``peer`` (a stream: ``cancel`` ends it when idle) and open the
        partition it names; the fetch counts as open until the block ends."""
        partition = partition_of(request.partition)
        if request.last_subpartition < request.first_subpartition:
            raise InvalidIdentifierError(
                f"subpartitions {request.first_subpartition}..{request.last_subpartition}"
                " are not a range"
            )
        subpartitions = SubpartitionRange(request.first_subpartition, request.last_subpartition)
        # Admitted before any file is read: a refused fetch costs no I/O.
        stream = self._streams.open(peer, cancel)
        started = time.perf_counter()
        try:
            reader = PartitionFileReader(self._store, partition, Layouts.READ)
            if subpartitions.end >= reader.manifest.number_of_subpartitions:
                raise InvalidIdentifierError(
                    f"subpartitions {subpartitions.start}..{subpartitions.end} out of range:"
                    f" {partition} has {reader.manifest.number_of_subpartitions}"
                )
            yield Fetch(reader, subpartitions, functools.partial(self._sent, stream))
        finally:
            self._streams.close(stream)
            self.metrics.fetch_seconds.observe(time.perf_counter() - started)

    def _sent(self, stream: int, size: int) -> None:
        # A client that stops reading leaves its stream idle before the next send.
        self._streams.touch(stream)
        self.metrics.bytes_out.inc(size)

    @reports_errors
    def FetchData(  # noqa: N802
        self, request: pb.FetchDataRequest, context: grpc.ServicerContext
    ) -> Iterator[bytes]:
        """The manifest, then each run in chunks framed by hand (see ``framing``)."""
        with self.open_fetch(request, context.peer(), context.cancel) as fetch:
            reader = fetch.reader
            chunk_size = self._fetch_chunk_size(request.max_chunk_bytes)
            yield pb.FetchDataResponse(manifest=reader.manifest_bytes).SerializeToString()
            for run in reader.runs(fetch.subpartitions):
                for start in range(0, max(run.length, 1), chunk_size):
                    length = min(chunk_size, run.length - start)
                    last = start + length == run.length
                    prefix = fetch_prefix(
                        length, end_of_run=last, run_checksum=run.checksum if last else 0
                    )
                    yield reader.read_after(prefix, run, start, length)  # the client verifies
                    fetch.sent(length)

    def _fetch_chunk_size(self, requested: int) -> int:
        """Data bytes per fetched message: as many as the client takes, within this worker's
        message limit (a client that does not say gets the push chunk size)."""
        if not requested:
            return self._chunk_size
        return max(MIN_CHUNK_SIZE, min(requested, self._message_data_limit))

    @reports_errors
    def ReleasePartitions(  # noqa: N802
        self, request: pb.WorkerReleasePartitionsRequest, context: grpc.ServicerContext
    ) -> pb.WorkerReleasePartitionsResponse:
        partitions = [partition_of(key) for key in request.partitions]
        return pb.WorkerReleasePartitionsResponse(released=self.release(partitions))

    @reports_errors
    def GetPartitionStatus(  # noqa: N802
        self, request: pb.WorkerPartitionStatusRequest, context: grpc.ServicerContext
    ) -> pb.WorkerPartitionStatusResponse:
        entries = []
        for key in request.partitions:
            partition = partition_of(key)
            with self._lock:
                committed = self._committed.get(partition)
            if committed is not None and not self._store.exists(
                self._store.child(partition_directory(self._store, partition), MANIFEST_FILE)
            ):
                # Deleted behind the worker's back (disk wiped, operator): it is lost.
                with self._lock:
                    self._committed.pop(partition, None)
                committed = None
            entries.append(
                pb.WorkerPartitionStatusResponse.Entry(
                    partition=key_of(partition),
                    committed=committed is not None,
                    statistics=None
                    if committed is None or request.without_statistics
                    else statistics_to_pb(committed.statistics()),
                )
            )
        return pb.WorkerPartitionStatusResponse(partitions=entries)

    @reports_errors
    def Decommission(  # noqa: N802
        self, request: pb.DecommissionRequest, context: grpc.ServicerContext
    ) -> pb.DecommissionResponse:
        """Take no new partitions (committed ones are still served), or with ``cancel`` take
        them again, unless shutting down."""
        if not request.cancel:
            self._decommissioning = True
            logger.info("decommissioning: no new partitions")
        elif self._shutting_down:
            raise ShuffleServiceClosedError("the worker is shutting down: it stays drained")
        else:
            self._decommissioning = False
            logger.info("decommission cancelled: taking new partitions again")
        with self._lock:
            return pb.DecommissionResponse(partitions_remaining=len(self._committed))
