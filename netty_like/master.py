"""netty_like's ShuffleMaster: descriptors point at the producer's data port, and what exists is
learnt from there.

Each producer's data port (an executor's host, or the producing process itself) answers which
of its partitions it still holds and releases them; a data port that no longer answers took its
partitions with it. Partitions of producers that serve no data port, and partitions on a
shared store (an object store), are checked and deleted on the master's own view of the store:
those on a shared store outlive their producers.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from operator import methodcaller
from typing import TypeVar

from netty_like.control import ControlConnection
from netty_like.descriptor import NettyShuffleDescriptor
from netty_like.options import MAX_FRAME_SIZE, PARTITION_REQUEST_TIMEOUT, STORAGE_URL, tls_files
from shuffle_api import (
    LOCAL_ONLY_PORT,
    JobShuffleContext,
    PartitionCorruptedError,
    PartitionDescriptor,
    PartitionNotFoundError,
    PartitionStatistics,
    PartitionWithMetrics,
    ProducerDescriptor,
    ResultPartitionID,
    ShuffleDescriptor,
    ShuffleError,
    ShuffleMaster,
    ShuffleMasterContext,
    ShuffleServiceClosedError,
)
from shuffle_api.master import completed
from shuffle_runtime.format import (
    PartitionFileReader,
    is_committed,
    partition_directory,
    result_directories,
)
from shuffle_runtime.store import Store

__all__ = ["NettyShuffleMaster"]

_LOG = logging.getLogger(__name__)
# A host being shut down that does not answer within this is gone or going.
_SHUTDOWN_TIMEOUT = 5.0

T = TypeVar("T")
_Endpoint = tuple[str, int]


@dataclass
class _Job:
    context: JobShuffleContext
    partitions: dict[ResultPartitionID, tuple[PartitionDescriptor, NettyShuffleDescriptor]] = field(
        default_factory=dict
    )
    shared_results: set[str] = field(default_factory=set)
    """Results with partitions on the shared store that are not persistent: their whole
    prefixes go with the job (attempts whose producers died while writing are there too)."""


class NettyShuffleMaster(ShuffleMaster):
    def __init__(self, context: ShuffleMasterContext) -> None:
        self._context = context
        config = context.configuration
        self._store = Store(config.get(STORAGE_URL))
        self._secret = context.secret
        self._timeout = config.get(PARTITION_REQUEST_TIMEOUT)
        self._max_frame_size = config.get(MAX_FRAME_SIZE)
        tls = tls_files(config)
        self._tls = tls.client_context()
        self._jobs: dict[str, _Job] = {}
        self._controls: dict[_Endpoint, ControlConnection] = {}
        self._endpoints: set[_Endpoint] = set()
        self._lock = threading.Lock()
        self._started = False
        self._closed = False

    def start(self) -> None:
        self._started = True

    def close(self) -> None:
        if self._closed:
            return
        with self._lock:
            job_ids = list(self._jobs)
        for job_id in job_ids:
            self.unregister_job(job_id)
        self._closed = True
        with self._lock:
            controls, self._controls = list(self._controls.values()), {}
            endpoints = sorted(self._endpoints)
        for control in controls:
            control.close()
        # Executor hosts exit now rather than with their executors; other data ports refuse.
        for host, port in endpoints:
            try:
                with contextlib.closing(self._connect(host, port, _SHUTDOWN_TIMEOUT)) as control:
                    control.shutdown()
            except ShuffleError as error:
                _LOG.debug("data port %s:%d not shut down: %s", host, port, error)

    def _connect(self, host: str, port: int, timeout: float) -> ControlConnection:
        return ControlConnection(
            host,
            port,
            self._secret,
            timeout=timeout,
            max_frame_size=self._max_frame_size,
            tls=self._tls,
        )

    def _check_open(self) -> None:
        if self._closed:
            raise ShuffleServiceClosedError("netty_like shuffle master is closed")

    def register_job(self, context: JobShuffleContext) -> None:
        self._check_open()
        with self._lock:
            if context.job_id in self._jobs:
                raise ShuffleError(f"job {context.job_id!r} is already registered")
            self._jobs[context.job_id] = _Job(context)

    def unregister_job(self, job_id: str) -> None:
        with self._lock:
            job = self._jobs.pop(job_id, None)
        if job is None:
            return
        self._release(
            descriptor
            for partition_descriptor, descriptor in job.partitions.values()
            if not partition_descriptor.partition_type.is_persistent
            and not descriptor.on_shared_store
        )
        for result_id in sorted(job.shared_results):
            # The whole result, released partitions or not: attempts whose producers died
            # while writing are there too, and no process of theirs is left to delete them.
            for directory in result_directories(self._store, result_id):
                try:
                    self._store.delete_tree(directory)
                except ShuffleError as error:
                    _LOG.warning("%s not deleted: %s", directory, error)

    def _job(self, job_id: str) -> _Job:
        with self._lock:
            job = self._jobs.get(job_id)
        if job is None:
            raise ShuffleError(f"job {job_id!r} is not registered with the shuffle master")
        return job

    def register_partition_with_producer(
        self,
        job_id: str,
        partition_descriptor: PartitionDescriptor,
        producer_descriptor: ProducerDescriptor,
    ) -> Future[ShuffleDescriptor]:
        self._check_open()
        job = self._job(job_id)
        partition = ResultPartitionID(
            partition_descriptor.partition_id, producer_descriptor.producer_execution_id
        )
        descriptor = NettyShuffleDescriptor.of_producer(
            partition,
            producer_descriptor,
            connection_index=partition_descriptor.connection_index,
            store_url=self._store.url,
            on_shared_store=self._store.is_shared
            and not partition_descriptor.partition_type.must_be_pipelined,
        )
        with self._lock:
            job.partitions[partition] = (partition_descriptor, descriptor)
            if descriptor.on_shared_store and not partition_descriptor.partition_type.is_persistent:
                job.shared_results.add(partition.partition_id.result_id)
            if descriptor.data_port != LOCAL_ONLY_PORT:
                self._endpoints.add((descriptor.host, descriptor.data_port))
        return completed(descriptor)

    def release_partition_externally(self, shuffle_descriptor: ShuffleDescriptor) -> None:
        self.release_partitions_externally([shuffle_descriptor])

    def release_partitions_externally(
        self, shuffle_descriptors: Sequence[ShuffleDescriptor]
    ) -> None:
        with self._lock:
            for job in self._jobs.values():
                for descriptor in shuffle_descriptors:
                    job.partitions.pop(descriptor.result_partition_id, None)
        self._release(d for d in shuffle_descriptors if isinstance(d, NettyShuffleDescriptor))

    def _release(self, descriptors: Iterable[NettyShuffleDescriptor]) -> None:
        """Released where the files are: by the data port that serves them (one that does not
        answer took them with it), else on the store."""
        for endpoint, group in _by_endpoint(descriptors).items():
            if endpoint is None:
                for descriptor in group:
                    self._delete_from_store(descriptor)
                continue
            partitions = [descriptor.result_partition_id for descriptor in group]
            try:
                self._ask(endpoint, methodcaller("release", partitions))
            except ShuffleError as error:
                _LOG.info("%d partitions not released on %s:%d: %s", len(group), *endpoint, error)

    def _delete_from_store(self, descriptor: NettyShuffleDescriptor) -> None:
        store = (
            self._store if descriptor.store_url == self._store.url else Store(descriptor.store_url)
        )
        # <result>/<index>/ too when this was their last attempt: nothing stays on the store.
        store.delete_tree(
            partition_directory(store, descriptor.result_partition_id), empty_parents=2
        )

    def _ask(self, endpoint: _Endpoint, request: Callable[[ControlConnection], T]) -> T:
        """``request`` on a connection to ``endpoint``; a kept connection that fails (the peer
        closed it while idle) is replaced once."""
        for attempt in range(2):
            with self._lock:
                control = self._controls.pop(endpoint, None)
            if control is None:
                control = self._connect(*endpoint, self._timeout)
            try:
                answer = request(control)
            except ShuffleError:
                control.close()
                if attempt == 1:
                    raise
                continue
            with self._lock:
                if self._closed:
                    control.close()
                else:
                    self._controls[endpoint] = control
            return answer
        raise AssertionError("unreachable")

    def partitions_with_metrics(
        self, job_id: str, *, statistics: bool = True
    ) -> Future[list[PartitionWithMetrics]]:
        """Blocking partitions, available or not, with their statistics (if asked for) as
        their data ports report them; ones no longer held (or whose data port is gone) are
        reported lost to the job's context."""
        job = self._job(job_id)
        with self._lock:
            tracked = [
                (partition_descriptor, descriptor)
                for partition_descriptor, descriptor in job.partitions.values()
                if partition_descriptor.partition_type.is_reconsumable
            ]
        subpartitions = max((p.number_of_subpartitions for p, _ in tracked), default=1)
        found: dict[ResultPartitionID, _Found] = {}
        for endpoint, group in _by_endpoint(descriptor for _, descriptor in tracked).items():
            partitions = [descriptor.result_partition_id for descriptor in group]
            answers = self._look_up(endpoint, partitions, statistics, subpartitions)
            found.update(zip(partitions, answers, strict=True))
        result: list[PartitionWithMetrics] = []
        lost: list[ResultPartitionID] = []
        for _, descriptor in tracked:
            available, partition_statistics = found[descriptor.result_partition_id]
            if not available:
                lost.append(descriptor.result_partition_id)
            result.append(PartitionWithMetrics(descriptor, available, partition_statistics))
        if lost:
            with self._lock:
                for partition in lost:
                    job.partitions.pop(partition, None)
            job.context.stop_tracking_and_release_partitions(lost)
        return completed(result)

    def _look_up(
        self,
        endpoint: _Endpoint | None,
        partitions: list[ResultPartitionID],
        statistics: bool,
        subpartitions: int,
    ) -> list[_Found]:
        """Whether each partition is held where ``endpoint`` serves it (``None``: on this
        process's store), with its statistics if asked for."""
        if endpoint is None:
            if not statistics:
                return [(is_committed(self._store, p), None) for p in partitions]
            return [_found(self._on_store(partition)) for partition in partitions]
        try:
            if not statistics:
                held = self._ask(endpoint, methodcaller("held", partitions))
                return [(is_held, None) for is_held in held]
            answers = self._ask(endpoint, methodcaller("statuses", partitions, subpartitions))
            return [_found(answer) for answer in answers]
        except ShuffleError as error:
            _LOG.warning(
                "data port %s:%d does not answer (%s): its %d partitions are lost",
                *endpoint,
                error,
                len(partitions),
            )
            return [(False, None)] * len(partitions)

    def _on_store(self, partition: ResultPartitionID) -> PartitionStatistics | None:
        try:
            return PartitionFileReader(self._store, partition).manifest.statistics
        except (PartitionNotFoundError, PartitionCorruptedError):
            return None


_Found = tuple[bool, PartitionStatistics | None]
"""Whether a partition is available, and its statistics (when asked for and available)."""


def _found(statistics: PartitionStatistics | None) -> _Found:
    return statistics is not None, statistics


def _by_endpoint(
    descriptors: Iterable[NettyShuffleDescriptor],
) -> dict[_Endpoint | None, list[NettyShuffleDescriptor]]:
    """Descriptors by the data port that serves them (``None``: none does, or they live on a
    shared store, which this process sees)."""
    grouped: dict[_Endpoint | None, list[NettyShuffleDescriptor]] = defaultdict(list)
    for descriptor in descriptors:
        served = descriptor.data_port != LOCAL_ONLY_PORT and not descriptor.on_shared_store
        grouped[(descriptor.host, descriptor.data_port) if served else None].append(descriptor)
    return grouped
