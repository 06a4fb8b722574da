"""The coordinator role's gRPC service: a thin layer over :class:`CoordinatorState` that makes
the calls to workers the state decides (deletions, status checks), and a reaper thread."""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from external_shuffle.daemon.coordinator.state import CoordinatorState, PartitionPlacement, Releases
from external_shuffle.daemon.coordinator.tier_stores import TierStores
from external_shuffle.daemon.error_statuses import reports_errors
from external_shuffle.ops.cluster_view import ApplicationRow, ClusterView, WorkerRow
from external_shuffle.ops.metrics import DaemonMetrics
from external_shuffle.wire.channels import ChannelPool, translate_rpc_error
from external_shuffle.wire.credentials import (
    CLUSTER_CREDENTIAL,
    Credential,
    CredentialCheck,
    Role,
    is_clients_application,
)
from external_shuffle.wire.messages import (
    MAX_REGISTRATIONS_A_CALL,
    Commit,
    WorkerAddress,
    identity_from_pb,
    identity_to_pb,
    key_of,
    partition_of,
    statistics_to_pb,
)
from external_shuffle.wire.stubs import pb, pb_grpc
from scheduling.placement import PlacementStrategy
from shuffle_api import (
    ApplicationIdentity,
    DataTooLargeError,
    InvalidOperationError,
    PermissionDeniedError,
    ResultPartitionID,
)

__all__ = ["CoordinatorService"]

# A channel that found a worker down fails calls at once until it reconnects (gRPC's backoff,
# at most a second with channel_options): a worker back up is waited for this long before
# its partitions read as lost.
_RECONNECT_WAIT = 3.0

logger = logging.getLogger(__name__)


def _location(placement: PartitionPlacement) -> pb.PartitionLocation:
    return pb.PartitionLocation(
        partition=key_of(placement.partition),
        replicas=[address.to_pb() for address in placement.replicas],
    )


class CoordinatorService(pb_grpc.CoordinatorServicer):
    def __init__(
        self,
        *,
        placement: PlacementStrategy,
        worker_timeout: float,
        application_timeout: float,
        peers: ChannelPool,
        metrics: DaemonMetrics,
        coordinators: tuple[str, ...] = (),
        credentials: CredentialCheck | None = None,
        application_credential_lifetime: float = 7 * 86_400.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``coordinators``: the addresses of all coordinators (this one may be among them),
        asked before an application expires here. ``credentials``: tells who calls, and issues
        applications' credentials (None: every caller holds the cluster's secret, and none is
        issued)."""
        self._credentials = credentials
        self._credential_lifetime = application_credential_lifetime
        self.state = CoordinatorState(
            placement=placement,
            worker_timeout=worker_timeout,
            application_timeout=application_timeout,
            clock=clock,
        )
        self._peers = peers
        self._tiers = TierStores()
        self._coordinators = coordinators if len(coordinators) > 1 else ()
        self.metrics = metrics
        metrics.partitions.labels(role="coordinator").set_function(self.state.partition_count)
        metrics.applications.set_function(self.state.application_count)
        metrics.workers_alive.set_function(self.state.alive_worker_count)
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap_loop, name="coordinator-reaper")

    def start(self) -> None:
        self._reaper.start()

    def stop(self) -> None:
        self._stop.set()
        if self._reaper.is_alive():
            self._reaper.join()

    def _reap_loop(self) -> None:
        period = min(self.state.worker_timeout, self.state.application_timeout, 4.0) / 4
        while not self._stop.wait(period):
            silent = self.state.silent_applications()
            if silent and self._coordinators:
                self.state.heard_elsewhere(self._heard_by_others(set(silent)))
            self._delete(self.state.reap())

    def _heard_by_others(self, applications: set[str]) -> dict[str, float]:
        """Seconds since each of ``applications`` was last heard by any coordinator that
        answers (a coordinator down says nothing)."""
        heard: dict[str, float] = {}
        for address in self._coordinators:
            try:
                answer = pb_grpc.CoordinatorStub(self._peers.get(address)).ListApplications(
                    pb.ListApplicationsRequest(), timeout=min(2.0, self._peers.settings.timeout)
                )
            except grpc.RpcError as error:
                logger.info("coordinator %s not asked about applications: %s", address, error)
                continue
            for entry in answer.applications:
                if entry.application_id in applications:
                    seconds = entry.seconds_since_heartbeat
                    heard[entry.application_id] = min(
                        heard.get(entry.application_id, seconds), seconds
                    )
        return heard

    def _delete(self, releases: Releases) -> int:
        """Tell each worker what to delete (one that does not answer is told with its next
        heartbeat); then delete what is on a tier store with no live worker to do it. The
        workers delete at once, each its own share."""
        calls = [
            (
                address,
                partitions,
                pb_grpc.WorkerStub(self._peers.get(address.target)).ReleasePartitions.future(
                    pb.WorkerReleasePartitionsRequest(partitions=[key_of(p) for p in partitions]),
                    timeout=self._peers.settings.timeout,
                ),
            )
            for address, partitions in releases.per_worker.items()
        ]
        for address, partitions, call in calls:
            try:
                call.result()
            except grpc.RpcError as error:
                logger.warning("release on %s deferred: %s", address.worker_id, error)
                self.state.defer_release(address.worker_id, partitions)
        for url, moved in releases.on_tier.items():
            self._tiers.delete(url, moved)
        return releases.count

    # --- workers ------------------------------------------------------------------------------

    @reports_errors
    def RegisterWorker(  # noqa: N802 (gRPC's method names)
        self, request: pb.RegisterWorkerRequest, context: grpc.ServicerContext
    ) -> pb.RegisterWorkerResponse:
        obsolete = self.state.register_worker(
            WorkerAddress.from_pb(request.worker),
            request.load,
            [partition_of(key) for key in request.committed],
            [partition_of(key) for key in request.on_tier],
            list(request.committed_for),
        )
        return pb.RegisterWorkerResponse(obsolete=[key_of(p) for p in obsolete])

    @reports_errors
    def WorkerHeartbeat(  # noqa: N802
        self, request: pb.WorkerHeartbeatRequest, context: grpc.ServicerContext
    ) -> pb.WorkerHeartbeatResponse:
        release = self.state.worker_heartbeat(
            request.worker_id, request.load, [Commit.from_pb(c) for c in request.committed]
        )
        if release is None:
            return pb.WorkerHeartbeatResponse(known=False)
        ended, heard = self.state.ended_after(request.ended_heard)
        return pb.WorkerHeartbeatResponse(
            known=True,
            release=[key_of(p) for p in release],
            ended_applications=ended,
            ended_heard=heard,
        )

    @reports_errors
    def ListWorkers(  # noqa: N802
        self, request: pb.ListWorkersRequest, context: grpc.ServicerContext
    ) -> pb.ListWorkersResponse:
        return pb.ListWorkersResponse(
            workers=[
                pb.ListWorkersResponse.Entry(
                    worker=view.address.to_pb(),
                    load=view.load,
                    alive=view.alive,
                    seconds_since_heartbeat=view.seconds_since_heartbeat,
                )
                for view in self.state.workers()
            ]
        )

    @reports_errors
    def ReportUnreachableWorker(  # noqa: N802
        self, request: pb.ReportUnreachableWorkerRequest, context: grpc.ServicerContext
    ) -> pb.ReportUnreachableWorkerResponse:
        """Check the worker at once (a client saw it fail); dead if it does not answer (or,
        told by a holder of the cluster's secret, answers that it does not serve: an
        application may not have a draining worker declared dead)."""
        trusted = self._caller(context).role is Role.CLUSTER
        address = self.state.live_address(request.worker_id)
        if address is None:
            return pb.ReportUnreachableWorkerResponse(
                declared_dead=self.state.is_known(request.worker_id)
            )
        try:
            answer = health_pb2_grpc.HealthStub(self._peers.get(address.target)).Check(
                health_pb2.HealthCheckRequest(), timeout=min(2.0, self.state.worker_timeout)
            )
            serving = answer.status == health_pb2.HealthCheckResponse.SERVING or not trusted
        except grpc.RpcError:
            serving = False
        if serving:
            return pb.ReportUnreachableWorkerResponse(declared_dead=False)
        self.state.declare_dead(
            request.worker_id, f"unreachable for a client: {request.error[:200]}"
        )
        return pb.ReportUnreachableWorkerResponse(declared_dead=True)

    @reports_errors
    def DecommissionWorker(  # noqa: N802
        self, request: pb.DecommissionWorkerRequest, context: grpc.ServicerContext
    ) -> pb.DecommissionResponse:
        """An operator's decommission (or its cancel), passed on to the worker with this
        daemon's credential; logged with who asked."""
        caller = self._caller(context)
        address = self.state.live_address(request.worker_id)
        if address is None:
            raise InvalidOperationError(f"no live worker {request.worker_id!r} is known here")
        doing = "cancelling the decommission of" if request.cancel else "decommissioning"
        try:
            answer: pb.DecommissionResponse = pb_grpc.WorkerStub(
                self._peers.get(address.target)
            ).Decommission(
                pb.DecommissionRequest(cancel=request.cancel),
                timeout=self._peers.settings.timeout,
            )
        except grpc.RpcError as error:
            raise translate_rpc_error(error, f"{doing} {address.target}") from error
        self.state.heard_decommission(request.worker_id, decommissioning=not request.cancel)
        logger.info(
            "%s a worker, asked by %s",
            doing,
            caller,
            extra={"worker_id": request.worker_id, "target": address.target},
        )
        return answer

    # --- applications and jobs ----------------------------------------------------------------

    def _caller(self, context: grpc.ServicerContext) -> Credential:
        """Who calls; AuthenticationError for the credential of an application that ended."""
        if self._credentials is None:
            return CLUSTER_CREDENTIAL
        caller = self._credentials.credential_of_call(context.invocation_metadata())
        self.state.ended.check(caller)
        return caller

    def _check_acts_for(self, context: grpc.ServicerContext, application_id: str) -> Credential:
        """The caller, if it may act for ``application_id`` (PermissionDeniedError if not)."""
        caller = self._caller(context)
        caller.check_application(application_id, "act for")
        return caller

    def _check_owns(
        self,
        caller: Credential,
        partitions: list[ResultPartitionID],
        action: str,
    ) -> None:
        """PermissionDeniedError unless ``caller`` may ``action`` each of ``partitions`` that
        is tracked here (one no application claimed is no application credential's)."""
        for partition, owner in self.state.owners(partitions).items():
            caller.check_partition(owner, action, partition)

    @reports_errors
    def RegisterApplication(  # noqa: N802
        self, request: pb.RegisterApplicationRequest, context: grpc.ServicerContext
    ) -> pb.RegisterApplicationResponse:
        caller = self._caller(context)
        if caller.role is Role.CLIENT:
            # A client's applications are named after it: no other client's id is its to take,
            # not even after this coordinator restarted and forgot who registered what.
            if not is_clients_application(caller.name, request.application_id):
                raise PermissionDeniedError(
                    f"client {caller.name!r} registers applications named"
                    f" '{caller.name}.app-<32 hex digits>', not {request.application_id!r}"
                )
        else:
            caller.check_application(request.application_id, "register")
        self.state.register_application(
            request.application_id,
            identity_from_pb(request.identity),
            client=caller.name if caller.role is Role.CLIENT else "",
        )
        return pb.RegisterApplicationResponse(
            heartbeat_timeout_seconds=self.state.application_timeout,
            credential=(
                ""
                if self._credentials is None
                else self._credentials.application_token(
                    request.application_id, self._credential_lifetime
                )
            ),
        )

    def view(self) -> ClusterView:
        """The cluster as this coordinator sees it (its status page)."""
        return ClusterView(
            tuple(
                WorkerRow.of(view.address, view.load, view.alive, view.seconds_since_heartbeat)
                for view in self.state.workers()
            ),
            self._applications(),
        )

    def _applications(self) -> tuple[ApplicationRow, ...]:
        partitions = self.state.partitions_per_application()
        held = self.state.bytes_per_application()
        return tuple(
            ApplicationRow.of(name, age, partitions.get(name, 0), identity, held.get(name, 0))
            for name, age, identity in self.state.applications()
        )

    @reports_errors
    def ListApplications(  # noqa: N802
        self, request: pb.ListApplicationsRequest, context: grpc.ServicerContext
    ) -> pb.ListApplicationsResponse:
        return pb.ListApplicationsResponse(
            applications=[
                pb.ListApplicationsResponse.Entry(
                    application_id=row.application_id,
                    seconds_since_heartbeat=row.seconds_since_heartbeat,
                    partitions=row.partitions,
                    identity=identity_to_pb(ApplicationIdentity(row.engine_id, row.name, row.user)),
                    stored_bytes=row.stored_bytes,
                )
                for row in self._applications()
            ]
        )

    @reports_errors
    def ApplicationHeartbeat(  # noqa: N802
        self, request: pb.ApplicationHeartbeatRequest, context: grpc.ServicerContext
    ) -> pb.ApplicationHeartbeatResponse:
        self._check_acts_for(context, request.application_id)
        lost = self.state.application_heartbeat(request.application_id)
        if lost is None:
            return pb.ApplicationHeartbeatResponse(known=False)
        return pb.ApplicationHeartbeatResponse(
            known=True,
            lost=[pb.LostPartition(job_id=job, partition=key_of(p)) for job, p in lost],
        )

    @reports_errors
    def UnregisterApplication(  # noqa: N802
        self, request: pb.UnregisterApplicationRequest, context: grpc.ServicerContext
    ) -> pb.UnregisterApplicationResponse:
        self._check_acts_for(context, request.application_id)
        released = self._delete(self.state.unregister_application(request.application_id))
        return pb.UnregisterApplicationResponse(released_partitions=released)

    @reports_errors
    def RegisterJob(  # noqa: N802
        self, request: pb.RegisterJobRequest, context: grpc.ServicerContext
    ) -> pb.RegisterJobResponse:
        self._check_acts_for(context, request.application_id)
        self.state.register_job(request.application_id, request.job_id)
        return pb.RegisterJobResponse()

    @reports_errors
    def UnregisterJob(  # noqa: N802
        self, request: pb.UnregisterJobRequest, context: grpc.ServicerContext
    ) -> pb.UnregisterJobResponse:
        self._check_acts_for(context, request.application_id)
        releases = self.state.unregister_job(
            request.application_id, request.job_id, request.keep_persistent
        )
        return pb.UnregisterJobResponse(released_partitions=self._delete(releases))

    # --- partitions ---------------------------------------------------------------------------

    @reports_errors
    def RegisterPartition(  # noqa: N802
        self, request: pb.RegisterPartitionRequest, context: grpc.ServicerContext
    ) -> pb.RegisterPartitionResponse:
        return self._place(self._caller(context), request)

    @reports_errors
    def RegisterPartitions(  # noqa: N802
        self, request: pb.RegisterPartitionsRequest, context: grpc.ServicerContext
    ) -> pb.RegisterPartitionsResponse:
        if len(request.requests) > MAX_REGISTRATIONS_A_CALL:
            raise DataTooLargeError(
                f"{len(request.requests)} registrations in one call, over"
                f" {MAX_REGISTRATIONS_A_CALL}"
            )
        caller = self._caller(context)
        return pb.RegisterPartitionsResponse(
            responses=[self._place(caller, registration) for registration in request.requests]
        )

    def _place(
        self, caller: Credential, request: pb.RegisterPartitionRequest
    ) -> pb.RegisterPartitionResponse:
        partition = partition_of(request.partition)
        if caller.role is Role.APPLICATION:
            # A producer's placement is its application's, whether its request says so or not.
            if not request.application_id:
                request.application_id = caller.name
            caller.check_application(request.application_id, "act for")
            self._check_owns(caller, [partition], "place")
        # Where an application says its partition is, a worker not registered here yet is
        # tracked but never called before it registers: this coordinator would call it with
        # the cluster's secret.
        placement = self.state.register_partition(
            request, partition, trusted=caller.role is Role.CLUSTER
        )
        return pb.RegisterPartitionResponse(
            location=_location(placement),
            # Signed only once the state has taken the partition as this application's.
            placement=self._credentials.placement(partition, request.application_id)
            if self._credentials is not None and request.application_id
            else b"",
        )

    @reports_errors
    def ReleasePartitions(  # noqa: N802
        self, request: pb.ReleasePartitionsRequest, context: grpc.ServicerContext
    ) -> pb.ReleasePartitionsResponse:
        caller = self._check_acts_for(context, request.application_id)
        partitions = [partition_of(key) for key in request.partitions]
        self._check_owns(caller, partitions, "release")
        releases = self.state.release_partitions(
            request.application_id,
            partitions,
            # A copy a worker shows later of one unknown here is deleted: the secret's call.
            release_unknown=caller.role is Role.CLUSTER,
        )
        return pb.ReleasePartitionsResponse(released=self._delete(releases))

    @reports_errors
    def GetPartitionStatus(  # noqa: N802
        self, request: pb.GetPartitionStatusRequest, context: grpc.ServicerContext
    ) -> pb.GetPartitionStatusResponse:
        self._check_acts_for(context, request.application_id)
        # Before the placements: a worker that registers in between is asked, or still awaited.
        awaited = self.state.awaited_workers()
        placements, askable = self.state.job_partitions(request.application_id, request.job_id)
        statistics = self._committed_statistics(
            placements, askable, without_statistics=request.without_statistics
        )
        return pb.GetPartitionStatusResponse(
            partitions=[
                pb.PartitionStatus(
                    location=_location(placement),
                    available=placement.partition in statistics,
                    statistics=statistics.get(placement.partition),
                    undecided=placement.partition not in statistics
                    and any(replica.worker_id in awaited for replica in placement.replicas),
                )
                for placement in placements
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
        self,
        placements: list[PartitionPlacement],
        askable: dict[str, WorkerAddress],
        *,
        without_statistics: bool,
    ) -> dict[ResultPartitionID, pb.PartitionStatistics]:
        """Ask each worker which of these partitions it has committed (their statistics
        empty ``without_statistics``)."""
        by_worker: dict[str, list[ResultPartitionID]] = defaultdict(list)
        for placement in placements:
            for replica in placement.replicas:
                if replica.worker_id in askable:
                    by_worker[replica.worker_id].append(placement.partition)
        found: dict[ResultPartitionID, pb.PartitionStatistics] = {}
        for worker_id, partitions in by_worker.items():
            request = pb.WorkerPartitionStatusRequest(
                partitions=[key_of(p) for p in partitions], without_statistics=without_statistics
            )
            try:
                answer = self._worker_status(askable[worker_id], request)
            except grpc.RpcError as error:
                logger.warning("status of %s unknown: %s", worker_id, error)
                continue
            for item in answer.partitions:
                if item.committed:
                    found.setdefault(partition_of(item.partition), item.statistics)
        for placement in placements:
            # Moved to a tier store, with no worker that holds it answering: the store says.
            if placement.tier_url and placement.partition not in found:
                moved = self._tiers.statistics(placement.tier_url, placement.partition)
                if moved is not None:
                    found[placement.partition] = (
                        pb.PartitionStatistics() if without_statistics else statistics_to_pb(moved)
                    )
        return found
