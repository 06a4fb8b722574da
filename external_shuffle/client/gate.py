"""The external service's input gate: each partition from its store when the store is shared,
else fetched from its replicas in order, over a replica's data port or else over gRPC (a failed
replica's successor resumes after the runs already read: replicas hold the same bytes, so their
runs match one for one). Over data ports, each worker is asked once for the partitions read
from it one after another (see ``shuffle_runtime.gate``). A partition no replica serves is read
from a replica's tier store, where its worker may have moved it before it was lost."""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass

import pyarrow as pa

from external_shuffle.client.descriptor import ExternalShuffleDescriptor
from external_shuffle.client.fetch import (
    DataPortUnreachableError,
    Received,
    fetch_over_data_port,
    fetch_over_grpc,
)
from external_shuffle.wire.channels import ChannelPool
from external_shuffle.wire.messages import WorkerAddress, key_of
from external_shuffle.wire.stubs import pb
from shuffle_api import (
    InputGateDeploymentDescriptor,
    PartitionCorruptedError,
    PartitionNotFoundError,
    ResultPartitionID,
    ShuffleDescriptor,
    ShuffleError,
    TransportError,
)
from shuffle_runtime.connections import ConnectionPool
from shuffle_runtime.format import (
    Layouts,
    PartitionFileReader,
    PartitionManifest,
    decode_run,
    verify_checksum,
)
from shuffle_runtime.gate import Asker, SequentialInputGate

__all__ = ["ExternalGateSettings", "ExternalInputGate"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ExternalGateSettings:
    read_from_store: bool
    unknown_timeout: float
    max_chunk_bytes: int  # the most data bytes a fetched message (or frame) may carry
    timeout: float
    """For a data port's connection and each of its reads."""
    sources_in_flight: int = 1


class ExternalInputGate(SequentialInputGate):
    def __init__(
        self,
        descriptor: InputGateDeploymentDescriptor,
        channels: ChannelPool,
        settings: ExternalGateSettings,
        on_unreachable: Callable[[WorkerAddress, ShuffleError], None],
        on_close: Callable[[SequentialInputGate], None],
        *,
        data_ports: ConnectionPool | None,
        grpc_only: set[str],
    ) -> None:
        """``data_ports``: connections to workers' data ports (None: fetch over gRPC only);
        ``grpc_only``: workers whose data port could not be reached (both shared by the gates
        of an environment: each such worker costs one failed connection, not one per gate)."""
        super().__init__(
            descriptor,
            unknown_timeout=settings.unknown_timeout,
            on_close=on_close,
            sources_in_flight=settings.sources_in_flight,
        )
        self._channels = channels
        self._data_ports = data_ports
        self._settings = settings
        self._on_unreachable = on_unreachable
        self._grpc_only = grpc_only

    def _batch_source(self, index: int) -> str | None:
        """The partition's first replica, unless the partition is read from its store."""
        descriptor = self._shuffle_descriptors[index]
        if not isinstance(descriptor, ExternalShuffleDescriptor) or not descriptor.replicas:
            return None
        if self._settings.read_from_store and any(
            replica.store_shared for replica in descriptor.replicas
        ):
            return None
        return descriptor.replicas[0].target

    def _read(self, descriptor: ShuffleDescriptor) -> Generator[pa.RecordBatch]:
        if not isinstance(descriptor, ExternalShuffleDescriptor):
            raise ShuffleError(
                f"external_shuffle cannot read {descriptor.result_partition_id}: its descriptor"
                f" is a {type(descriptor).__name__}"
            )
        partition = descriptor.result_partition_id
        failures: list[str] = []
        if self._settings.read_from_store and (
            yield from self._read_from_shared_store(descriptor, failures)
        ):
            return
        runs_read = yield from self._read_from_replicas(descriptor, failures)
        if runs_read is None:
            return
        if (yield from self._read_from_tier_store(descriptor, runs_read, failures)):
            return
        raise PartitionNotFoundError(
            f"partition {partition} could not be read from any replica: " + "; ".join(failures),
            partition,
        )

    def _read_from_shared_store(
        self, descriptor: ExternalShuffleDescriptor, failures: list[str]
    ) -> Generator[pa.RecordBatch, None, bool]:
        """Reads the partition from the first replica's store shared with this host that has
        it; True once it is read whole, False (failures noted) if none has it."""
        partition = descriptor.result_partition_id
        for replica in descriptor.replicas:
            if replica.store_shared and (
                reader := self._open_on_store(replica.store_url, partition)
            ):
                read_any = False
                try:
                    for batch in reader.read(self.subpartitions):
                        read_any = True
                        yield batch
                    return True
                except PartitionNotFoundError as error:
                    # Gone since its layout was cached (moved to the tier, say): the
                    # worker, or the tier, may have it still.
                    if read_any:
                        raise
                    failures.append(str(error))
        return False

    def _read_from_replicas(
        self, descriptor: ExternalShuffleDescriptor, failures: list[str]
    ) -> Generator[pa.RecordBatch, None, int | None]:
        """Fetches the partition from its replicas in order, each resuming after the runs read
        already; None once it is read whole, else (failures noted) the runs read."""
        partition = descriptor.result_partition_id
        runs_read = 0
        for replica in descriptor.replicas:
            try:
                for run_batches in self._fetch(replica, partition, skip=runs_read):
                    yield from run_batches
                    runs_read += 1
                return None
            # A replica that is gone, or whose copy is corrupt: the next one may be whole.
            except (TransportError, PartitionNotFoundError, PartitionCorruptedError) as error:
                failures.append(str(error))
                if isinstance(error, TransportError):
                    self._on_unreachable(replica, error)
                logger.warning("reading %s from %s failed: %s", partition, replica.target, error)
        return runs_read

    def _read_from_tier_store(
        self, descriptor: ExternalShuffleDescriptor, runs_read: int, failures: list[str]
    ) -> Generator[pa.RecordBatch, None, bool]:
        """Reads the partition, after its first ``runs_read`` runs, from the first of its
        replicas' tier stores that has it; True once read, False (failures noted) if none."""
        partition = descriptor.result_partition_id
        for tier_url in dict.fromkeys(r.tier_url for r in descriptor.replicas if r.tier_url):
            try:
                reader = PartitionFileReader(
                    self._shared_store(tier_url), partition, Layouts.MAPPED
                )
            except Exception as error:  # not there, or this host cannot reach the store
                failures.append(f"not on the tier store {tier_url}: {error}")
                continue
            schema = reader.schema
            runs = [] if schema is None else list(reader.runs(self.subpartitions))
            # Runs match the replicas' one for one: the ones read already are skipped.
            for run in runs[runs_read:]:
                yield from decode_run(reader.read_run(run), schema, partition)
            logger.info("read %s from the tier store %s", partition, tier_url)
            return True
        return False

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
        return self._batched(worker.target, partition, self._ask(worker, data_ports))

    def _asker(self, index: int) -> Asker | None:
        descriptor = self._shuffle_descriptors[index]
        data_ports = self._data_ports
        if (
            data_ports is None
            or self._batch_source(index) is None
            or not isinstance(descriptor, ExternalShuffleDescriptor)
        ):
            return None
        worker = descriptor.replicas[0]
        if not worker.data_port or worker.target in self._grpc_only:
            return None
        return self._ask(worker, data_ports)

    def _ask(self, worker: WorkerAddress, data_ports: ConnectionPool) -> Asker:
        """Asks the worker's data port for partitions it holds."""

        def ask(partitions: list[ResultPartitionID]) -> Iterator[Received | None]:
            return fetch_over_data_port(
                worker,
                [(self._request(part), part) for part in partitions],
                connections=data_ports,
                timeout=self._settings.timeout,
                max_frame_size=self._settings.max_chunk_bytes,
            )

        return ask
