"""The worker role's gRPC service: pushes, commits, fetches, releases and status over the
worker's state (``state``), each stream admitted within the worker's limits."""

from __future__ import annotations

import contextlib
import functools
import logging
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import grpc

from external_shuffle.daemon.error_statuses import reports_errors
from external_shuffle.daemon.streams import OpenStreamLimits, OpenStreams
from external_shuffle.daemon.worker.state import Upload, WorkerState
from external_shuffle.ops.metrics import DaemonMetrics
from external_shuffle.options import MIN_CHUNK_SIZE
from external_shuffle.wire.credentials import CLUSTER_CREDENTIAL, Credential, CredentialCheck, Role
from external_shuffle.wire.framing import PushChunk, fetch_prefix
from external_shuffle.wire.messages import WorkerAddress, key_of, partition_of, statistics_to_pb
from external_shuffle.wire.stubs import pb, pb_grpc
from shuffle_api import (
    AuthenticationError,
    InvalidIdentifierError,
    InvalidOperationError,
    ResultPartitionID,
    SerializationError,
    SubpartitionRange,
)
from shuffle_runtime.format import PartitionFileReader
from shuffle_runtime.store import Store

__all__ = ["Fetch", "WorkerService"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Fetch:
    """A fetch the worker admitted: the partition's reader and the subpartitions asked for."""

    reader: PartitionFileReader
    subpartitions: SubpartitionRange
    sent: Callable[[int], None]
    """Called with the bytes of each piece sent: the fetch is not idle."""


def _until_cancelled(messages: Iterator[T]) -> Iterator[T]:
    """``messages`` until the stream ends or is cancelled (idle, or the client went away):
    the push then ends quietly, its upload kept for a retry or the reaper."""
    try:
        yield from messages
    except grpc.RpcError:
        logger.info("a push stream was cancelled")


def _next_push(
    chunk: PushChunk | SerializationError,
    first: pb.PartitionKey | None,
    commit: pb.PushCommit | None,
) -> PushChunk:
    """A push stream's next message, checked against those before it."""
    if isinstance(chunk, SerializationError):
        raise chunk
    message = chunk.header
    if commit is not None:
        raise InvalidOperationError("a push stream ends with its commit: a message came after it")
    if first is not None and message.partition != first:
        raise InvalidIdentifierError(
            "one push stream carries one partition; got"
            f" {partition_of(message.partition)} after {partition_of(first)}"
        )
    if message.HasField("commit") and chunk.data:
        raise InvalidOperationError("a push stream's commit carries no data")
    return chunk


class WorkerService(pb_grpc.WorkerServicer):
    """The worker's gRPC service, thin over its :class:`WorkerState`: streams admitted and
    timed out, messages framed, metrics counted."""

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
        stream_limits: OpenStreamLimits,
        tier: Store | None = None,
        application_quota: int = 0,
        credentials: CredentialCheck | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._credentials = credentials
        self.state = WorkerState(
            store,
            memory_budget=memory_budget,
            budget_timeout=budget_timeout,
            tier=tier,
            application_quota=application_quota,
            clock=clock,
        )
        self._streams = OpenStreams(stream_limits, clock)
        self._chunk_size = chunk_size
        self._message_data_limit = message_data_limit
        self.metrics = metrics
        self.address = WorkerAddress(
            self.state.worker_id,
            host,
            port,
            store.url,
            store_shared,
            data_port,
            "" if tier is None else tier.url,
            socket.gethostname(),
        )
        state = self.state
        metrics.memory_in_use.set_function(lambda: state.buffered_bytes)
        metrics.open_streams.set_function(lambda: len(self._streams))
        metrics.partitions.labels(role="worker").set_function(lambda: state.partition_count)
        metrics.stored_bytes.set_function(lambda: state.stored_bytes)
        if store.is_local:
            metrics.store_free_bytes.set_function(lambda: store.free_bytes() or 0)

    def reap(self) -> None:
        """Cancel idle streams; delete uploads no stream has carried for the idle timeout."""
        self._streams.idle()
        self.state.reap_uploads(self._streams.limits.idle_timeout)

    def move_to_tier(self, high_water: int) -> int:
        """Move what :meth:`WorkerState.partitions_to_move` picks to the tier store (a move that
        fails is logged and tried again next time); returns the partitions moved."""
        moved = 0
        for partition in self.state.partitions_to_move(high_water, high_water * 4 // 5):
            try:
                size = self.state.move_to_tier(partition)
            except Exception as error:  # one partition's (or the tier's) failure stops no move
                logger.warning("moving %s to the tier store failed: %s", partition, error)
                continue
            moved += 1
            self.metrics.bytes_moved_to_tier.inc(size)
        if moved:
            logger.info("moved %d partitions to the tier store", moved)
        return moved

    # --- gRPC ---------------------------------------------------------------------------------

    @reports_errors
    def PushData(  # noqa: N802 (gRPC's method names)
        self,
        request_iterator: Iterator[PushChunk | SerializationError],
        context: grpc.ServicerContext,
    ) -> pb.PushDataResponse:
        first: pb.PartitionKey | None = None
        upload: Upload | None = None
        commit: pb.PushCommit | None = None
        dropped = 0
        stream = self._streams.open(context.peer(), context.cancel)
        started = time.perf_counter()
        try:
            for chunk in _until_cancelled(request_iterator):
                self._streams.touch(stream)
                received = _next_push(chunk, first, commit)
                message = received.header
                if first is None:
                    first = message.partition
                    partition = partition_of(first)
                    application = self._writer_of(
                        context, message.application_id, partition, message.placement, "push into"
                    )
                    upload = self.state.begin_push(partition, application)
                if message.HasField("commit"):
                    commit = message.commit
                elif upload is None:
                    dropped += 1
                    self.metrics.duplicates_dropped.inc()
                else:
                    self._append(upload, message.sequence, received.data)
        finally:
            self._streams.close(stream)
            self.metrics.push_seconds.observe(time.perf_counter() - started)
            if upload is not None:
                self.state.end_push(upload)
        if upload is None:
            response = pb.PushDataResponse(duplicates_dropped=dropped)
        else:
            response = pb.PushDataResponse(
                received_bytes=upload.size, duplicates_dropped=upload.duplicates
            )
        if commit is not None:
            # One call less a map task: the stream that carried the data commits it.
            self.state.commit(partition, application, commit.index, commit.manifest)
            response.committed = True
        return response

    def _append(self, upload: Upload, sequence: int, data: memoryview) -> None:
        """One pushed message's data into its upload, counted as received or as a duplicate."""
        if self.state.append(upload, sequence, data):
            self.metrics.bytes_in.inc(len(data))
        else:
            self.metrics.duplicates_dropped.inc()

    @reports_errors
    def PushPartition(  # noqa: N802
        self, request: PushChunk | SerializationError, context: grpc.ServicerContext
    ) -> pb.PushDataResponse:
        if isinstance(request, SerializationError):
            raise request
        message = request.header
        if not message.HasField("commit"):
            raise InvalidOperationError("a partition pushed in one message carries its commit")
        partition = partition_of(message.partition)
        application = self._writer_of(
            context, message.application_id, partition, message.placement, "push into"
        )
        started = time.perf_counter()
        upload = self.state.begin_push(partition, application)
        received = 0
        if upload is not None:  # else committed already: this is a retry
            try:
                if request.data:
                    self._append(upload, message.sequence, request.data)
                received = upload.size
            finally:
                self.state.end_push(upload)
                self.metrics.push_seconds.observe(time.perf_counter() - started)
        self.state.commit(partition, application, message.commit.index, message.commit.manifest)
        return pb.PushDataResponse(received_bytes=received, committed=True)

    @reports_errors
    def CommitPartition(  # noqa: N802
        self, request: pb.CommitPartitionRequest, context: grpc.ServicerContext
    ) -> pb.CommitPartitionResponse:
        partition = partition_of(request.partition)
        application = self._writer_of(
            context, request.application_id, partition, request.placement, "commit"
        )
        self.state.commit(partition, application, request.index, request.manifest)
        return pb.CommitPartitionResponse()

    @reports_errors
    def MergePartitions(  # noqa: N802
        self, request: pb.MergePartitionsRequest, context: grpc.ServicerContext
    ) -> pb.MergePartitionsResponse:
        merged = partition_of(request.merged)
        application = self._writer_of(
            context, request.application_id, merged, request.placement, "merge into"
        )
        sources = [partition_of(key) for key in request.sources]
        caller = self._caller(context)
        for source in sources:
            self._check_owns(caller, source, "merge")
        started = time.perf_counter()
        statistics = self.state.merge(merged, application, sources, request.number_of_subpartitions)
        logger.info(
            "merged %d partitions into %s in %.2f s",
            len(sources),
            merged,
            time.perf_counter() - started,
        )
        return pb.MergePartitionsResponse(statistics=statistics_to_pb(statistics))

    def _caller(self, context: grpc.ServicerContext) -> Credential:
        if self._credentials is None:
            return CLUSTER_CREDENTIAL
        caller = self._credentials.credential_of_call(context.invocation_metadata())
        self._check_still_valid(caller)
        return caller

    def _writer_of(
        self,
        context: grpc.ServicerContext,
        named: str,
        partition: ResultPartitionID,
        placement: bytes,
        verb: str,
    ) -> str:
        """The application a push or commit of ``partition`` is for: the one it names, or an
        application credential's own; PermissionDeniedError if the caller may not write it
        (an application's credential: another's partition, or one no coordinator placed for
        it, which another application may have been placed and not yet pushed)."""
        caller = self._caller(context)
        if self._credentials is None or caller.role is not Role.APPLICATION:
            return named
        application = named or caller.name
        caller.check_application(application, "write for")
        self._check_owns(caller, partition, verb)
        self._credentials.check_placement(caller, partition, placement, verb)
        return application

    def _check_still_valid(self, caller: Credential) -> None:
        """AuthenticationError for a credential expired since it was checked (a data port
        connection outlives its handshake), or of an application that ended."""
        if caller.expires_at is not None and time.time() >= caller.expires_at:
            raise AuthenticationError(f"the credential of {caller} expired")
        self.state.ended.check(caller)

    def _check_owns(self, caller: Credential, partition: ResultPartitionID, action: str) -> None:
        """PermissionDeniedError unless ``caller`` may ``action`` ``partition``, if it is here
        (an application's credential: its own application's only)."""
        owner = self.state.owner(partition)
        if owner is not None:
            caller.check_partition(owner, action, partition)

    @contextlib.contextmanager
    def open_fetch(
        self,
        request: pb.FetchDataRequest,
        peer: str,
        cancel: Callable[[], object],
        caller: Credential = CLUSTER_CREDENTIAL,
    ) -> Iterator[Fetch]:
        """Admit a fetch of ``peer`` (a stream: ``cancel`` ends it when idle) and open the
        partition it names, if ``caller`` may read it; the fetch counts as open until the
        block ends."""
        partition = partition_of(request.partition)
        self._check_still_valid(caller)  # a data port connection outlives its handshake
        self._check_owns(caller, partition, "fetch")
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
            reader = self.state.open_reader(partition, subpartitions)
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
        caller = self._caller(context)
        with self.open_fetch(request, context.peer(), context.cancel, caller) as fetch:
            reader = fetch.reader
            chunk_size = self._fetch_chunk_size(request.max_chunk_bytes)
            yield pb.FetchDataResponse(manifest=reader.manifest_to_send).SerializeToString()
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
        caller = self._caller(context)
        for partition in partitions:
            self._check_owns(caller, partition, "release")
        return pb.WorkerReleasePartitionsResponse(released=self.state.release(partitions))

    @reports_errors
    def GetPartitionStatus(  # noqa: N802
        self, request: pb.WorkerPartitionStatusRequest, context: grpc.ServicerContext
    ) -> pb.WorkerPartitionStatusResponse:
        entries = []
        caller = self._caller(context)
        for key in request.partitions:
            partition = partition_of(key)
            self._check_owns(caller, partition, "look at")
            committed = self.state.committed(partition)
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
        remaining = self.state.decommission(
            cancel=request.cancel, asked_by=str(self._caller(context))
        )
        return pb.DecommissionResponse(partitions_remaining=remaining)
