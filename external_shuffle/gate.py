"""The external service's input gate: each partition from its store when the store is shared,
else fetched from its replicas in order, over a replica's data port or else over gRPC (a failed
replica's successor resumes after the runs already read: replicas hold the same bytes, so their
runs match one for one).

Over data ports, the gate reads the partitions of one worker one after another, and asks for
them in one request (a batch), as Spark's reducers fetch a host's blocks: a request per
partition cost a round trip and the worker's turn each, most of a small block's time."""

from __future__ import annotations

import collections
import contextlib
import logging
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass

import pyarrow as pa

from external_shuffle._proto import external_shuffle_pb2 as pb
from external_shuffle.channels import ChannelPool
from external_shuffle.data_fetch import (
    END_OF_PARTITION,
    DataPortUnreachableError,
    Received,
    fetch_over_data_port,
    fetch_over_grpc,
)
from external_shuffle.data_frames import MAX_BATCH
from external_shuffle.descriptor import ExternalShuffleDescriptor
from external_shuffle.wire import WorkerAddress, key_of
from shuffle_api import (
    InputGateDeploymentDescriptor,
    IntermediateResultPartitionID,
    PartitionCorruptedError,
    PartitionNotFoundError,
    ResultPartitionID,
    ShuffleDescriptor,
    ShuffleError,
    TransportError,
)
from shuffle_api.connections import ConnectionPool
from shuffle_api.format import PartitionManifest, decode_run, verify_checksum
from shuffle_api.gate import SequentialInputGate

__all__ = ["ExternalInputGate", "GateSettings"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GateSettings:
    read_from_store: bool
    unknown_timeout: float
    max_chunk_bytes: int  # the most data bytes a fetched message (or frame) may carry
    timeout: float
    """For a data port's connection and each of its reads."""


class ExternalInputGate(SequentialInputGate):
    def __init__(
        self,
        descriptor: InputGateDeploymentDescriptor,
        channels: ChannelPool,
        settings: GateSettings,
        on_unreachable: Callable[[WorkerAddress, ShuffleError], None],
        on_close: Callable[[SequentialInputGate], None],
        *,
        data_ports: ConnectionPool | None,
        grpc_only: set[str],
    ) -> None:
        """``data_ports``: connections to workers' data ports (None: fetch over gRPC only);
        ``grpc_only``: workers whose data port could not be reached (both shared by the gates
        of an environment: each such worker costs one failed connection, not one per gate)."""
        super().__init__(descriptor, unknown_timeout=settings.unknown_timeout, on_close=on_close)
        self._channels = channels
        self._data_ports = data_ports
        self._settings = settings
        self._on_unreachable = on_unreachable
        self._grpc_only = grpc_only
        self._order: list[int] = []
        self._positions: dict[IntermediateResultPartitionID, int] = {}
        self._batches: dict[str, _Batch] = {}  # by worker target: the one being read

    def _reading_order(self) -> list[int]:
        """Each worker's partitions (by their first replica) one after another, in the order
        given; unknown descriptors last."""
        by_worker: dict[str, list[int]] = {}
        unknown: list[int] = []
        for index in range(len(self._shuffle_descriptors)):
            if (target := self._first_replica(index)) is not None:
                by_worker.setdefault(target, []).append(index)
            else:
                unknown.append(index)
        self._order = [index for indexes in by_worker.values() for index in indexes] + unknown
        self._positions = {
            self._shuffle_descriptors[index].result_partition_id.partition_id: position
            for position, index in enumerate(self._order)
        }
        return self._order

    def _read(self, descriptor: ShuffleDescriptor) -> Generator[pa.RecordBatch]:
        if not isinstance(descriptor, ExternalShuffleDescriptor):
            raise ShuffleError(
                f"external_shuffle cannot read {descriptor.result_partition_id}: its descriptor"
                f" is a {type(descriptor).__name__}"
            )
        partition = descriptor.result_partition_id
        if self._settings.read_from_store:
            for replica in descriptor.replicas:
                if replica.store_shared and (
                    reader := self._open_on_store(replica.store_url, partition)
                ):
                    yield from reader.read(self.subpartitions)
                    return
        runs_read = 0
        failures: list[str] = []
        replicas = list(descriptor.replicas)
        asked_again = False
        while replicas:
            replica = replicas[0]
            try:
                for run_batches in self._fetch(replica, partition, skip=runs_read):
                    yield from run_batches
                    runs_read += 1
                return
            except _CutBatchError as error:
                if not asked_again:
                    asked_again = False
                    logger.info("%s; asking again", error)
                    continue
                failure: ShuffleError = error
            # A replica that is gone, or whose copy is corrupt: the next one may be whole.
            except (TransportError, PartitionNotFoundError, PartitionCorruptedError) as error:
                failure = error
            replicas.pop(0)
            failures.append(str(failure))
            if isinstance(failure, TransportError):
                self._on_unreachable(replica, failure)
            logger.warning("reading %s from %s failed: %s", partition, replica.target, failure)
        raise PartitionNotFoundError(
            f"partition {partition} could not be read from any replica: " + "; ".join(failures),
            partition,
        )

    def _fetch(
        self, worker: WorkerAddress, partition: ResultPartitionID, *, skip: int
    ) -> Iterator[list[pa.RecordBatch]]:
        """The batches of each run of the gate's subpartitions, run by run, after ``skip``."""
        what = f"fetch of {partition} from worker {worker.target}"
        schema: pa.Schema | None = None
        run = 0
        for received in self._receive(worker, what, partition):
            if isinstance(received, PartitionManifest):
                schema = received.schema
                continue
            run += 1
            if run <= skip:
                continue
            verify_checksum(received.data, received.checksum, partition, f"a run from {what}")
            assert schema is not None, "the manifest comes first"
            yield list(decode_run(received.data, schema, partition))

    def _request(self, partition: ResultPartitionID) -> pb.FetchDataRequest:
        return pb.FetchDataRequest(
            partition=key_of(partition),
            first_subpartition=self.subpartitions.start,
            last_subpartition=self.subpartitions.end,
            max_chunk_bytes=self._settings.max_chunk_bytes,
        )

    def _receive(
        self, worker: WorkerAddress, what: str, partition: ResultPartitionID
    ) -> Iterator[Received]:
        data_ports = self._data_ports
        if data_ports is not None and worker.data_port and worker.target not in self._grpc_only:
            try:
                yield from self._from_batch(worker, partition, data_ports)
                return
            except DataPortUnreachableError as error:
                # Nothing was read: a network that lets only the gRPC port through still works.
                self._grpc_only.add(worker.target)
                logger.warning("%s; fetching from it over gRPC", error)
        channel = self._channels.get(worker.target)
        yield from fetch_over_grpc(channel, self._request(partition), what, partition)

    def _from_batch(
        self, worker: WorkerAddress, partition: ResultPartitionID, data_ports: ConnectionPool
    ) -> Iterator[Received]:
        """The partition from the batch asked of ``worker`` that has it next, or from a new one
        (with the partitions read after it there)."""
        batch = self._batches.pop(worker.target, None)
        if batch is None or not batch.serves_next(partition):
            if batch is not None:
                batch.close()
            fetches = [(self._request(part), part) for part in self._batch_from(worker, partition)]
            batch = _Batch(
                [part for _, part in fetches],
                fetch_over_data_port(
                    worker,
                    fetches,
                    connections=data_ports,
                    timeout=self._settings.timeout,
                    max_frame_size=self._settings.max_chunk_bytes,
                ),
            )
        try:
            yield from batch.receive(partition)
        except TransportError as error:
            batch.close()
            if batch.delivered:
                # The worker may have ended a batch that waited too long for its reader (its
                # stream idle timeout: a consumer that paused), through no fault of its own.
                raise _CutBatchError(f"a batched {error}") from error
            raise
        except BaseException:
            batch.close()  # a failure or an abandoned read: its connection is closed
            raise
        if batch.pending:
            self._batches[worker.target] = batch

    def _batch_from(
        self, worker: WorkerAddress, partition: ResultPartitionID
    ) -> list[ResultPartitionID]:
        """``partition``, and the partitions read right after it whose first replica is
        ``worker`` too and which are known and not on a store read directly."""
        batch = [partition]
        position = self._positions.get(partition.partition_id)
        if position is None or self._first_replica(self._order[position]) != worker.target:
            return batch  # asked of a replica other than the first: alone
        for index in self._order[position + 1 : position + MAX_BATCH]:
            descriptor = self._shuffle_descriptors[index]
            if self._first_replica(index) != worker.target or (
                self._settings.read_from_store
                and isinstance(descriptor, ExternalShuffleDescriptor)
                and any(replica.store_shared for replica in descriptor.replicas)
            ):
                break
            batch.append(descriptor.result_partition_id)
        return batch

    def _first_replica(self, index: int) -> str | None:
        """The target of the first replica of the partition at ``index``, if it is known."""
        descriptor = self._shuffle_descriptors[index]
        if isinstance(descriptor, ExternalShuffleDescriptor) and descriptor.replicas:
            return descriptor.replicas[0].target
        return None

    def close(self) -> None:
        batches = list(self._batches.values())
        self._batches.clear()
        for batch in batches:
            batch.close()
        super().close()


class _CutBatchError(TransportError):
    """A batch broke after it had delivered something: asked again once before the worker
    counts as failed."""


class _Batch:
    """The answers to one batched request, taken partition by partition in its order."""

    def __init__(
        self, partitions: list[ResultPartitionID], answers: Iterator[Received | None]
    ) -> None:
        self._pending = collections.deque(partitions)
        self._answers = answers
        self.delivered = False

    @property
    def pending(self) -> int:
        return len(self._pending)

    def serves_next(self, partition: ResultPartitionID) -> bool:
        return bool(self._pending) and self._pending[0] == partition

    def receive(self, partition: ResultPartitionID) -> Iterator[Received]:
        assert self.serves_next(partition)
        self._pending.popleft()
        for answer in self._answers:
            if answer is END_OF_PARTITION:
                if not self._pending:
                    # The request's end: its connection goes back to the pool.
                    next(self._answers, None)
                return
            self.delivered = True
            yield answer
        raise TransportError(f"the answers to a batch ended before the end of {partition}")

    def close(self) -> None:
        if isinstance(self._answers, Generator):
            # ValueError: it runs in another thread (a gate closed from outside its reader).
            with contextlib.suppress(ValueError):
                self._answers.close()
