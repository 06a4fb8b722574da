"""What a coordinator knows: which workers live, which applications and jobs exist, where each
partition is placed, and what was lost. A plain class with the clock passed in; the gRPC
servicer (``coordinator``) is a thin layer that also makes the calls to workers this decides.

It lives in memory and is rebuilt after a restart, never lost: workers are the truth for what
is stored (they register with what they hold, which is kept, unclaimed), drivers for what is
wanted (an application the coordinator does not know registers again with its jobs and the
place of every partition it registered, claiming them). Several coordinators may run side by
side: each learns the same from the workers and the drivers.

Data is deleted on release, job end and application expiry, and when no application claimed it
for the application timeout; a worker that cannot be told now is told when it next calls.

A partition its worker moved to the worker's tier store (a shared store) is not lost with the
worker: readers find it there, and so does this coordinator when it is asked whether the
partition is committed, or must delete it and no worker that holds it is alive.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from external_shuffle.daemon.ended_applications import EndedApplications
from external_shuffle.wire.errors import NotRegisteredError, UnavailableError
from external_shuffle.wire.messages import Commit, WorkerAddress
from external_shuffle.wire.stubs import pb
from scheduling.placement import (
    NoPlacementTargetError,
    PlacementRequest,
    PlacementStrategy,
    PlacementTarget,
)
from shuffle_api import ApplicationIdentity, PermissionDeniedError, ResultPartitionID
from shuffle_api.ids import validate_id

__all__ = ["CoordinatorState", "PartitionPlacement", "Releases", "WorkerView"]

logger = logging.getLogger(__name__)

_MAX_RELEASED = 100_000
_ENDED_PER_ANSWER = 10_000  # ended applications a worker's heartbeat is told at most
_UNSAID = ApplicationIdentity()  # what a driver that does not say who it is gives


@dataclass(frozen=True, slots=True)
class Releases:
    """Partitions forgotten: how many, and what each live worker deletes now (the servicer
    makes the calls; the other workers are told with their next call), and what the servicer
    deletes from tier stores itself (moved there, no worker that holds it alive)."""

    count: int
    per_worker: dict[WorkerAddress, list[ResultPartitionID]]
    on_tier: dict[str, list[ResultPartitionID]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class WorkerView:
    address: WorkerAddress
    load: pb.WorkerLoad
    alive: bool
    seconds_since_heartbeat: float


@dataclass(frozen=True, slots=True)
class PartitionPlacement:
    """A partition and its replicas' workers, first replica first; ``on_tier``: moved to a
    replica's tier store."""

    partition: ResultPartitionID
    replicas: tuple[WorkerAddress, ...]
    on_tier: bool = False

    @property
    def tier_url(self) -> str:
        """Where the partition was moved ("" if it was not): its first replica's tier store
        that there is."""
        if self.on_tier:
            for address in self.replicas:
                if address.tier_url:
                    return address.tier_url
        return ""


@dataclass
class _Worker:
    address: WorkerAddress
    load: pb.WorkerLoad
    last_seen: float
    alive: bool = True
    # Deletions it missed (it was unreachable, or dead): given with its next call.
    pending_release: set[ResultPartitionID] = field(default_factory=set)
    # Known only from a client's word (placed_on) since this coordinator started: not yet
    # registered, but asked about its partitions (it may be up, about to register) if that
    # client held the cluster's secret: an application's word is never an address to call.
    announced: bool = False
    dialable: bool = True  # registered, or announced by a holder of the cluster's secret


@dataclass
class _Partition:
    partition: ResultPartitionID
    replicas: tuple[str, ...]  # worker ids, first replica first
    placed_at: float
    application_id: str = ""
    job_id: str = ""
    persistent: bool = False
    on_tier: bool = False  # moved to its worker's tier store: outlives the worker


@dataclass
class _Application:
    last_seen: float  # its driver's last heartbeat here (what peers are told)
    # Its driver's last heartbeat at another coordinator, as that one said.
    seen_elsewhere: float = float("-inf")
    jobs: set[str] = field(default_factory=set)
    lost: list[tuple[str, ResultPartitionID]] = field(default_factory=list)
    released: int = 0  # partitions it released here, for the line at its end
    identity: ApplicationIdentity = field(default_factory=ApplicationIdentity)
    client: str = ""  # the client credential's name that registered it ("": another holder)


class CoordinatorState:
    """Thread-safe; every method takes the time from ``clock``."""

    def __init__(
        self,
        *,
        placement: PlacementStrategy,
        worker_timeout: float,
        application_timeout: float,
        clock: Callable[[], float],
    ) -> None:
        self._placement = placement
        self.worker_timeout = worker_timeout
        self.application_timeout = application_timeout
        self._clock = clock
        self._started = clock()
        self._workers: dict[str, _Worker] = {}
        self._partitions: dict[ResultPartitionID, _Partition] = {}
        # Partitions per worker, kept as they are placed and dropped: placement reads it.
        self._tracked_per_worker: dict[str, int] = defaultdict(int)
        self._applications: dict[str, _Application] = {}
        # Partitions released: a copy a worker shows later (a heartbeat under way, or this
        # coordinator restarted and not every replica's worker had registered again) is
        # deleted. Oldest first; kept for the application timeout, at most _MAX_RELEASED.
        self._released: dict[ResultPartitionID, float] = {}
        # Their credentials are refused, here and (told with heartbeats) on the workers.
        self.ended = EndedApplications()
        self._lock = threading.RLock()

    # --- counts for the gauges ----------------------------------------------------------------

    def partition_count(self) -> int:
        return len(self._partitions)

    def application_count(self) -> int:
        return len(self._applications)

    def alive_worker_count(self) -> int:
        with self._lock:
            return sum(worker.alive for worker in self._workers.values())

    # --- workers ------------------------------------------------------------------------------

    def register_worker(
        self,
        address: WorkerAddress,
        load: pb.WorkerLoad,
        held: Sequence[ResultPartitionID],
        on_tier: Sequence[ResultPartitionID] = (),
        held_for: Sequence[str] = (),
    ) -> list[ResultPartitionID]:
        """Take the worker (again); returns the partitions it holds that it must delete.
        What it holds that nobody here knows is kept, unclaimed: after a restart of this
        coordinator, its application claims it. ``on_tier``: those of ``held`` it moved to
        its tier store; ``held_for``: the application each of ``held`` is for, in order
        (empty from older workers)."""
        now = self._clock()
        moved = set(on_tier)
        owners = list(held_for) if len(held_for) == len(held) else [""] * len(held)
        with self._lock:
            previous = self._workers.get(address.worker_id)
            obsolete = set() if previous is None else set(previous.pending_release)
            self._workers[address.worker_id] = _Worker(address, load, now)
            commits = [
                Commit(p, owner, on_tier=p in moved) for p, owner in zip(held, owners, strict=True)
            ]
            adopted = self._adopt(address.worker_id, commits, obsolete)
        logger.info(
            "worker registered; %d partitions unknown here kept until claimed",
            adopted,
            extra={"worker_id": address.worker_id, "target": address.target},
        )
        return sorted(obsolete, key=str)

    def worker_heartbeat(
        self, worker_id: str, load: pb.WorkerLoad, committed: Sequence[Commit] = ()
    ) -> list[ResultPartitionID] | None:
        """The partitions the worker must delete; None if it must register (again). What it
        committed since its last heartbeat and nobody here placed on it is taken as at a
        registration."""
        with self._lock:
            worker = self._workers.get(worker_id)
            if worker is None or not worker.alive:
                return None
            worker.load = load
            worker.last_seen = self._clock()
            release, worker.pending_release = worker.pending_release, set()
            self._adopt(worker_id, committed, release)
        return sorted(release, key=str)

    def workers(self) -> list[WorkerView]:
        now = self._clock()
        with self._lock:
            return [
                WorkerView(worker.address, worker.load, worker.alive, now - worker.last_seen)
                for worker in self._workers.values()
            ]

    def heard_decommission(self, worker_id: str, *, decommissioning: bool) -> None:
        """The worker took a decommission (or its cancel) passed on from here: placement here
        follows at once, not from its next heartbeat."""
        with self._lock:
            worker = self._workers.get(worker_id)
            if worker is not None:
                worker.load.decommissioning = decommissioning

    def live_address(self, worker_id: str) -> WorkerAddress | None:
        with self._lock:
            worker = self._workers.get(worker_id)
            return None if worker is None or not worker.alive else worker.address

    def is_known(self, worker_id: str) -> bool:
        with self._lock:
            return worker_id in self._workers

    def declare_dead(self, worker_id: str, reason: str) -> None:
        """The worker is gone: partitions with no other live replica are lost (reported to
        their application, and deleted should the worker come back: the job reruns them)."""
        lost = 0
        with self._lock:
            worker = self._workers.get(worker_id)
            if worker is None or not worker.alive:
                return
            worker.alive = False
            for entry in list(self._partitions.values()):
                if (
                    worker_id not in entry.replicas
                    or entry.on_tier
                    or any(self._is_alive(replica) for replica in entry.replicas)
                ):
                    continue
                lost += 1
                self._untrack(entry)
                for replica in entry.replicas:
                    self._workers[replica].pending_release.add(entry.partition)
                application = self._applications.get(entry.application_id)
                if application is not None and entry.job_id:
                    application.lost.append((entry.job_id, entry.partition))
        logger.warning(
            "worker declared dead: %s; %d partitions lost",
            reason,
            lost,
            extra={"worker_id": worker_id},
        )

    def defer_release(self, worker_id: str, partitions: Sequence[ResultPartitionID]) -> None:
        """A worker could not be told to delete these: it is, with its next call."""
        with self._lock:
            worker = self._workers.get(worker_id)
            if worker is not None:
                worker.pending_release.update(partitions)

    # --- applications and jobs ----------------------------------------------------------------

    def register_application(
        self, application_id: str, identity: ApplicationIdentity = _UNSAID, *, client: str = ""
    ) -> None:
        """Hear of an application (again: its driver registers after this coordinator
        restarted), with who it is if its driver says (older drivers do not: empty). A
        ``client`` (a client credential's name) registers a new application, or one it
        registered itself: never another client's, nor one that ended (PermissionDeniedError),
        which would get it that application's credential."""
        validate_id(application_id, "application id")
        with self._lock:
            application = self._applications.get(application_id)
            known = application is not None
            if client and (
                application_id in self.ended
                or (application is not None and application.client != client)
            ):
                raise PermissionDeniedError(
                    f"client {client!r} may not register application {application_id}: it is"
                    " another's, or it ended"
                )
            if application is None:
                application = self._applications[application_id] = _Application(0.0)
                application.client = client
            if identity != _UNSAID:
                application.identity = identity
            application.last_seen = self._clock()
        if not known:
            who = application.identity
            logger.info(
                "application %s registered%s",
                application_id,
                f": {who.engine_id!r} {who.name!r} of user {who.user!r}" if who.engine_id else "",
                extra={"application_id": application_id, "engine_id": who.engine_id},
            )

    def application_heartbeat(
        self, application_id: str
    ) -> list[tuple[str, ResultPartitionID]] | None:
        """(job, partition) lost since the last heartbeat; None if the application is unknown
        (it expired, or this coordinator restarted: it must register again)."""
        with self._lock:
            application = self._applications.get(application_id)
            if application is None:
                return None
            application.last_seen = self._clock()
            lost, application.lost = application.lost, []
        return lost

    def applications(self) -> list[tuple[str, float, ApplicationIdentity]]:
        """Each application with the seconds since its driver's last heartbeat here, and who
        it is."""
        now = self._clock()
        with self._lock:
            return [
                (name, now - app.last_seen, app.identity)
                for name, app in self._applications.items()
            ]

    def bytes_per_application(self) -> dict[str, int]:
        """What each application holds on the live workers, as they last reported it."""
        held: Counter[str] = Counter()
        with self._lock:
            for worker in self._workers.values():
                if worker.alive:
                    held.update(dict(worker.load.application_bytes))
        return dict(held)

    def partitions_per_application(self) -> dict[str, int]:
        """How many partitions each application has here (placed or restored)."""
        with self._lock:
            return dict(Counter(entry.application_id for entry in self._partitions.values()))

    def silent_applications(self) -> list[str]:
        """The applications :meth:`reap` would expire now, unless heard elsewhere."""
        now = self._clock()
        with self._lock:
            return [
                name
                for name, application in self._applications.items()
                if self._silent(application, now)
            ]

    def heard_elsewhere(self, seconds_since: dict[str, float]) -> None:
        """Another coordinator heard from these applications' drivers that many seconds ago
        (an application expires only when no live coordinator hears from it)."""
        now = self._clock()
        with self._lock:
            for name, seconds in seconds_since.items():
                application = self._applications.get(name)
                if application is not None:
                    application.seen_elsewhere = max(application.seen_elsewhere, now - seconds)

    def _silent(self, application: _Application, now: float) -> bool:
        last = max(application.last_seen, application.seen_elsewhere)
        return now - last > self.application_timeout

    def ended_after(self, heard: int) -> tuple[list[str], int]:
        """What a worker's heartbeat is told of the applications that ended (see
        :meth:`EndedApplications.after`)."""
        return self.ended.after(heard, _ENDED_PER_ANSWER)

    def unregister_application(self, application_id: str) -> Releases:
        with self._lock:
            self.ended.add([application_id])
            application = self._applications.pop(application_id, None)
            entries = [e for e in self._partitions.values() if e.application_id == application_id]
            releases = self._release(entries)
        released = releases.count + (0 if application is None else application.released)
        logger.info(
            "application %s ended: %d partitions released here since it registered",
            application_id,
            released,
            extra={"application_id": application_id, "partitions": released},
        )
        return releases

    def register_job(self, application_id: str, job_id: str) -> None:
        validate_id(job_id, "job id")
        with self._lock:
            self._application(application_id).jobs.add(job_id)

    def unregister_job(self, application_id: str, job_id: str, keep_persistent: bool) -> Releases:
        with self._lock:
            application = self._applications.get(application_id)
            if application is not None:
                application.jobs.discard(job_id)
            releases = self._release(
                [
                    entry
                    for entry in self._partitions.values()
                    if entry.application_id == application_id
                    and entry.job_id == job_id
                    and not (keep_persistent and entry.persistent)
                ]
            )
            self._count_released(application_id, releases)
        logger.info(
            "application %s ended job %s: %d partitions released",
            application_id,
            job_id,
            releases.count,
            extra={
                "application_id": application_id,
                "job_id": job_id,
                "partitions": releases.count,
            },
        )
        return releases

    def _count_released(self, application_id: str, releases: Releases) -> None:
        """Under the lock: add to what the application's line at its end says."""
        application = self._applications.get(application_id)
        if application is not None:
            application.released += releases.count

    def _application(self, application_id: str) -> _Application:
        application = self._applications.get(application_id)
        if application is None:
            raise NotRegisteredError(
                f"application {application_id[:64]!r} is not registered (or expired after"
                f" {self.application_timeout} s without heartbeats)"
            )
        return application

    # --- partitions ---------------------------------------------------------------------------

    def register_partition(
        self,
        request: pb.RegisterPartitionRequest,
        partition: ResultPartitionID,
        *,
        trusted: bool = True,
    ) -> PartitionPlacement:
        """Place the partition attempt, or give its place (idempotent); with ``placed_on``,
        track it where the client says it is. A producer's call names the application it
        writes for (kept while that lives); the driver's claims it for its job."""
        with self._lock:
            if request.job_id:
                application = self._application(request.application_id)
                if request.job_id not in application.jobs:
                    raise NotRegisteredError(
                        f"job {request.job_id[:64]!r} is not registered with application"
                        f" {request.application_id[:64]!r}"
                    )
            entry = self._partitions.get(partition)
            if entry is None:
                entry = _Partition(partition, (), self._clock())
                if request.placed_on:
                    self._track(entry)
                    self._restore_replicas(entry, request.placed_on, dialable=trusted)
                else:
                    entry.replicas = self._place(partition, request)
                    self._track(entry)
                    logger.debug("placed %s on %s", partition, ", ".join(entry.replicas))
            elif request.placed_on and not entry.job_id:
                # Adopted from the workers that registered so far: the client knows them all.
                self._restore_replicas(entry, request.placed_on, dialable=trusted)
            if request.application_id and entry.application_id not in (
                "",
                request.application_id,
            ):
                raise NotRegisteredError(f"partition {partition} belongs to another application")
            if request.application_id:
                entry.application_id = request.application_id
            if request.job_id and not entry.job_id:
                entry.job_id = request.job_id
                entry.persistent = request.persistent
            return self._placement_of(entry)

    def owners(self, partitions: Sequence[ResultPartitionID]) -> dict[ResultPartitionID, str]:
        """The application each of these partitions is tracked for ("": none), of those
        tracked here."""
        with self._lock:
            return {
                partition: entry.application_id
                for partition in partitions
                if (entry := self._partitions.get(partition)) is not None
            }

    def release_partitions(
        self,
        application_id: str,
        partitions: Sequence[ResultPartitionID],
        *,
        release_unknown: bool = True,
    ) -> Releases:
        """An application releases its own partitions and unclaimed ones only (any copy a
        worker shows later is deleted; of one not tracked here, only ``release_unknown``)."""
        with self._lock:
            if release_unknown:
                self._remember_released(p for p in partitions if p not in self._partitions)
            releases = self._release(
                [
                    entry
                    for partition in set(partitions)
                    if (entry := self._partitions.get(partition)) is not None
                    and entry.application_id in ("", application_id)
                ]
            )
            # A driver releases partitions one by one: they are counted into the line at the
            # application's end, not logged each.
            self._count_released(application_id, releases)
            return releases

    def job_partitions(
        self, application_id: str, job_id: str
    ) -> tuple[list[PartitionPlacement], dict[str, WorkerAddress]]:
        """The job's partitions, and the workers to ask which of them are committed: the live
        ones, and those only announced (they may be up, about to register)."""
        with self._lock:
            self._application(application_id)
            placements = [
                self._placement_of(entry)
                for entry in self._partitions.values()
                if entry.application_id == application_id and entry.job_id == job_id
            ]
            askable = {
                worker_id: worker.address
                for worker_id, worker in self._workers.items()
                if worker.alive or (worker.announced and worker.dialable)
            }
        return placements, askable

    def awaited_workers(self) -> set[str]:
        """Workers a client named as holding partitions that have not registered since this
        coordinator started, while it is younger than a worker timeout: a live worker's next
        heartbeat registers it, so what it holds is not lost yet."""
        with self._lock:
            if self._clock() - self._started > self.worker_timeout:
                return set()
            return {
                worker_id
                for worker_id, worker in self._workers.items()
                if worker.announced and not worker.alive
            }

    # --- time ---------------------------------------------------------------------------------

    def reap(self) -> Releases:
        """Declare workers whose heartbeats stopped dead; expire silent applications and
        unclaimed partitions. Returns what to delete."""
        now = self._clock()
        with self._lock:
            for worker_id, worker in list(self._workers.items()):
                if worker.alive and now - worker.last_seen > self.worker_timeout:
                    self.declare_dead(worker_id, "no heartbeat")
            expired = [
                application_id
                for application_id, application in self._applications.items()
                if self._silent(application, now)
            ]
            entries: list[_Partition] = []
            for application_id in expired:
                owned = [e for e in self._partitions.values() if e.application_id == application_id]
                logger.info(
                    "application %s expired after %s s without heartbeats: %d partitions deleted",
                    application_id,
                    self.application_timeout,
                    len(owned),
                    extra={"application_id": application_id, "partitions": len(owned)},
                )
                del self._applications[application_id]
                self.ended.add([application_id])
                entries.extend(owned)
            # Unclaimed: no application known here owns it (adopted from a worker, or placed
            # for an application that never registered here).
            unclaimed = [
                entry
                for entry in self._partitions.values()
                if entry.application_id not in self._applications
                and entry.application_id not in expired  # deleted above, and logged
                and now - entry.placed_at > self.application_timeout
            ]
            for partition, released_at in list(self._released.items()):
                if now - released_at <= self.application_timeout:
                    break
                del self._released[partition]
            if unclaimed:
                logger.info("deleting %d partitions no application claimed", len(unclaimed))
            return self._release([*entries, *unclaimed])

    # --- internals (under the lock) -----------------------------------------------------------

    def _adopt(
        self, worker_id: str, held: Sequence[Commit], obsolete: set[ResultPartitionID]
    ) -> int:
        """Track the copies the worker holds where nothing here says so: a partition unknown
        here is kept (its application's, if the writer named one: else unclaimed); add to
        ``obsolete`` the copies to delete (released, or placed elsewhere for a job). Returns
        how many partitions it adopted."""
        now = self._clock()
        adopted = 0
        for commit in held:
            partition = commit.partition
            entry = self._partitions.get(partition)
            if partition in self._released:
                obsolete.add(partition)
                continue
            if partition in obsolete:
                continue
            if (
                entry is not None
                and entry.application_id
                and commit.application_id
                and commit.application_id != entry.application_id
            ):
                # Another application's copy of the same id: neither a replica nor stale.
                logger.warning(
                    "%s on %s was committed for application %s, tracked for %s: left alone",
                    partition,
                    worker_id,
                    commit.application_id,
                    entry.application_id,
                )
                continue
            if entry is not None and worker_id in entry.replicas:
                entry.on_tier |= commit.on_tier
                continue
            if entry is None:
                self._track(
                    _Partition(
                        partition,
                        (worker_id,),
                        now,
                        commit.application_id,
                        on_tier=commit.on_tier,
                    )
                )
                adopted += 1
            elif not entry.job_id:
                self._set_replicas(entry, (*entry.replicas, worker_id))
                entry.on_tier |= commit.on_tier
            else:
                obsolete.add(partition)  # its application has it placed elsewhere
        return adopted

    def _is_alive(self, worker_id: str) -> bool:
        worker = self._workers.get(worker_id)
        return worker is not None and worker.alive

    def _track(self, entry: _Partition) -> None:
        self._partitions[entry.partition] = entry
        for worker_id in entry.replicas:
            self._tracked_per_worker[worker_id] += 1

    def _untrack(self, entry: _Partition) -> None:
        del self._partitions[entry.partition]
        for worker_id in entry.replicas:
            self._tracked_per_worker[worker_id] -= 1

    def _set_replicas(self, entry: _Partition, replicas: tuple[str, ...]) -> None:
        for worker_id in entry.replicas:
            self._tracked_per_worker[worker_id] -= 1
        entry.replicas = replicas
        for worker_id in replicas:
            self._tracked_per_worker[worker_id] += 1

    def _restore_replicas(
        self, entry: _Partition, placed_on: Sequence[pb.WorkerInfo], *, dialable: bool
    ) -> None:
        """Track the partition on the workers a client names (``dialable``: a holder of the
        cluster's secret, whose word for a worker's address is taken)."""
        replicas = []
        for info in placed_on:
            address = WorkerAddress.from_pb(info)
            if address.worker_id not in self._workers:
                self._workers[address.worker_id] = _Worker(
                    address,
                    pb.WorkerLoad(),
                    self._clock(),
                    alive=False,
                    announced=True,
                    dialable=dialable,
                )
            if address.worker_id not in replicas:
                replicas.append(address.worker_id)
        replicas.extend(worker_id for worker_id in entry.replicas if worker_id not in replicas)
        self._set_replicas(entry, tuple(replicas))

    def _release(self, entries: list[_Partition]) -> Releases:
        """Forget the partitions; returns what live workers delete now (the others are told
        with their next call)."""
        per_worker: dict[WorkerAddress, list[ResultPartitionID]] = defaultdict(list)
        on_tier: dict[str, list[ResultPartitionID]] = defaultdict(list)
        released: list[ResultPartitionID] = []
        for entry in entries:
            if self._partitions.get(entry.partition) is not entry:
                continue
            released.append(entry.partition)
            self._untrack(entry)
            for worker_id in entry.replicas:
                worker = self._workers[worker_id]
                if worker.alive:
                    per_worker[worker.address].append(entry.partition)
                else:
                    worker.pending_release.add(entry.partition)
            placement = self._placement_of(entry)
            if placement.tier_url and not any(map(self._is_alive, entry.replicas)):
                on_tier[placement.tier_url].append(entry.partition)
        self._remember_released(released)
        return Releases(len(released), dict(per_worker), dict(on_tier))

    def _remember_released(self, partitions: Iterable[ResultPartitionID]) -> None:
        """A copy a worker shows later (a heartbeat sent before the release, or a replica
        that registers after it) is then deleted, not tracked again."""
        now = self._clock()
        for partition in partitions:
            self._released.pop(partition, None)
            self._released[partition] = now
        while len(self._released) > _MAX_RELEASED:
            del self._released[next(iter(self._released))]

    def _placement_of(self, entry: _Partition) -> PartitionPlacement:
        return PartitionPlacement(
            entry.partition,
            tuple(self._workers[worker_id].address for worker_id in entry.replicas),
            entry.on_tier,
        )

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

    def _place(
        self, partition: ResultPartitionID, request: pb.RegisterPartitionRequest
    ) -> tuple[str, ...]:
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
        return placed[key]
