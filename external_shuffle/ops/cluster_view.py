"""What an operator sees of a cluster: its workers (state, load, disk) and applications. The
same view feeds `pyshuffle admin` (from a coordinator's answers) and the coordinator's status
page (from its own state)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

from external_shuffle.wire.messages import WorkerAddress, identity_from_pb
from external_shuffle.wire.stubs import pb
from shuffle_api import ApplicationIdentity

__all__ = ["ApplicationRow", "ClusterView", "WorkerRow", "human_bytes", "merged_applications"]


def human_bytes(count: int) -> str:
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


@dataclass(frozen=True, slots=True)
class WorkerRow:
    worker_id: str
    target: str
    state: str  # alive, decommissioning or dead
    seconds_since_heartbeat: float
    partitions: int
    stored_bytes: int
    free_bytes: int  # 0: not known (a store that is not a local file system)

    @classmethod
    def of(
        cls, address: WorkerAddress, load: pb.WorkerLoad, alive: bool, seconds: float
    ) -> WorkerRow:
        state = "dead" if not alive else "decommissioning" if load.decommissioning else "alive"
        return cls(
            address.worker_id,
            address.target,
            state,
            seconds,
            load.partitions,
            load.stored_bytes,
            load.store_free_bytes,
        )


@dataclass(frozen=True, slots=True)
class ApplicationRow:
    application_id: str
    seconds_since_heartbeat: float
    partitions: int
    engine_id: str = ""  # who it is, as its engine (Spark) names it; "" if its driver did not say
    name: str = ""
    user: str = ""
    stored_bytes: int = 0  # on the live workers, copies included

    @classmethod
    def of(
        cls,
        application_id: str,
        seconds_since_heartbeat: float,
        partitions: int,
        identity: ApplicationIdentity,
        stored_bytes: int,
    ) -> ApplicationRow:
        return cls(
            application_id,
            seconds_since_heartbeat,
            partitions,
            identity.engine_id,
            identity.name,
            identity.user,
            stored_bytes,
        )


@dataclass(frozen=True, slots=True)
class ClusterView:
    workers: tuple[WorkerRow, ...]
    applications: tuple[ApplicationRow, ...]

    WORKER_COLUMNS = ("worker", "address", "state", "heard", "partitions", "stored", "free")
    APPLICATION_COLUMNS = (
        "application",
        "engine id",
        "name",
        "user",
        "heard",
        "partitions",
        "stored",
    )

    def worker_table(self) -> list[tuple[str, ...]]:
        return [
            (
                row.worker_id,
                row.target,
                row.state,
                f"{row.seconds_since_heartbeat:.0f} s ago",
                f"{row.partitions:,}",
                human_bytes(row.stored_bytes),
                human_bytes(row.free_bytes) if row.free_bytes else "-",
            )
            for row in sorted(self.workers, key=lambda row: row.worker_id)
        ]

    def application_table(self) -> list[tuple[str, ...]]:
        return [
            (
                row.application_id,
                row.engine_id or "-",
                row.name or "-",
                row.user or "-",
                f"{row.seconds_since_heartbeat:.0f} s ago",
                f"{row.partitions:,}",
                human_bytes(row.stored_bytes),
            )
            for row in sorted(self.applications, key=lambda row: row.application_id)
        ]

    def worker_records(self) -> list[dict[str, object]]:
        """The workers as JSON objects, in the table's order: plain numbers, and ``free_bytes``
        null where it is not known."""
        return [
            {**asdict(row), "free_bytes": row.free_bytes or None}
            for row in sorted(self.workers, key=lambda row: row.worker_id)
        ]

    def application_records(self) -> list[dict[str, object]]:
        """The applications as JSON objects, in the table's order."""
        return [
            asdict(row) for row in sorted(self.applications, key=lambda row: row.application_id)
        ]


def merged_applications(
    answers: Iterable[pb.ListApplicationsResponse],
) -> tuple[ApplicationRow, ...]:
    """Applications as several coordinators see them: each heard most recently anywhere, with
    the most partitions and bytes any of them counts, and who it is where any of them was
    told."""
    rows: dict[str, ApplicationRow] = {}
    for answer in answers:
        for entry in answer.applications:
            seen = rows.get(entry.application_id)
            identity = identity_from_pb(entry.identity)
            if seen is not None and identity == ApplicationIdentity():
                identity = ApplicationIdentity(seen.engine_id, seen.name, seen.user)
            rows[entry.application_id] = ApplicationRow.of(
                entry.application_id,
                min(entry.seconds_since_heartbeat, seen.seconds_since_heartbeat)
                if seen
                else entry.seconds_since_heartbeat,
                max(entry.partitions, seen.partitions) if seen else entry.partitions,
                identity,
                max(entry.stored_bytes, seen.stored_bytes) if seen else entry.stored_bytes,
            )
    return tuple(rows.values())
