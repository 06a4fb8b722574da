"""The coordinator role: which workers live, which applications and jobs exist, where each
partition is placed, and what was lost.

State lives in memory. Workers re-register with what they hold after either side restarts;
partitions nobody tracks are then deleted. A reaper declares silent workers dead (their
partitions are reported lost to their jobs on the next application heartbeat), expires silent
applications, and deletes partitions producers placed but no job ever claimed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from external_shuffle._proto import external_shuffle_pb2 as pb
from external_shuffle._proto import external_shuffle_pb2_grpc as pb_grpc
from external_shuffle.channels import ChannelPool
from external_shuffle.metrics import DaemonMetrics
from external_shuffle.statuses import NotRegisteredError, UnavailableError, reports_errors
from external_shuffle.wire import (
    WorkerAddress,
    key_of,
    partition_of,
)
from scheduling.placement import (
    NoPlacementTargetError,
    PlacementRequest,
    PlacementStrategy,
    PlacementTarget,
)
from shuffle_api import ResultPartitionID
from shuffle_api.ids import validate_id

__all__ = ["CoordinatorService"]

# A channel that found a worker down fails calls at once until it reconnects (gRPC's backoff,
# at most a second with channel_options): a worker back up is waited for this long before
# its partitions read as lost.
_RECONNECT_WAIT = 3.0

logger = logging.getLogger(__name__)


@dataclass
class _Worker:
    address: WorkerAddress
    load: pb.WorkerLoad
    last_seen: float
    alive: bool = True
    pending_release: set[ResultPartitionID] = field(default_factory=set)


@dataclass
class _Partition:
    partition: ResultPartitionID
    replicas: tuple[str, ...]  # worker ids, first replica first
    placed_at: float
    application_id: str = ""
    job_id: str = ""
    persistent: bool = False


@dataclass
class _Application:
    last_seen: float
    jobs: set[str] = field(default_factory=set)
    lost: list[tuple[str, ResultPartitionID]] = field(default_factory=list)


class CoordinatorService(pb_grpc.CoordinatorServicer):
    def __init__(
        self,
        *,
        placement: PlacementStrategy,
        worker_timeout: float,
        application_timeout: float,
        peers: ChannelPool,
        metrics: DaemonMetrics,
    ) -> None:
        self._placement = placement
        self._worker_timeout = worker_timeout
        self._application_timeout = application_timeout
        self._peers = peers
        self.metrics = metrics
        self._workers: dict[str, _Worker] = {}
        self._partitions: dict[ResultPartitionID, _Partition] = {}
        # Partitions per worker, kept as they are placed and dropped: placement reads it.
        self._tracked_per_worker: dict[str, int] = defaultdict(int)
        self._applications: dict[str, _Application] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap_loop, name="coordinator-reaper")

    def start(self) -> None:
        self._reaper.start()

    def stop(self) -> None:
        self._stop.set()
        if self._reaper.is_alive():
            self._reaper.join()

    # --- bookkeeping -------------------------------------------------------------------------

    def _update_gauges(self) -> None:
        self.metrics.partitions.labels(role="coordinator").set(len(self._partitions))
        self.metrics.applications.set(len(self._applications))
        self.metrics.workers_alive.set(sum(w.alive for w in self._workers.values()))

    def _reap_loop(self) -> None:
        period = min(self._worker_timeout, self._application_timeout, 4.0) / 4
        while not self._stop.wait(period):
            self.reap(time.monotonic())

    def reap(self, now: float) -> None:
        """Declare silent workers dead, expire silent applications and unclaimed partitions."""
        with self._lock:
            dead = [
                worker_id
                for worker_id, worker in self._workers.items()
                if worker.alive and now - worker.last_seen > self._worker_timeout
            ]
            expired = [
                application_id
                for application_id, application in self._applications.items()
                if now - application.last_seen > self._application_timeout
            ]
        for worker_id in dead:
            self._declare_dead(worker_id, "no heartbeat")
        for application_id in expired:
            logger.info("application expired", extra={"application_id": application_id})
            self._release_application(application_id)
        with self._lock:
            unclaimed = [
                entry
                for entry in self._partitions.values()
                if not entry.application_id and now - entry.placed_at > self._application_timeout
            ]
        if unclaimed:
            logger.info("deleting %d partitions no job claimed", len(unclaimed))
            self._release(unclaimed)

    def _declare_dead(self, worker_id: str, reason: str) -> None:
        """The worker is gone: partitions with no other live replica are lost."""
        lost: list[_Partition] = []
        with self._lock:
            worker = self._workers.get(worker_id)
            if worker is None or not worker.alive:
                return
            worker.alive = False
            for entry in list(self._partitions.values()):
                if worker_id in entry.replicas and not any(
                    self._is_alive(replica) for replica in entry.replicas
                ):
                    lost.append(entry)
                    self._untrack(entry)
                    application = self._applications.get(entry.application_id)
                    if application is not None:
                        application.lost.append((entry.job_id, entry.partition))
            self._update_gauges()
        logger.warning(
            "worker declared dead: %s; %d partitions lost",
            reason,
            len(lost),
            extra={"worker_id": worker_id},
        )

    def _untrack(self, entry: _Partition) -> None:
        del self._partitions[entry.partition]
        for worker_id in entry.replicas:
            self._tracked_per_worker[worker_id] -= 1

    def _is_alive(self, worker_id: str) -> bool:
        worker = self._workers.get(worker_id)
        return worker is not None and worker.alive

    def _release(self, entries: list[_Partition]) -> int:
        """Forget the partitions and delete them on their live workers (workers that do not
        answer get them with their next heartbeat)."""
        by_worker: dict[str, list[ResultPartitionID]] = defaultdict(list)
        with self._lock:
            for entry in entries:
                if self._partitions.get(entry.partition) is not entry:
                    continue
                self._untrack(entry)
                for worker_id in entry.replicas:
                    by_worker[worker_id].append(entry.partition)
            self._update_gauges()
            targets = {
                worker_id: self._workers[worker_id].address
                for worker_id in by_worker
                if self._is_alive(worker_id)
            }
        for worker_id, address in targets.items():
            partitions = by_worker[worker_id]
            try:
                pb_grpc.WorkerStub(self._peers.get(address.target)).ReleasePartitions(
                    pb.WorkerReleasePartitionsRequest(partitions=[key_of(p) for p in partitions]),
                    timeout=self._peers.settings.timeout,
                )
            except grpc.RpcError as error:
                logger.warning("release on %s deferred: %s", worker_id, error)
                with self._lock:
                    self._workers[worker_id].pending_release.update(partitions)
        return sum(len(partitions) for partitions in by_worker.values())

    def _release_application(self, application_id: str) -> int:
        with self._lock:
            self._applications.pop(application_id, None)
            entries = [e for e in self._partitions.values() if e.application_id == application_id]
        return self._release(entries)

    def _application(self, application_id: str) -> _Application:
        application = self._applications.get(application_id)
        if application is None:
            raise NotRegisteredError(
                f"application {application_id!r} is not registered (or expired after"
                f" {self._application_timeout} s without heartbeats)"
            )
        return application

    def _mean_partition_bytes(self) -> int:
        """The cluster's mean committed partition size as the workers last reported it."""
        reported_bytes = sum(w.load.stored_bytes for w in self._workers.values())
        reported_partitions = sum(w.load.partitions for w in self._workers.values())
        return reported_bytes // reported_partitions if reported_partitions else 0

    def _placement_targets(self, mean: int) -> list[PlacementTarget]:
        """Live workers that take partitions, with their load: committed bytes as last
        reported, plus partitions placed since, each counted at the cluster's mean size."""
        tracked = self._tracked_per_worker
        return [
            PlacementTarget(
                worker_id,
                worker.address.host,
                load=worker.load.stored_bytes
                + max(0, tracked[worker_id] - worker.load.partitions) * mean,
                count=tracked[worker_id],
            )
            for worker_id, worker in self._workers.items()
            if worker.alive and not worker.load.decommissioning
        ]

    # --- gRPC ---------------------------------------------------------------------------------

    @reports_errors
    def RegisterWorker(  # noqa: N802 (gRPC's method names)
        self, request: pb.RegisterWorkerRequest, context: grpc.ServicerContext
    ) -> pb.RegisterWorkerResponse:
        address = WorkerAddress.from_pb(request.worker)
        held = [partition_of(key) for key in request.committed]
        with self._lock:
            self._workers[address.worker_id] = _Worker(address, request.load, time.monotonic())
            obsolete = [
                partition
                for partition in held
                if address.worker_id not in getattr(self._partitions.get(partition), "replicas", ())
            ]
            self._update_gauges()
        logger.info(
            "worker registered",
            extra={"worker_id": address.worker_id, "target": address.target},
        )
        return pb.RegisterWorkerResponse(obsolete=[key_of(p) for p in obsolete])

    def WorkerHeartbeat(  # noqa: N802
        self, request: pb.WorkerHeartbeatRequest, context: grpc.ServicerContext
    ) -> pb.WorkerHeartbeatResponse:
        with self._lock:
            worker = self._workers.get(request.worker_id)
            if worker is None or not worker.alive:
                return pb.WorkerHeartbeatResponse(known=False)
            worker.load = request.load
            worker.last_seen = time.monotonic()
            release, worker.pending_release = worker.pending_release, set()
        return pb.WorkerHeartbeatResponse(known=True, release=[key_of(p) for p in release])

    def ListWorkers(  # noqa: N802
        self, request: pb.ListWorkersRequest, context: grpc.ServicerContext
    ) -> pb.ListWorkersResponse:
        now = time.monotonic()
        with self._lock:
            return pb.ListWorkersResponse(
                workers=[
                    pb.ListWorkersResponse.Entry(
                        worker=worker.address.to_pb(),
                        load=worker.load,
                        alive=worker.alive,
                        seconds_since_heartbeat=now - worker.last_seen,
                    )
                    for worker in self._workers.values()
                ]
            )

    def ReportUnreachableWorker(  # noqa: N802
        self, request: pb.ReportUnreachableWorkerRequest, context: grpc.ServicerContext
    ) -> pb.ReportUnreachableWorkerResponse:
        """Check the worker at once (a client saw it fail); dead if it does not answer."""
        with self._lock:
            worker = self._workers.get(request.worker_id)
            address = None if worker is None or not worker.alive else worker.address
        if address is None:
            return pb.ReportUnreachableWorkerResponse(declared_dead=worker is not None)
        try:
            answer = health_pb2_grpc.HealthStub(self._peers.get(address.target)).Check(
                health_pb2.HealthCheckRequest(), timeout=min(2.0, self._worker_timeout)
            )
            serving = answer.status == health_pb2.HealthCheckResponse.SERVING
        except grpc.RpcError:
            serving = False
        if serving:
            return pb.ReportUnreachableWorkerResponse(declared_dead=False)
        self._declare_dead(request.worker_id, f"unreachable for a client: {request.error}")
        return pb.ReportUnreachableWorkerResponse(declared_dead=True)

    @reports_errors
    def RegisterApplication(  # noqa: N802
        self, request: pb.RegisterApplicationRequest, context: grpc.ServicerContext
    ) -> pb.RegisterApplicationResponse:
        validate_id(request.application_id, "application id")
        with self._lock:
            application = self._applications.setdefault(
                request.application_id, _Application(time.monotonic())
            )
            application.last_seen = time.monotonic()
            self._update_gauges()
        return pb.RegisterApplicationResponse(heartbeat_timeout_seconds=self._application_timeout)

    def ApplicationHeartbeat(  # noqa: N802
        self, request: pb.ApplicationHeartbeatRequest, context: grpc.ServicerContext
    ) -> pb.ApplicationHeartbeatResponse:
        with self._lock:
            application = self._applications.get(request.application_id)
            if application is None:
                return pb.ApplicationHeartbeatResponse(known=False)
            application.last_seen = time.monotonic()
            lost, application.lost = application.lost, []
        return pb.ApplicationHeartbeatResponse(
            known=True,
            lost=[pb.LostPartition(job_id=job, partition=key_of(p)) for job, p in lost],
        )

    def UnregisterApplication(  # noqa: N802
        self, request: pb.UnregisterApplicationRequest, context: grpc.ServicerContext
    ) -> pb.UnregisterApplicationResponse:
        released = self._release_application(request.application_id)
        return pb.UnregisterApplicationResponse(released_partitions=released)

    @reports_errors
    def RegisterJob(  # noqa: N802
        self, request: pb.RegisterJobRequest, context: grpc.ServicerContext
    ) -> pb.RegisterJobResponse:
        validate_id(request.job_id, "job id")
        with self._lock:
            self._application(request.application_id).jobs.add(request.job_id)
        return pb.RegisterJobResponse()

    def UnregisterJob(  # noqa: N802
        self, request: pb.UnregisterJobRequest, context: grpc.ServicerContext
    ) -> pb.UnregisterJobResponse:
        with self._lock:
            application = self._applications.get(request.application_id)
            if application is not None:
                application.jobs.discard(request.job_id)
            entries = [
                entry
                for entry in self._partitions.values()
                if entry.application_id == request.application_id
                and entry.job_id == request.job_id
                and not (request.keep_persistent and entry.persistent)
            ]
        return pb.UnregisterJobResponse(released_partitions=self._release(entries))

    @reports_errors
    def RegisterPartition(  # noqa: N802
        self, request: pb.RegisterPartitionRequest, context: grpc.ServicerContext
    ) -> pb.RegisterPartitionResponse:
        partition = partition_of(request.partition)
        with self._lock:
            if request.application_id:
                application = self._application(request.application_id)
                if request.job_id not in application.jobs:
                    raise NotRegisteredError(
                        f"job {request.job_id!r} is not registered with application"
                        f" {request.application_id!r}"
                    )
            entry = self._partitions.get(partition)
            if entry is None:
                entry = self._place(partition, request)
            if request.application_id and not entry.application_id:
                entry.application_id = request.application_id
                entry.job_id = request.job_id
                entry.persistent = request.persistent
            elif request.application_id and entry.application_id != request.application_id:
                raise NotRegisteredError(f"partition {partition} belongs to another application")
            location = self._location(entry)
        return pb.RegisterPartitionResponse(location=location)

    def _place(
        self, partition: ResultPartitionID, request: pb.RegisterPartitionRequest
    ) -> _Partition:
        mean = self._mean_partition_bytes()
        # A batch of one: the partition's size is unknown until it is written, so it weighs
        # the mean, as the partitions placed since the last heartbeat do in the targets' loads.
        key = str(partition)
        try:
            placed = self._placement.place(
                [
                    PlacementRequest(
                        key, request.producer_host, weight=mean, replicas=max(1, request.replicas)
                    )
                ],
                self._placement_targets(mean),
            )
        except NoPlacementTargetError:
            raise UnavailableError(
                "no live worker takes partitions: start a worker (pyshuffle daemon)"
            ) from None
        entry = _Partition(partition, placed[key], time.monotonic())
        self._partitions[partition] = entry
        for worker_id in entry.replicas:
            self._tracked_per_worker[worker_id] += 1
        self._update_gauges()
        return entry

    def _location(self, entry: _Partition) -> pb.PartitionLocation:
        return pb.PartitionLocation(
            partition=key_of(entry.partition),
            replicas=[self._workers[worker_id].address.to_pb() for worker_id in entry.replicas],
        )

    @reports_errors
    def ReleasePartitions(  # noqa: N802
        self, request: pb.ReleasePartitionsRequest, context: grpc.ServicerContext
    ) -> pb.ReleasePartitionsResponse:
        wanted = {partition_of(key) for key in request.partitions}
        with self._lock:
            entries = [
                entry
                for partition in wanted
                if (entry := self._partitions.get(partition)) is not None
                # An application releases its own partitions and unclaimed ones only.
                and entry.application_id in ("", request.application_id)
            ]
        return pb.ReleasePartitionsResponse(released=self._release(entries))

    @reports_errors
    def GetPartitionStatus(  # noqa: N802
        self, request: pb.GetPartitionStatusRequest, context: grpc.ServicerContext
    ) -> pb.GetPartitionStatusResponse:
        with self._lock:
            self._application(request.application_id)
            entries = [
                entry
                for entry in self._partitions.values()
                if entry.application_id == request.application_id and entry.job_id == request.job_id
            ]
            locations = {entry.partition: self._location(entry) for entry in entries}
            live = {
                worker_id: worker.address
                for worker_id, worker in self._workers.items()
                if worker.alive
            }
        statistics = self._committed_statistics(entries, live)
        return pb.GetPartitionStatusResponse(
            partitions=[
                pb.PartitionStatus(
                    location=locations[entry.partition],
                    available=entry.partition in statistics,
                    statistics=statistics.get(entry.partition),
                )
                for entry in entries
            ]
        )

    def _worker_status(
        self, worker: WorkerAddress, request: pb.WorkerPartitionStatusRequest
    ) -> pb.WorkerPartitionStatusResponse:
        """The worker's answer; an UNAVAILABLE one is asked again, waiting (briefly) for the
        channel to reconnect: the worker may be back while the channel still backs off."""
        stub = pb_grpc.WorkerStub(self._peers.get(worker.target))
        timeout = self._peers.settings.timeout
        answer: pb.WorkerPartitionStatusResponse
        try:
            answer = stub.GetPartitionStatus(request, timeout=timeout)
        except grpc.RpcError as error:
            if not isinstance(error, grpc.Call) or error.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            answer = stub.GetPartitionStatus(
                request, timeout=min(timeout, _RECONNECT_WAIT), wait_for_ready=True
            )
        return answer

    def _committed_statistics(
        self, entries: list[_Partition], live: dict[str, WorkerAddress]
    ) -> dict[ResultPartitionID, pb.PartitionStatistics]:
        """Ask each live worker which of these partitions it has committed."""
        by_worker: dict[str, list[ResultPartitionID]] = defaultdict(list)
        for entry in entries:
            for worker_id in entry.replicas:
                if worker_id in live:
                    by_worker[worker_id].append(entry.partition)
        found: dict[ResultPartitionID, pb.PartitionStatistics] = {}
        for worker_id, partitions in by_worker.items():
            request = pb.WorkerPartitionStatusRequest(partitions=[key_of(p) for p in partitions])
            try:
                answer = self._worker_status(live[worker_id], request)
            except grpc.RpcError as error:
                logger.warning("status of %s unknown: %s", worker_id, error)
                continue
            for item in answer.partitions:
                if item.committed:
                    found.setdefault(partition_of(item.partition), item.statistics)
        return found
