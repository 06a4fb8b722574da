"""The external service's ShuffleMaster: one application on the coordinators.

A heartbeat thread keeps the application alive on each coordinator (a coordinator deletes the
data of an application whose heartbeats stop) and brings back partitions lost with a worker,
which are reported to their job's :class:`~shuffle_api.JobShuffleContext`. A coordinator that
does not know the application (it restarted) is told everything again: the application, its
jobs and where each partition it registered was placed, so nothing stored is lost with it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import grpc

from external_shuffle.client.coordinators import Answer, Coordinators
from external_shuffle.client.descriptor import ExternalShuffleDescriptor
from external_shuffle.options import (
    APPLICATION_CREDENTIAL,
    CLIENT_APPLICATION,
    CLIENT_HEARTBEAT_INTERVAL,
    CLIENT_RETRY_TIMEOUT,
    REPLICATION_FACTOR,
    coordinator_addresses,
)
from external_shuffle.wire.channels import ChannelPool, ClientSettings, translate_rpc_error
from external_shuffle.wire.credentials import CLIENT_CREDENTIAL_PREFIX, application_id_for
from external_shuffle.wire.errors import NotRegisteredError
from external_shuffle.wire.messages import (
    MAX_REGISTRATIONS_A_CALL,
    identity_to_pb,
    key_of,
    partition_of,
    statistics_from_pb,
)
from external_shuffle.wire.stubs import pb, pb_grpc
from shuffle_api import (
    JobShuffleContext,
    PartitionDescriptor,
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

__all__ = ["ExternalShuffleMaster"]

logger = logging.getLogger(__name__)

R = TypeVar("R")

# Registration calls in flight at once (each places the registrations waiting when it starts,
# up to MAX_REGISTRATIONS_A_CALL; a few calls each with several coordinators).
_REGISTRATION_THREADS = 8
# Partitions named in one release call (each key is ~100 bytes; messages stay small).
_RELEASE_BATCH = 1000
# How long a stage check asks again about partitions a restarted coordinator calls undecided
# (their workers have not registered again yet; it says so for one worker timeout, 10 s by
# default), and how often. What is still undecided after that is lost.
_UNDECIDED_PATIENCE = 60.0
_UNDECIDED_POLL = 0.25


@dataclass(frozen=True, slots=True)
class _Registered:
    """A partition a job registered: its descriptor, and the request that placed it (sent again,
    with the place, to a coordinator that does not know it)."""

    descriptor: ExternalShuffleDescriptor
    request: pb.RegisterPartitionRequest


@dataclass(frozen=True, slots=True)
class _Registration:
    """A registration waiting for a call to send it, and what it answers."""

    job_id: str
    partition: ResultPartitionID
    request: pb.RegisterPartitionRequest
    answer: Future[ShuffleDescriptor]


class ExternalShuffleMaster(ShuffleMaster):
    def __init__(self, context: ShuffleMasterContext) -> None:
        config = context.configuration
        self._settings = ClientSettings.from_configuration(config)
        self._channels = ChannelPool(self._settings)
        self._coordinators = Coordinators(
            coordinator_addresses(config),
            self._channels,
            retry_timeout=config.get(CLIENT_RETRY_TIMEOUT),
        )
        self._interval = config.get(CLIENT_HEARTBEAT_INTERVAL)
        self._replicas = config.get(REPLICATION_FACTOR)
        self.application_id = application_id_for(self._settings.token)
        self._registration = pb.RegisterApplicationRequest(
            application_id=self.application_id, identity=identity_to_pb(context.application)
        )
        self._jobs: dict[str, JobShuffleContext] = {}
        # What each job registered, so partitions the coordinators no longer have are reported
        # unavailable, not forgotten, and a restarted coordinator learns where they are.
        self._registered: dict[str, dict[ResultPartitionID, _Registered]] = defaultdict(dict)
        # Persistent partitions of unregistered jobs: kept until released or the end.
        self._kept: dict[ResultPartitionID, _Registered] = {}
        # Per coordinator, the (job, partition) it could not be told yet (it did not answer):
        # told with the next heartbeat it answers, lest it take them for unclaimed.
        self._unannounced: dict[str, set[tuple[str, ResultPartitionID]]] = defaultdict(set)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._heartbeats: threading.Thread | None = None
        self._registrations = ThreadPoolExecutor(
            _REGISTRATION_THREADS, thread_name_prefix="pyshuffle-register"
        )
        self._waiting: deque[_Registration] = deque()  # under the lock
        # The application's own credential, once a coordinator issued it to this driver
        # holding a client's credential: every later call, and the executors', present it.
        self._credential = ""
        self._closed = False
        # Coordinators whose last heartbeat went unanswered (by the heartbeat thread only).
        self._silent: set[str] = set()

    def _check_open(self) -> None:
        if self._closed:
            raise ShuffleServiceClosedError("external shuffle master is closed")

    def _stub(self, address: str) -> pb_grpc.CoordinatorStub:
        return self._coordinators.stub(address)

    def _on_first(self, what: str, call: Callable[[pb_grpc.CoordinatorStub], R]) -> R:
        """``call`` on the first coordinator that answers; one that does not know this
        application is told everything first."""

        def attempt(address: str) -> R:
            try:
                return call(self._stub(address))
            except grpc.RpcError as error:
                if not isinstance(translate_rpc_error(error, what), NotRegisteredError):
                    raise
            self._restore(address)
            return call(self._stub(address))

        return self._coordinators.first(what, attempt)

    def _on_each(self, what: str, call: Callable[[pb_grpc.CoordinatorStub], object]) -> None:
        """``call`` on every coordinator, at least one of which must answer (retried while
        none does); those that fail learn it when they answer again (a restart)."""
        answers = self._coordinators.each(what, lambda address: call(self._stub(address)))
        if all(answer.error is not None for answer in answers):
            self._on_first(what, call)

    def start(self) -> None:
        self._check_open()
        if self._heartbeats is not None:
            return
        issued: list[str] = []

        def register(stub: pb_grpc.CoordinatorStub) -> None:
            answer = stub.RegisterApplication(self._registration, timeout=self._settings.timeout)
            issued.append(answer.credential)

        self._on_each("registering application " + self.application_id, register)
        if self._settings.token.startswith(CLIENT_CREDENTIAL_PREFIX) and any(issued):
            self._credential = next(credential for credential in issued if credential)
            self._channels.use_token(self._credential)
        self._heartbeats = threading.Thread(
            target=self._heartbeat_loop, name="pyshuffle-application-heartbeat", daemon=True
        )
        self._heartbeats.start()

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.heartbeat()
            except ShuffleError as error:
                if set(self._coordinators.addresses) <= self._silent:
                    logger.debug("application heartbeat failed: %s", error)  # said already
                else:
                    logger.warning("application heartbeat failed: %s", error)

    def _note_silence(self, answers: Sequence[Answer[object]]) -> None:
        """Each coordinator's silence said once, at WARNING, and its return at INFO: a
        coordinator down for minutes is not a warning each heartbeat."""
        for answer in answers:
            if answer.error is None and answer.address in self._silent:
                self._silent.discard(answer.address)
                logger.info("coordinator %s answers again", answer.address)
            elif answer.error is not None and answer.address not in self._silent:
                self._silent.add(answer.address)
                logger.warning("%s (said once, until it answers again)", answer.error)
            elif answer.error is not None:
                logger.debug("%s", answer.error)

    def heartbeat(self) -> None:
        """Keep the application alive on each coordinator; tell one that does not know it
        everything again; report partitions lost with a worker to their jobs."""
        request = pb.ApplicationHeartbeatRequest(application_id=self.application_id)
        answers = self._coordinators.each(
            "application heartbeat",
            lambda address: self._stub(address).ApplicationHeartbeat(
                request, timeout=self._settings.timeout
            ),
        )
        self._note_silence(answers)
        errors = [answer.error for answer in answers if answer.error is not None]
        if len(errors) == len(answers):
            raise errors[0]
        lost: dict[str, list[ResultPartitionID]] = defaultdict(list)
        restored = False
        for answer in answers:
            if answer.error is not None:
                continue
            if answer.result is not None and not answer.result.known:
                logger.warning(
                    "coordinator %s does not know application %s (it restarted, or the"
                    " application expired there): registering it again",
                    answer.address,
                    self.application_id,
                )
                try:
                    self._restore(answer.address)
                except grpc.RpcError as error:
                    logger.warning("telling coordinator %s failed: %s", answer.address, error)
                    continue
                restored = True
            elif answer.result is not None:
                self._announce_missed(answer.address)
                for item in answer.result.lost:
                    lost[item.job_id].append(partition_of(item.partition))
        for job_id, partitions in lost.items():
            self._report_lost(job_id, partitions)
        if restored:
            # What the workers no longer have (the application expired there) is lost now.
            with self._lock:
                job_ids = list(self._jobs)
            # Not what its workers have not told it yet: they may be registering again.
            for job_id in job_ids:
                self._check_partitions(job_id, statistics=False, await_undecided=False)

    def _announce_missed(self, address: str) -> None:
        """Tell the coordinator at ``address`` where the partitions it missed are."""
        with self._lock:
            missed = self._unannounced.pop(address, set())
            requests = [
                registered.request
                for job_id, partition in missed
                if (registered := self._registered.get(job_id, {}).get(partition)) is not None
            ]
        if not requests:
            return
        try:
            self._tell_places(self._stub(address), requests)
        except grpc.RpcError as error:
            logger.info("coordinator %s not told where partitions are yet: %s", address, error)
            with self._lock:
                self._unannounced[address].update(missed)

    def _tell_places(
        self, stub: pb_grpc.CoordinatorStub, requests: list[pb.RegisterPartitionRequest]
    ) -> None:
        """Send these registrations (each with its place), up to MAX_REGISTRATIONS_A_CALL a
        call: a coordinator takes a bounded number of calls at once (past it, it refuses
        them), and a restarted one is told thousands of partitions."""
        for start in range(0, len(requests), MAX_REGISTRATIONS_A_CALL):
            stub.RegisterPartitions(
                pb.RegisterPartitionsRequest(
                    requests=requests[start : start + MAX_REGISTRATIONS_A_CALL]
                ),
                timeout=self._settings.timeout,
            )

    def _restore(self, address: str) -> None:
        """Tell the coordinator at ``address`` the application, its jobs and where each of
        their partitions was placed."""
        stub = self._stub(address)
        timeout = self._settings.timeout
        with self._lock:
            self._unannounced.pop(address, None)
            job_ids = list(self._jobs)
            requests = [
                registered.request
                for job_id in job_ids
                for registered in self._registered[job_id].values()
            ]
            kept = [registered.request for registered in self._kept.values()]
        stub.RegisterApplication(self._registration, timeout=timeout)
        # The jobs that only keep persistent partitions are registered for as long as it
        # takes to tell where those are.
        finished = {request.job_id for request in kept} - set(job_ids)
        for job_id in [*job_ids, *finished]:
            stub.RegisterJob(
                pb.RegisterJobRequest(application_id=self.application_id, job_id=job_id),
                timeout=timeout,
            )
        self._tell_places(stub, [*requests, *kept])
        for job_id in finished:
            stub.UnregisterJob(
                pb.UnregisterJobRequest(
                    application_id=self.application_id, job_id=job_id, keep_persistent=True
                ),
                timeout=timeout,
            )
        logger.info(
            "told coordinator %s application %s: %d jobs, %d partitions",
            address,
            self.application_id,
            len(job_ids),
            len(requests),
        )

    def _report_lost(self, job_id: str, partitions: list[ResultPartitionID]) -> None:
        with self._lock:
            context = self._jobs.get(job_id)
            registered = self._registered[job_id]
            # Each once: a heartbeat can bring one partitions_with_metrics already reported.
            partitions = [p for p in partitions if registered.pop(p, None) is not None]
        if context is not None and partitions:
            context.stop_tracking_and_release_partitions(partitions)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._registrations.shutdown(wait=True, cancel_futures=True)
        with self._lock:  # left by the calls cancelled above
            unsent, self._waiting = self._waiting, deque()
        for registration in unsent:
            registration.answer.cancel()
        if self._heartbeats is not None:
            self._heartbeats.join(timeout=self._settings.timeout)
            with self._lock:
                remaining = [
                    *self._kept,
                    *(p for registered in self._registered.values() for p in registered),
                ]
            # By name, not only with the application: a coordinator that restarted since
            # knows them only as unclaimed.
            try:
                self._release(remaining)
            except ShuffleError as error:
                logger.warning("releasing the application's partitions failed: %s", error)
            request = pb.UnregisterApplicationRequest(application_id=self.application_id)
            for answer in self._coordinators.each(
                "unregistering application " + self.application_id,
                lambda address: self._stub(address).UnregisterApplication(
                    request, timeout=self._settings.timeout
                ),
            ):
                if answer.error is not None:
                    logger.warning(
                        "%s (the coordinator deletes the application's data when it expires)",
                        answer.error,
                    )
        self._channels.close()

    def register_job(self, context: JobShuffleContext) -> None:
        self._check_open()
        with self._lock:
            if context.job_id in self._jobs:
                raise ShuffleError(f"job {context.job_id!r} is already registered")
            self._jobs[context.job_id] = context
        request = pb.RegisterJobRequest(application_id=self.application_id, job_id=context.job_id)
        try:
            self._on_each(
                "registering job " + context.job_id,
                lambda stub: stub.RegisterJob(request, timeout=self._settings.timeout),
            )
        except ShuffleError:
            with self._lock:
                self._jobs.pop(context.job_id, None)
            raise

    def unregister_job(self, job_id: str) -> None:
        with self._lock:
            if self._jobs.pop(job_id, None) is None:
                return
            registered = self._registered.pop(job_id, {})
            released = []
            for partition, entry in registered.items():
                if entry.request.persistent:
                    self._kept[partition] = entry
                else:
                    released.append(partition)
        request = pb.UnregisterJobRequest(
            application_id=self.application_id, job_id=job_id, keep_persistent=True
        )
        self._on_each(
            "unregistering job " + job_id,
            lambda stub: stub.UnregisterJob(request, timeout=self._settings.timeout),
        )
        # By name too: a coordinator that restarted since knows them only as unclaimed.
        self._release(released)

    def register_partition_with_producer(
        self,
        job_id: str,
        partition_descriptor: PartitionDescriptor,
        producer_descriptor: ProducerDescriptor,
    ) -> Future[ShuffleDescriptor]:
        self._check_open()
        partition = ResultPartitionID(
            partition_descriptor.partition_id, producer_descriptor.producer_execution_id
        )
        request = pb.RegisterPartitionRequest(
            application_id=self.application_id,
            job_id=job_id,
            partition=key_of(partition),
            number_of_subpartitions=partition_descriptor.number_of_subpartitions,
            producer_host=producer_descriptor.address,
            replicas=self._replicas,
            persistent=partition_descriptor.partition_type.is_persistent,
        )
        registration = _Registration(job_id, partition, request, Future())
        with self._lock:
            self._waiting.append(registration)
        self._registrations.submit(self._send_registrations)
        return registration.answer

    def _send_registrations(self) -> None:
        """Send the registrations waiting now, in one call: a driver registering thousands
        of map outputs makes a few calls, not one each. Where that call fails, each is sent
        alone (registering is idempotent), so that each gets its own answer."""
        with self._lock:
            taken = [
                self._waiting.popleft()
                for _ in range(min(len(self._waiting), MAX_REGISTRATIONS_A_CALL))
            ]
        batch = [r for r in taken if r.answer.set_running_or_notify_cancel()]
        if len(batch) == 1:
            self._register_alone(batch[0])
        elif batch:
            try:
                responses = self._on_first(
                    f"registering {len(batch)} partitions",
                    lambda stub: stub.RegisterPartitions(
                        pb.RegisterPartitionsRequest(requests=[r.request for r in batch]),
                        timeout=self._settings.timeout,
                    ),
                ).responses
                if len(responses) != len(batch):
                    raise ShuffleError(f"{len(responses)} answers to {len(batch)} registrations")
            except Exception as error:  # an older coordinator, or one refused
                logger.info("%s; registering them one by one", error)
                for registration in batch:
                    self._register_alone(registration)
            else:
                for registration, response in zip(batch, responses, strict=True):
                    self._settle(registration, response)

    def _register_alone(self, registration: _Registration) -> None:
        request = registration.request
        try:
            # NOT_FOUND here names an unknown application or job, never a lost partition.
            response = self._on_first(
                f"registering {registration.partition}",
                lambda stub: stub.RegisterPartition(request, timeout=self._settings.timeout),
            )
        except BaseException as error:
            registration.answer.set_exception(error)
        else:
            self._settle(registration, response)

    def _settle(self, registration: _Registration, response: pb.RegisterPartitionResponse) -> None:
        """Record where ``registration`` was placed, for its job, and answer it."""
        try:
            descriptor = ExternalShuffleDescriptor.placed(response)
            placed, missed = self._coordinators.announce(registration.request, response.location)
            with self._lock:
                self._registered[registration.job_id][registration.partition] = _Registered(
                    descriptor, placed
                )
                for address in missed:
                    self._unannounced[address].add((registration.job_id, registration.partition))
        except BaseException as error:
            registration.answer.set_exception(error)
        else:
            registration.answer.set_result(descriptor)

    def release_partition_externally(self, shuffle_descriptor: ShuffleDescriptor) -> None:
        self.release_partitions_externally([shuffle_descriptor])

    def release_partitions_externally(
        self, shuffle_descriptors: Sequence[ShuffleDescriptor]
    ) -> None:
        partitions = [descriptor.result_partition_id for descriptor in shuffle_descriptors]
        with self._lock:
            for registered in self._registered.values():
                for partition in partitions:
                    registered.pop(partition, None)
            for partition in partitions:
                self._kept.pop(partition, None)
        self._release(partitions)

    def _release(self, partitions: list[ResultPartitionID]) -> None:
        for start in range(0, len(partitions), _RELEASE_BATCH):
            self._release_batch(
                pb.ReleasePartitionsRequest(
                    application_id=self.application_id,
                    partitions=[key_of(p) for p in partitions[start : start + _RELEASE_BATCH]],
                )
            )

    def _release_batch(self, request: pb.ReleasePartitionsRequest) -> None:
        self._on_each(
            f"releasing {len(request.partitions)} partitions",
            lambda stub: stub.ReleasePartitions(request, timeout=self._settings.timeout),
        )

    def environment_configuration(self) -> Mapping[str, str]:
        """Producers place partitions on behalf of this application: the coordinator keeps
        them while it lives, not only for the application timeout until the driver claims
        them at the end of the map stage."""
        if self._credential:
            return {
                CLIENT_APPLICATION.key: self.application_id,
                APPLICATION_CREDENTIAL.key: self._credential,
            }
        return {CLIENT_APPLICATION.key: self.application_id}

    def partitions_with_metrics(
        self, job_id: str, *, statistics: bool = True
    ) -> Future[list[PartitionWithMetrics]]:
        """Every partition the job registered: available (with its statistics, if asked for)
        if a live worker has it committed; the others are reported lost to the job (and their
        leftovers deleted). Those on workers that a coordinator which just restarted has not
        heard from again are waited for, up to a minute."""
        return completed(self._check_partitions(job_id, statistics=statistics))

    def _check_partitions(
        self, job_id: str, *, statistics: bool, await_undecided: bool = True
    ) -> list[PartitionWithMetrics]:
        """:meth:`partitions_with_metrics`. Those a restarted coordinator calls undecided are
        asked about again for a while (``await_undecided``), or else left for the next check."""
        request = pb.GetPartitionStatusRequest(
            application_id=self.application_id, job_id=job_id, without_statistics=not statistics
        )
        deadline = time.monotonic() + (_UNDECIDED_PATIENCE if await_undecided else 0.0)
        waited = False
        while True:
            response = self._on_first(
                f"status of job {job_id}",
                lambda stub: stub.GetPartitionStatus(request, timeout=self._settings.timeout),
            )
            undecided = sum(status.undecided for status in response.partitions)
            if not undecided or time.monotonic() >= deadline:
                break
            if not waited:
                waited = True
                logger.info(
                    "job %s: %d partitions wait for their workers to register again",
                    job_id,
                    undecided,
                )
            time.sleep(_UNDECIDED_POLL)
        known = {partition_of(status.location.partition): status for status in response.partitions}
        with self._lock:
            registered = dict(self._registered.get(job_id, {}))
        result: list[PartitionWithMetrics] = []
        lost: list[ResultPartitionID] = []
        for partition, entry in registered.items():
            status = known.get(partition)
            if status is None or not status.available:
                if status is None or await_undecided or not status.undecided:
                    lost.append(partition)
                result.append(PartitionWithMetrics(entry.descriptor, False, None))
            else:
                found = statistics_from_pb(status.statistics) if statistics else None
                result.append(PartitionWithMetrics(entry.descriptor, True, found))
        if lost:
            self._report_lost(job_id, lost)
            try:
                self._release(lost)
            except ShuffleError as error:
                logger.warning("releasing lost partitions failed: %s", error)
        return result
