"""What a worker holds: the partitions being pushed and those committed, on its store.

A plain class with the clock passed in; the gRPC servicer (``service``) is a thin layer over
it, and the data port admits its fetches through the servicer. A push writes the data file's
bytes as they arrive (nothing is held beyond the message being written; a memory budget bounds
those across all pushes, and a push waiting for the budget stops reading its stream, so gRPC's
flow control holds the producer back). The commit checks the index and manifest against what
arrived and writes them atomically, manifest last: a partition is committed exactly when its
manifest exists, which is what a restarted worker finds.

With a tier store (a shared store: an object store), committed partitions move there, the
oldest first past a high-water mark of stored bytes and all of them on decommission: the copy
is committed there (manifest last), then the worker writes a marker beside its own manifest and
deletes its data and index. It goes on serving a moved partition, from the tier; clients that
cannot reach it read the tier themselves, and the coordinator keeps a moved partition when the
worker is lost.

With an application quota, each application may hold so many bytes on the worker (pushed and
committed): a push past it fails, and what it wrote of its partition is deleted. Which
application a partition is for is written beside its manifest, so a restarted worker knows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from external_shuffle.daemon.ended_applications import EndedApplications
from external_shuffle.daemon.worker.commit_watch import CommitWatch
from external_shuffle.wire.errors import UnavailableError
from external_shuffle.wire.messages import Commit
from external_shuffle.wire.stubs import pb
from shuffle_api import (
    ConfigError,
    DataTooLargeError,
    InvalidIdentifierError,
    PartitionNotFoundError,
    PartitionStatistics,
    PermissionDeniedError,
    QuotaExceededError,
    ResultPartitionID,
    ShuffleError,
    ShuffleServiceClosedError,
    StorageError,
    SubpartitionRange,
)
from shuffle_api.ids import new_id, validate_id
from shuffle_runtime.format import (
    DataStream,
    Layouts,
    PartitionFileReader,
    PartitionManifest,
    StoreSink,
    copy_partition,
    merge_partitions,
    partition_directory,
    stored_partitions,
    write_all,
)
from shuffle_runtime.format.manifest import DATA_FILE, INDEX_FILE, MANIFEST_FILE
from shuffle_runtime.format.reader import check_commit
from shuffle_runtime.store import Store, storage_errors

__all__ = [
    "MAX_MERGE_SOURCES",
    "MERGE_PASS_BYTES",
    "CommittedPartition",
    "MemoryBudget",
    "Upload",
    "WorkerState",
]

logger = logging.getLogger(__name__)

_PARTITION_LOCK_STRIPES = 64
_WATCHED_COMMITS = 10_000
MERGE_PASS_BYTES = 16 << 20
"""What one merge holds of its sources at once, reserved from the memory budget that bounds
pushes: merges and pushes together stay within it."""
MAX_MERGE_SOURCES = 10_000
"""Sources of one merge at most (each is a reader open while it runs)."""
"""Commits a coordinator hears of in one heartbeat; beyond, the worker registers again."""

WORKER_ID_FILE = ".pyshuffle-worker-id"
"""Under the store root: the worker's id, so a restarted worker is the same worker. A name no
partition id can take (ids cannot start with a dot)."""

APPLICATION_FILE = "application"
"""Beside a committed partition's manifest (written before it): the application it was
committed for, which a restarted worker reads back (absent: none named)."""
MOVED_FILE = "moved"
"""Beside a moved partition's manifest: its data and index are on the tier store it names."""
MOVING_FILE = "moving"
"""Beside a partition being copied to the tier: what reached the tier is deleted with it, and
by a restart that finds the move cut off."""


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
class Upload:
    """A partition attempt being pushed: its data file, open until the commit."""

    sink: StoreSink
    application_id: str = ""
    charged: int = 0
    """Bytes counted against its application's quota (under the state's lock); its size once
    every message written has been counted."""
    forgotten: bool = False  # released (under the state's lock): its bytes count no more
    data: DataStream | None = None
    next_sequence: int = 0
    size: int = 0
    duplicates: int = 0
    streams: int = 0  # push streams open on it now (under the state's lock)
    last_active: float = 0.0  # when a message of it last arrived, or its last stream ended
    lock: threading.Lock = field(default_factory=threading.Lock)

    def append(self, sequence: int, data: memoryview, charge: Callable[[int], None]) -> bool:
        """Write the message's bytes, after ``charge`` (with their size) lets them; False if
        its sequence number was already received (nothing charged)."""
        with self.lock:
            if self.forgotten:
                raise PartitionNotFoundError(
                    f"the push of {self.sink.partition} was refused or released meanwhile:"
                    " nothing of it is kept",
                    self.sink.partition,
                )
            if sequence < self.next_sequence:
                self.duplicates += 1
                return False
            if sequence > self.next_sequence:
                raise ShuffleError(
                    f"push of {self.sink.partition} skipped messages: expected sequence"
                    f" {self.next_sequence}, got {sequence}"
                )
            charge(len(data))
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
class CommittedPartition:
    """What the worker keeps of a committed partition: its statistics compressed (a few KiB
    where thousands of subpartitions' numbers take hundreds as Python integers)."""

    encoded_statistics: bytes
    subpartitions: int
    stored_bytes: int
    application_id: str = ""
    on_tier: bool = False  # moved: its data is on the tier store, not here

    @classmethod
    def of(
        cls,
        statistics: PartitionStatistics,
        stored_bytes: int,
        application_id: str = "",
        *,
        on_tier: bool = False,
    ) -> CommittedPartition:
        return cls(
            statistics.encode(),
            len(statistics.rows_per_subpartition),
            stored_bytes,
            application_id,
            on_tier,
        )

    def statistics(self) -> PartitionStatistics:
        return PartitionStatistics.decode(self.encoded_statistics, self.subpartitions)


def _overlap(first: str, second: str) -> bool:
    """Whether one store URL is the other, or below it."""
    first, second = first.rstrip("/") + "/", second.rstrip("/") + "/"
    return first.startswith(second) or second.startswith(first)


class WorkerState:
    """The partitions a worker holds on ``store``: uploads being pushed, committed ones, and
    whether it takes new ones; with a ``tier`` store, those moved there. Thread-safe;
    ``clock`` (seconds) ages abandoned uploads."""

    def __init__(
        self,
        store: Store,
        *,
        memory_budget: int,
        budget_timeout: float,
        tier: Store | None = None,
        application_quota: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if tier is not None and _overlap(store.url, tier.url):
            raise ConfigError(
                f"the tier store {tier.url} overlaps the worker's store {store.url}: moving"
                " a partition there would delete its only copy"
            )
        self.store = store
        self.tier = tier
        self._clock = clock
        self._budget = MemoryBudget(memory_budget, budget_timeout)
        self._uploads: dict[ResultPartitionID, Upload] = {}
        self._committed: dict[ResultPartitionID, CommittedPartition] = {}
        self._commit_watches: list[CommitWatch] = []
        self._application_quota = application_quota
        self._held: dict[str, int] = {}  # bytes each application holds here (quota or not)
        self.ended = EndedApplications()  # as the coordinators tell: their credentials fail
        self._lock = threading.Lock()
        # Commit and release of one partition exclude each other (striped: file I/O happens
        # under them, and partitions apart do not wait for each other).
        self._partition_locks = [threading.Lock() for _ in range(_PARTITION_LOCK_STRIPES)]
        self._decommissioning = False  # until cancelled
        self._shutting_down = False  # for good
        self.worker_id = self._load_worker_id()
        self._recover()

    # --- identity and restart -----------------------------------------------------------------

    def _load_worker_id(self) -> str:
        path = f"{self.store.path()}/{WORKER_ID_FILE}"
        if self.store.exists(path):
            return self.store.read_bytes(path).decode("utf-8").strip()
        worker_id = "worker-" + new_id()
        self.store.put_atomic(path, worker_id.encode("utf-8"))
        return worker_id

    def _recover(self) -> None:
        """Find the committed partitions on the store; delete uncommitted leftovers (pushes cut
        off by a crash)."""
        for directory, partition in stored_partitions(self.store):
            if partition is None:
                logger.warning("ignoring %s: not a partition directory", directory)
                continue
            if self.store.exists(self.store.child(directory, MOVED_FILE)):
                self._recover_moved(partition, directory)
                continue
            if self.store.exists(self.store.child(directory, MOVING_FILE)):
                self._forget_cut_off_move(partition, directory)
            try:
                reader = PartitionFileReader(self.store, partition)
            except PartitionNotFoundError:
                self.store.delete_tree(directory, empty_parents=2)
                logger.info("deleted uncommitted %s", partition)
                continue
            except ShuffleError as error:
                logger.warning("ignoring corrupt %s: %s", partition, error)
                continue
            application = self._application_of(directory)
            self._committed[partition] = CommittedPartition.of(
                reader.manifest.statistics, reader.manifest.data_bytes, application
            )
            self._count(application, reader.manifest.data_bytes)
        if self._committed:
            logger.info("serving %d committed partitions found on the store", len(self._committed))

    def _recover_moved(self, partition: ResultPartitionID, directory: str) -> None:
        """A partition moved to the tier before a restart (what a move cut off before its
        local deletes left is deleted now)."""
        # The marker names the tier (empty from workers before it did: the tier set now).
        marker = self.store.read_bytes(self.store.child(directory, MOVED_FILE)).decode()
        if self.tier is None or marker.rstrip("/") not in ("", self.tier.url.rstrip("/")):
            # Started without it, the worker would forget rows that only the tier holds.
            raise ConfigError(
                f"{partition} was moved to the tier store {marker or '(not recorded)'}, but this"
                f" worker's tier is {self.tier.url if self.tier else 'not set'}: start it with"
                f" external-shuffle.worker.tier-url={marker or '<that store>'} (or, if that"
                f" store is gone, delete {directory} to forget the partition)"
            )
        for name in (DATA_FILE, INDEX_FILE, MOVING_FILE):
            self.store.delete_tree(self.store.child(directory, name))
        try:
            manifest_bytes = self.store.read_bytes(self.store.child(directory, MANIFEST_FILE))
            manifest = PartitionManifest.from_json(manifest_bytes, f"moved {partition}", partition)
        except (FileNotFoundError, ShuffleError) as error:
            logger.warning(
                "ignoring moved %s: its manifest here is unreadable: %s", partition, error
            )
            return
        self._committed[partition] = CommittedPartition.of(
            manifest.statistics, 0, self._application_of(directory), on_tier=True
        )

    def _application_of(self, directory: str) -> str:
        """The application a partition found at a restart was committed for ("": none)."""
        try:
            named = self.store.read_bytes(self.store.child(directory, APPLICATION_FILE)).decode()
            return validate_id(named, "application id")
        except (FileNotFoundError, UnicodeDecodeError, ShuffleError):
            return ""

    def _forget_cut_off_move(self, partition: ResultPartitionID, directory: str) -> None:
        """A copy to the tier cut off by a restart: the partition is still here; what reached
        the tier goes."""
        if self.tier is not None:
            self.tier.delete_tree(partition_directory(self.tier, partition), empty_parents=2)
        self.store.delete_tree(self.store.child(directory, MOVING_FILE))

    # --- what the coordinator and the metrics see ---------------------------------------------

    @property
    def buffered_bytes(self) -> int:
        return self._budget.used

    @property
    def partition_count(self) -> int:
        return len(self._committed)

    @property
    def stored_bytes(self) -> int:
        """Bytes of committed partitions on the worker's own store (moved ones count 0)."""
        with self._lock:
            return sum(c.stored_bytes for c in self._committed.values())

    def watch_commits(self) -> CommitWatch:
        """Commits from now on, for one coordinator's heartbeats."""
        watch = CommitWatch(_WATCHED_COMMITS)
        with self._lock:
            self._commit_watches.append(watch)
        return watch

    def committed_partitions(self) -> list[ResultPartitionID]:
        with self._lock:
            return list(self._committed)

    def partitions_on_tier(self) -> list[ResultPartitionID]:
        with self._lock:
            return [p for p, committed in self._committed.items() if committed.on_tier]

    def load(self) -> pb.WorkerLoad:
        with self._lock:
            return pb.WorkerLoad(
                stored_bytes=sum(c.stored_bytes for c in self._committed.values()),
                partitions=len(self._committed),
                buffered_bytes=self._budget.used,
                decommissioning=self.draining,
                store_free_bytes=self.store.free_bytes() or 0,
                partitions_on_tier=sum(c.on_tier for c in self._committed.values()),
                application_bytes=self._held,
            )

    def owner(self, partition: ResultPartitionID) -> str | None:
        """The application ``partition`` is pushed or committed for ("": none named), or None
        when it is not here."""
        with self._lock:
            upload = self._uploads.get(partition)
            if upload is not None:
                return upload.application_id
            committed = self._committed.get(partition)
            return None if committed is None else committed.application_id

    def committed(self, partition: ResultPartitionID) -> CommittedPartition | None:
        """The partition if it is committed here, else None; one deleted behind the worker's
        back (disk wiped, operator) is forgotten: it is lost. Its statistics stay compressed
        until asked for (a status check of thousands of partitions wants none)."""
        with self._lock:
            committed = self._committed.get(partition)
        if committed is None:
            return None
        manifest = self.store.child(partition_directory(self.store, partition), MANIFEST_FILE)
        if not self.store.exists(manifest):
            with self._lock:
                if self._committed.get(partition) is committed:
                    del self._committed[partition]
                    self._count(committed.application_id, -committed.stored_bytes)
            return None
        return committed

    # --- taking new partitions ----------------------------------------------------------------

    def drain(self) -> None:
        """Take no new partitions, for good (SIGTERM); committed ones are still served."""
        self._shutting_down = True

    @property
    def draining(self) -> bool:
        """Taking no new partitions: shutting down (:meth:`drain`), or decommissioning."""
        return self._shutting_down or self._decommissioning

    def decommission(self, *, cancel: bool, asked_by: str) -> int:
        """Take no new partitions (committed ones are still served, and move to the tier store
        if there is one), or with ``cancel`` take them again, unless shutting down. Returns the
        partitions still held here (not moved to the tier). ``asked_by``: who, for the log."""
        if not cancel:
            self._decommissioning = True
            logger.info("decommissioning: no new partitions (asked by %s)", asked_by)
        elif self._shutting_down:
            raise ShuffleServiceClosedError("the worker is shutting down: it stays drained")
        else:
            self._decommissioning = False
            logger.info(
                "decommission cancelled: taking new partitions again (asked by %s)", asked_by
            )
        with self._lock:
            return sum(not committed.on_tier for committed in self._committed.values())

    def wait_for_pushes(self, deadline: float) -> None:
        """Until ``deadline`` (``time.monotonic()``), wait for the partitions being pushed now
        to be committed or released: their commit is a call of its own, after the stream."""
        with self._lock:
            pushing = {p: u for p, u in self._uploads.items() if u.streams}
        while pushing and time.monotonic() < deadline:
            time.sleep(0.05)
            with self._lock:
                pushing = {p: u for p, u in pushing.items() if self._uploads.get(p) is u}

    # --- pushes and commits -------------------------------------------------------------------

    def begin_push(self, partition: ResultPartitionID, application_id: str = "") -> Upload | None:
        """The upload a push stream of ``partition`` for ``application_id`` writes to (a
        retried push gets the one it left: its sequence numbers drop what arrived), or None when
        the partition is committed already (all it carries is a duplicate). Pair with
        :meth:`end_push`."""
        if application_id:
            validate_id(application_id, "application id")
        with self._lock:
            existing = self._uploads.get(partition)
            if existing is not None:
                if existing.application_id != application_id:
                    raise InvalidIdentifierError(
                        f"push of {partition} for application {application_id!r}: it is being"
                        f" pushed for {existing.application_id!r}"
                    )
                existing.streams += 1
                return existing
            if partition in self._committed:
                return None
            if self.draining:
                raise UnavailableError("worker is draining: it takes no new partitions")
            upload = Upload(
                StoreSink(self.store, partition),
                application_id=application_id,
                streams=1,
                last_active=self._clock(),
            )
            self._uploads[partition] = upload
            return upload

    def append(self, upload: Upload, sequence: int, data: memoryview) -> bool:
        """Write one message of a push within the memory budget and its application's quota;
        False for a duplicate. A storage error (a full or failing disk) or the quota deletes
        what arrived of the partition."""
        upload.last_active = self._clock()
        with self._budget.reserve(len(data)):
            try:
                return upload.append(sequence, data, functools.partial(self._charge, upload))
            except (StorageError, QuotaExceededError):
                # What it charged goes with it.
                self.release([upload.sink.partition])
                raise

    def _charge(self, upload: Upload, size: int) -> None:
        """Count ``size`` more bytes against the upload's application; QuotaExceededError if
        that takes it past its quota (nothing counted)."""
        with self._lock:
            if upload.forgotten:
                return  # released meanwhile: its bytes were given back
            self._add_within_quota(
                upload.application_id,
                size,
                f"the push of {upload.sink.partition} is refused and what arrived of it deleted",
            )
            upload.charged += size

    def _add_within_quota(self, application: str, size: int, refused: str) -> None:
        """Count ``size`` more bytes against ``application`` (under the lock); else, where that
        takes it past its quota, QuotaExceededError saying what is ``refused``."""
        held = self._held.get(application, 0) + size
        if 0 < self._application_quota < held:
            raise QuotaExceededError(
                f"application {application or '(unnamed)'} would hold {held} bytes on this"
                f" worker, past its quota of {self._application_quota}: {refused}"
            )
        self._count(application, size)

    def held_bytes(self) -> dict[str, int]:
        """Bytes each application holds here, pushed and committed ("": unnamed)."""
        with self._lock:
            return dict(self._held)

    def end_push(self, upload: Upload) -> None:
        with self._lock:
            upload.streams -= 1
            upload.last_active = self._clock()

    def commit(
        self, partition: ResultPartitionID, application_id: str, index: bytes, manifest: bytes
    ) -> None:
        """Commit what was pushed of ``partition`` with its index and manifest (a retried commit
        of a committed partition is a no-op). Refused, the pushed bytes stay for a commit that
        agrees with them."""
        if application_id:
            validate_id(application_id, "application id")
        # A release of the same partition waits, or is waited for: never half of each.
        with self._partition_lock(partition):
            with self._lock:
                if partition in self._committed:
                    return
                upload = self._uploads.get(partition)
            parsed = PartitionManifest.from_json(manifest, f"commit of {partition}", partition)
            if upload is None and parsed.data_bytes:
                raise PartitionNotFoundError(
                    f"commit of {partition}: no data of it is here (never pushed, or released)",
                    partition,
                )
            if upload is not None and upload.application_id not in ("", application_id):
                raise PermissionDeniedError(
                    f"commit of {partition} for application {application_id}: it was pushed"
                    f" for application {upload.application_id}"
                )
            check_commit(parsed, index, 0 if upload is None else upload.size, partition)
            sink = StoreSink(self.store, partition) if upload is None else upload.sink
            try:
                if upload is not None:
                    upload.close()
                self._write_application(partition, application_id)
                sink.commit(index, manifest)
                # Fetches take layouts from a cache that does not look at the files again: a
                # partition deleted under this worker and pushed anew must not meet its old one.
                PartitionFileReader.forget(self.store, partition)
            except StorageError:
                self._forget(partition)  # a full disk gets its space back
                raise
            with self._lock:
                self._uploads.pop(partition, None)
                if upload is not None:
                    self._drop_charges(upload)
                self._record_commit(partition, application_id, parsed.statistics, parsed.data_bytes)

    def _write_application(self, partition: ResultPartitionID, application_id: str) -> None:
        """Name the application beside the partition's manifest, before it (the commit
        point): a restarted worker reads it back."""
        if application_id:
            directory = partition_directory(self.store, partition)
            # Before the manifest (the commit point): no atomic write needed.
            self.store.put(self.store.child(directory, APPLICATION_FILE), application_id.encode())

    def _record_commit(
        self,
        partition: ResultPartitionID,
        application_id: str,
        statistics: PartitionStatistics,
        data_bytes: int,
    ) -> None:
        """``partition`` is committed on the store now (under the lock)."""
        self._count(application_id, data_bytes)
        self._committed[partition] = CommittedPartition.of(statistics, data_bytes, application_id)
        for watch in self._commit_watches:
            watch.add(Commit(partition, application_id))
        logger.debug(
            "committed %s: %d bytes for application %r", partition, data_bytes, application_id
        )

    def merge(
        self,
        merged: ResultPartitionID,
        application_id: str,
        sources: Sequence[ResultPartitionID],
        subpartitions: int,
    ) -> PartitionStatistics:
        """Write and commit ``merged`` from ``sources``, committed partitions of
        ``application_id`` held here (see :func:`merge_partitions`); its statistics. A retry
        of a committed merge returns them and writes nothing. A source missing, another
        application's, or corrupt, the quota, or a full disk fail it, nothing kept."""
        if application_id:
            validate_id(application_id, "application id")
        if len(set(sources)) != len(sources) or merged in sources:
            raise InvalidIdentifierError(f"merge of {merged}: its sources repeat, or name it")
        if len(sources) > MAX_MERGE_SOURCES:
            raise DataTooLargeError(
                f"merge of {merged}: {len(sources)} sources, over {MAX_MERGE_SOURCES}"
            )
        with self._partition_lock(merged):
            with self._lock:
                done = self._committed.get(merged)
                if done is None and (self.draining or merged in self._uploads):
                    raise UnavailableError(f"merge of {merged}: the worker takes no new partition")
            if done is not None:
                if done.application_id != application_id:
                    raise PermissionDeniedError(f"merge of {merged}: it is another application's")
                return done.statistics()
            held = sum(
                self._merge_source(source, application_id).stored_bytes for source in sources
            )
            with self._lock:
                self._add_within_quota(application_id, held, f"the merge into {merged} is refused")
            try:
                self._write_application(merged, application_id)
                with self._budget.reserve(MERGE_PASS_BYTES):
                    written = merge_partitions(
                        [(self._store_of(source), source) for source in sources],
                        self.store,
                        merged,
                        subpartitions=subpartitions,
                        pass_bytes=MERGE_PASS_BYTES,
                    )
            except BaseException:
                self._forget(merged)
                raise
            finally:
                with self._lock:
                    self._count(application_id, -held)
            with self._lock:
                self._record_commit(merged, application_id, written.statistics, written.data_bytes)
            return written.statistics

    def _merge_source(self, source: ResultPartitionID, application_id: str) -> CommittedPartition:
        committed = self.committed(source)
        if committed is None:
            raise PartitionNotFoundError(f"merge source {source} is not committed here", source)
        if committed.application_id != application_id:
            raise PermissionDeniedError(
                f"merge source {source} is not application {application_id!r}'s"
            )
        return committed

    def open_reader(
        self, partition: ResultPartitionID, subpartitions: SubpartitionRange
    ) -> PartitionFileReader:
        """A reader of a committed partition, for ``subpartitions`` of it (on the tier store,
        if it was moved there)."""
        store = self._store_of(partition)
        try:
            reader = PartitionFileReader(store, partition, Layouts.READ)
        except PartitionNotFoundError:
            # Moved since it was looked up (its files here went as the reader opened them);
            # else not here at all, and asked once.
            moved = self._store_of(partition)
            if moved is store:
                raise
            reader = PartitionFileReader(moved, partition, Layouts.READ)
        if subpartitions.end >= reader.manifest.number_of_subpartitions:
            raise InvalidIdentifierError(
                f"subpartitions {subpartitions.start}..{subpartitions.end} out of range:"
                f" {partition} has {reader.manifest.number_of_subpartitions}"
            )
        return reader

    def _store_of(self, partition: ResultPartitionID) -> Store:
        with self._lock:
            committed = self._committed.get(partition)
        if committed is not None and committed.on_tier and self.tier is not None:
            return self.tier
        return self.store

    # --- the tier store -------------------------------------------------------------------------

    def partitions_to_move(self, high_water: int, low_water: int) -> list[ResultPartitionID]:
        """What to move to the tier now: every committed partition still here while
        decommissioning; else, past ``high_water`` stored bytes (0: never), the oldest until
        ``low_water`` would be left."""
        if self.tier is None:
            return []
        with self._lock:
            here = [(p, c.stored_bytes) for p, c in self._committed.items() if not c.on_tier]
        if self._decommissioning:
            return [partition for partition, _ in here]
        stored = sum(size for _, size in here)
        if not high_water or stored <= high_water:
            return []
        chosen = []
        for partition, size in here:  # oldest first: commits are kept in their order
            if stored <= low_water:
                break
            chosen.append(partition)
            stored -= size
        return chosen

    def move_to_tier(self, partition: ResultPartitionID) -> int:
        """Move a committed partition's data to the tier store; returns its bytes moved (0:
        not here, moved already, or released while it was copied)."""
        tier = self.tier
        assert tier is not None, "moves need a tier store"
        with self._lock:
            committed = self._committed.get(partition)
        if committed is None or committed.on_tier:
            return 0
        directory = partition_directory(self.store, partition)
        moving = self.store.child(directory, MOVING_FILE)
        self.store.put_atomic(moving, b"")
        try:
            # Outside the partition's lock: a long copy holds up no commit or release.
            copy_partition(self.store, tier, partition)
        except BaseException:
            self.store.delete_tree(moving)
            raise
        with self._partition_lock(partition):
            with self._lock:
                released = self._committed.get(partition) is not committed
            if released:  # its release deleted what was here, not what the copy made since
                tier.delete_tree(partition_directory(tier, partition), empty_parents=2)
                return 0
            self.store.put_atomic(self.store.child(directory, MOVED_FILE), tier.url.encode())
            with self._lock:
                self._committed[partition] = dataclasses.replace(
                    committed, stored_bytes=0, on_tier=True
                )
                self._count(committed.application_id, -committed.stored_bytes)
                for watch in self._commit_watches:
                    watch.add(Commit(partition, committed.application_id, on_tier=True))
            # Fetches that opened it here keep their open files; new ones go to the tier.
            PartitionFileReader.forget(self.store, partition)
            for name in (DATA_FILE, INDEX_FILE, MOVING_FILE):
                self.store.delete_tree(self.store.child(directory, name))
        return committed.stored_bytes

    # --- releases -----------------------------------------------------------------------------

    def reap_uploads(self, idle_timeout: float) -> int:
        """Delete uploads no stream has carried for ``idle_timeout`` seconds (their producers
        are gone: a retried task pushes a new attempt); returns how many."""
        now = self._clock()
        with self._lock:
            abandoned = [
                partition
                for partition, upload in self._uploads.items()
                if not upload.streams and now - upload.last_active > idle_timeout
            ]
        if abandoned:
            logger.info("deleting %d uploads abandoned for %s s", len(abandoned), idle_timeout)
            self.release(abandoned)
        return len(abandoned)

    def release(self, partitions: list[ResultPartitionID]) -> int:
        """Drop the partitions and delete their files; returns how many were here."""
        released = 0
        for partition in partitions:
            with self._partition_lock(partition):
                was_here = self._forget(partition)
            released += was_here
            logger.debug("released %s%s", partition, "" if was_here else " (not here)")
        return released

    def _drop_charges(self, upload: Upload) -> None:
        """The upload is gone (committed, or released): its bytes count no more, nor will any
        message still under way (under the lock)."""
        upload.forgotten = True
        self._count(upload.application_id, -upload.charged)

    def _count(self, application: str, size: int) -> None:
        """Add ``size`` to what ``application`` holds (under the lock)."""
        held = self._held.get(application, 0) + size
        if held:
            self._held[application] = held
        else:
            self._held.pop(application, None)

    def _partition_lock(self, partition: ResultPartitionID) -> threading.Lock:
        return self._partition_locks[hash(partition) % len(self._partition_locks)]

    def _forget(self, partition: ResultPartitionID) -> int:
        """Drop the partition and delete its files (under its partition lock); 1 if it was
        here."""
        with self._lock:
            upload = self._uploads.pop(partition, None)
            committed = self._committed.pop(partition, None)
            if upload is not None:
                self._drop_charges(upload)
            if committed is not None:
                self._count(committed.application_id, -committed.stored_bytes)
        if upload is not None:
            upload.close()
        PartitionFileReader.forget(self.store, partition)
        directory = partition_directory(self.store, partition)
        # Being copied to the tier: what the copy made there goes too.
        moving = (
            committed is not None
            and self.tier is not None
            and self.store.exists(self.store.child(directory, MOVING_FILE))
        )
        self.store.delete_tree(directory, empty_parents=2)
        if committed is not None and (committed.on_tier or moving) and self.tier is not None:
            PartitionFileReader.forget(self.tier, partition)
            self.tier.delete_tree(partition_directory(self.tier, partition), empty_parents=2)
        return int(upload is not None or committed is not None)
