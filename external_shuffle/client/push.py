"""Pushing a partition to its workers: the data file as a client stream per replica, ended by
a message with the index and manifest that commits it (a worker older than that message
commits with a call of its own). A data file that fits one chunk with its index and manifest
(most map outputs) goes with its commit in one ``PushPartition`` call per replica instead: no
stream to set up on either side (a worker older than that call gets the stream).

A writer's bytes are cut into chunks and queued per replica; past
``external-shuffle.client.max-in-flight`` queued bytes the writer waits (backpressure). With
replication, a replica that fails is dropped (and reported to the coordinator) while another
one still takes the data; the partition fails only when none does.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import pyarrow as pa

from external_shuffle.client.descriptor import ExternalShuffleDescriptor
from external_shuffle.wire.channels import ChannelPool, translate_rpc_error
from external_shuffle.wire.framing import frame_push, push_data_call, push_partition_call
from external_shuffle.wire.messages import WorkerAddress, key_of
from external_shuffle.wire.stubs import pb, pb_grpc
from shuffle_api import ResultPartitionID, ShuffleError, TransportError
from shuffle_runtime.format import PartitionSink

__all__ = ["PushSettings", "PushSink"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PushSettings:
    chunk_size: int
    max_in_flight: int
    timeout: float
    application_id: str = ""
    """Named in each commit: the worker tells its coordinators whose partition it holds."""


class _ReplicaPush:
    """One worker's client stream for one partition attempt: framed messages queue here."""

    def __init__(
        self,
        worker: WorkerAddress,
        channel: grpc.Channel,
        partition: ResultPartitionID,
        settings: PushSettings,
    ) -> None:
        self.worker = worker
        self._partition = partition
        self._settings = settings
        self._queue: deque[bytes | None] = deque()
        self._in_flight = 0
        self._condition = threading.Condition()
        self.sent = 0
        self._call = push_data_call(channel).future(self._requests())
        self._call.add_done_callback(lambda _: self._wake())

    def _wake(self) -> None:
        with self._condition:
            self._condition.notify_all()

    def _requests(self) -> Iterator[bytes]:
        while True:
            with self._condition:
                self._condition.wait_for(lambda: bool(self._queue))
                message = self._queue.popleft()
            if message is None:
                return
            yield message
            with self._condition:
                self._in_flight -= len(message)
                self._condition.notify_all()

    def error(self) -> ShuffleError | None:
        if not self._call.done() or self._call.cancelled():
            return None
        failure = self._call.exception()
        if failure is None:
            return None
        if isinstance(failure, grpc.RpcError):
            return translate_rpc_error(
                failure, f"push of {self._partition} to worker {self.worker.target}"
            )
        return ShuffleError(f"push of {self._partition} to {self.worker.target}: {failure}")

    def send(self, message: bytes, data_bytes: int) -> None:
        """Queue a framed message carrying ``data_bytes`` of the data file."""
        with self._condition:
            self._condition.wait_for(
                lambda: (
                    self._call.done()
                    or self._in_flight == 0
                    or self._in_flight + len(message) <= self._settings.max_in_flight
                )
            )
            if self._call.done():
                raise self.error() or TransportError(
                    f"push of {self._partition} to {self.worker.target} ended early"
                )
            self._queue.append(message)
            self._in_flight += len(message)
            self.sent += data_bytes
            self._condition.notify_all()

    def finish(self) -> bool:
        """End the stream and check that the worker got every byte; whether it committed
        them."""
        with self._condition:
            self._queue.append(None)
            self._condition.notify_all()
        try:
            response = self._call.result(timeout=self._settings.timeout)
        except grpc.RpcError as error:
            raise translate_rpc_error(
                error, f"push of {self._partition} to worker {self.worker.target}"
            ) from error
        if response.received_bytes != self.sent:
            raise TransportError(
                f"worker {self.worker.target} received {response.received_bytes} bytes of"
                f" {self._partition}, {self.sent} were sent"
            )
        return response.committed

    def cancel(self) -> None:
        self._call.cancel()
        with self._condition:
            self._queue.append(None)
            self._condition.notify_all()


class _DataStream:
    """The data file as the partition writer sees it: a write-only stream, cut into chunks.

    A chunk is framed (copied) once, from views of the writes that fill it. The end of a write
    that starts the next chunk is kept until that chunk is full: as it is if pyarrow handed it
    over as bytes or an Arrow buffer (which never change), else as a copy, as its owner may
    reuse it. So the stream holds less than a chunk besides the messages it framed.
    """

    def __init__(self, sink: PushSink) -> None:
        self._sink = sink
        self._pending: list[memoryview] = []
        self._pending_bytes = 0
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> int:
        view = memoryview(data).cast("B")
        size = len(view)
        chunk = self._sink.settings.chunk_size
        while self._pending_bytes + len(view) >= chunk:
            taken = chunk - self._pending_bytes
            self._pending.append(view[:taken])
            self._pending_bytes = chunk
            self._send_pending()
            view = view[taken:]
        if view:
            if not (view.readonly and isinstance(view.obj, bytes | pa.Buffer)):
                view = memoryview(bytes(view))
            self._pending.append(view)
            self._pending_bytes += len(view)
        return size

    def _send_pending(self) -> None:
        try:
            self._sink.send(self._pending, self._pending_bytes)
        finally:
            # Emptied in place, for the frames that hold it too (a dropped replica's error
            # keeps them): no view of the writer's buffers outlives the call.
            self._pending.clear()
            self._pending_bytes = 0

    def flush(self) -> None:
        """Chunks go out when full; the rest on close."""

    def close(self) -> None:
        """Send the rest, or leave it to the commit if nothing was sent (the whole file is
        under a chunk); the commit ends the pushes."""
        if self.closed:
            return
        self.closed = True
        if self._sink.streaming:
            if self._pending:
                self._send_pending()
        else:
            self._sink.hold(list(self._pending), self._pending_bytes)
            self._pending.clear()
            self._pending_bytes = 0


class PushSink(PartitionSink):
    """Sends one partition attempt's files to the replicas its descriptor names, with the
    coordinator's placement."""

    def __init__(
        self,
        descriptor: ExternalShuffleDescriptor,
        channels: ChannelPool,
        settings: PushSettings,
        on_unreachable: Callable[[WorkerAddress, ShuffleError], None],
    ) -> None:
        self._partition = partition = descriptor.partition
        self._replicas = replicas = descriptor.replicas
        self._placement = descriptor.placement
        self._channels = channels
        self.settings = settings
        self._on_unreachable = on_unreachable
        self._key = key_of(partition)
        self._sequence = 0
        self._pushes: list[_ReplicaPush] = []
        self._live = list(replicas)
        self.streaming = False
        # The whole data file, when it ended under a chunk before any was sent.
        self._held: list[memoryview] | None = None
        self._held_bytes = 0

    @property
    def partition(self) -> ResultPartitionID:
        return self._partition

    @property
    def where(self) -> str:
        return "workers " + ", ".join(worker.target for worker in self._replicas)

    def _stub(self, worker: WorkerAddress) -> pb_grpc.WorkerStub:
        return pb_grpc.WorkerStub(self._channels.get(worker.target))

    def open_data(self) -> _DataStream:
        """The data file's stream; the pushes start with its first full chunk."""
        return _DataStream(self)

    def _start_streams(self, workers: Sequence[WorkerAddress]) -> None:
        self.streaming = True
        self._pushes = [
            _ReplicaPush(worker, self._channels.get(worker.target), self._partition, self.settings)
            for worker in workers
        ]

    def hold(self, parts: list[memoryview], size: int) -> None:
        """Keep the whole data file (``size`` bytes, under a chunk) for the commit."""
        self._held, self._held_bytes = parts, size

    def _drop(self, worker: WorkerAddress, error: ShuffleError) -> None:
        """A replica failed: go on without it while another one takes the data."""
        self._live = [w for w in self._live if w != worker]
        self._pushes = [p for p in self._pushes if p.worker != worker]
        if isinstance(error, TransportError):
            self._on_unreachable(worker, error)
        if not self._live:
            raise error
        logger.warning("replica %s of %s dropped: %s", worker.target, self._partition, error)

    def send(
        self, parts: Sequence[memoryview], size: int, commit: pb.PushCommit | None = None
    ) -> None:
        """Frame the chunk made of ``parts`` (``size`` bytes), or the ``commit``, and queue it
        for every replica; each gets the same messages, so the same sequence numbers."""
        if not self.streaming:
            self._start_streams(self._live)
        message = self._frame(parts, size, commit)
        self._sequence += 1
        for push in list(self._pushes):
            try:
                push.send(message, size)
            except ShuffleError as error:
                self._drop(push.worker, error)

    def _frame(self, parts: Sequence[memoryview], size: int, commit: pb.PushCommit | None) -> bytes:
        return frame_push(
            pb.PushDataRequest(
                partition=self._key,
                sequence=self._sequence,
                application_id=self.settings.application_id,
                placement=self._placement,
                commit=commit,
            ),
            parts,
            size,
        )

    def commit(self, index: bytes, manifest: bytes) -> None:
        committed: set[WorkerAddress] = set()
        if self._held is not None:
            # Whole only where the data, index and manifest fit one message as a chunk does.
            if self._held_bytes + len(index) + len(manifest) <= self.settings.chunk_size:
                committed = self._push_whole(self._held, self._held_bytes, index, manifest)
            streamed = [worker for worker in self._live if worker not in committed]
            if streamed:
                self._start_streams(streamed)
                self.send(self._held, self._held_bytes)
        if self._pushes:
            self.send((), 0, pb.PushCommit(index=index, manifest=manifest))
            for push in list(self._pushes):
                try:
                    if push.finish():
                        committed.add(push.worker)
                except ShuffleError as error:
                    self._drop(push.worker, error)
        uncommitted = [worker for worker in self._live if worker not in committed]
        if uncommitted:
            self._commit_by_call(uncommitted, index, manifest)

    def _push_whole(
        self, parts: Sequence[memoryview], size: int, index: bytes, manifest: bytes
    ) -> set[WorkerAddress]:
        """Push and commit the data file in one call per replica; the replicas that committed
        it (not those too old to take the call)."""
        message = self._frame(parts, size, pb.PushCommit(index=index, manifest=manifest))
        return self._call_each(
            self._live,
            lambda worker: push_partition_call(self._channels.get(worker.target)).future(
                message, timeout=self.settings.timeout
            ),
            f"push of {self._partition} to worker",
            unimplemented_ok=True,
        )

    def _call_each(
        self,
        workers: Sequence[WorkerAddress],
        start: Callable[[WorkerAddress], grpc.Future[Any]],
        what: str,
        *,
        unimplemented_ok: bool = False,
    ) -> set[WorkerAddress]:
        """Call every worker at once (a map task waits for one round trip, not one per
        replica) and drop those that fail; the workers whose call succeeded. One that does not
        know the call, with ``unimplemented_ok``, is neither."""
        calls = [(worker, start(worker)) for worker in workers]
        succeeded: set[WorkerAddress] = set()
        for worker, call in calls:
            try:
                call.result()
            except grpc.RpcError as failure:
                if not (unimplemented_ok and failure.code() == grpc.StatusCode.UNIMPLEMENTED):
                    self._drop(worker, translate_rpc_error(failure, f"{what} {worker.target}"))
                continue
            succeeded.add(worker)
        return succeeded

    def _commit_by_call(
        self, workers: Sequence[WorkerAddress], index: bytes, manifest: bytes
    ) -> None:
        """Commit on ``workers`` with CommitPartition: no data was pushed, or the workers are
        older than a push's commit."""
        request = pb.CommitPartitionRequest(
            partition=key_of(self._partition),
            index=index,
            manifest=manifest,
            application_id=self.settings.application_id,
            placement=self._placement,
        )
        self._call_each(
            workers,
            lambda worker: self._stub(worker).CommitPartition.future(
                request, timeout=self.settings.timeout
            ),
            f"commit of {self._partition} on worker",
        )

    def abort(self) -> None:
        for push in self._pushes:
            push.cancel()
        request = pb.WorkerReleasePartitionsRequest(partitions=[key_of(self._partition)])
        for worker in self._replicas:
            # Best effort: what a worker keeps is deleted when the coordinator releases it.
            with contextlib.suppress(grpc.RpcError):
                self._stub(worker).ReleasePartitions(request, timeout=self.settings.timeout)
