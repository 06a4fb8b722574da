"""What one chaos run does, drawn from its seed alone, and the summary of many runs.

Spark-free: a run's plan is a value (the same seed gives the same plan on any machine), and the
summary adds up outcomes; ``runner`` carries a plan out on Spark.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = [
    "CONNECTION_FAULT",
    "DAEMON_FAULTS",
    "EXECUTOR_FAULTS",
    "OPERATIONS",
    "STORE_FAULT",
    "ChaosSummary",
    "FaultPlan",
    "FaultRecord",
    "RunOutcome",
    "RunPlan",
    "fault_kinds",
    "plan_run",
]

OPERATIONS: Final = ("repartition", "group_apply", "join", "sort")
EXECUTOR_FAULTS: Final = ("executor-kill", "executor-term", "executor-stall", "python-worker-kill")
"""Faults of a Spark application's processes: SIGKILL or SIGTERM of an executor's JVM (Spark's
standalone worker starts another), an executor's JVM stopped (SIGSTOP) for a while, as in a
long pause, SIGKILL of a Python worker running a task."""
DAEMON_FAULTS: Final = ("daemon-kill", "daemon-term", "daemon-restart", "daemon-stall")
"""Faults of a service's daemons (a worker or a coordinator): down by SIGKILL or SIGTERM and
back after a supervisor's delay, SIGKILL and back at once, or stopped (SIGSTOP) for a while:
its connections stall, and past the coordinator's worker timeout it is taken for dead."""
CONNECTION_FAULT: Final = "connection-drop"
"""Every TCP connection to a daemon's ports aborted at once, both ends (where the host lets a
process abort sockets: ``ss -K``)."""
STORE_FAULT: Final = "store-full"
"""A store's filesystem filled to the last byte for a while (where stores sit on small
filesystems of their own): writes fail with ENOSPC, as on a full disk."""
_MAX_FAULTS: Final = 3
# A fault lands within this many seconds of the job's start: the jobs below last 2-15 s on
# two cores, so faults fall before, during and after each stage.
_FAULT_WINDOW_SECONDS: Final = 6.0
# How long a fault lasts, by kind: a supervisor's delay before a daemon is started again; a
# stop long enough, at its end, to outlast the chaos deployment's 3 s worker timeout.
_DURATIONS: Final = {
    "daemon-kill": (0.5, 3.0),
    "daemon-term": (0.5, 3.0),
    "daemon-stall": (0.5, 6.0),
    "executor-stall": (0.5, 6.0),
    STORE_FAULT: (0.5, 4.0),
}


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """One fault: its kind, when (seconds after the job starts), whom among its kind's
    targets (an index, taken modulo the targets there are then) and, for a fault that lasts,
    how long (until a supervisor starts a daemon again, a stopped process goes on, a full
    store is freed)."""

    kind: str
    at: float
    target: int
    down_for: float = 0.0


@dataclass(frozen=True, slots=True)
class RunPlan:
    """One randomized job on one service, with its faults."""

    seed: int
    service: str
    operation: str
    rows: int
    map_tasks: int
    reducers: int
    replicas: int
    straggler: bool
    """One map task sleeps: with speculation on, Spark starts a copy of it."""
    faults: tuple[FaultPlan, ...]


def fault_kinds(
    has_daemons: bool, *, connections_droppable: bool, stores_fillable: bool
) -> tuple[str, ...]:
    """The faults a run on a service may draw: daemon ones only where it has daemons, and
    those the host can carry out."""
    kinds = EXECUTOR_FAULTS + ((STORE_FAULT,) if stores_fillable else ())
    if has_daemons:
        kinds += DAEMON_FAULTS + ((CONNECTION_FAULT,) if connections_droppable else ())
    return kinds


def plan_run(seed: int, kinds_by_service: Mapping[str, Sequence[str]]) -> RunPlan:
    """The plan ``seed`` gives: a service of ``kinds_by_service``, an operation, sizes and 1-3
    faults of the kinds that service may draw (:func:`fault_kinds`)."""
    rng = random.Random(seed)
    service = rng.choice(list(kinds_by_service))
    kinds = tuple(kinds_by_service[service])
    has_daemons = any(kind in DAEMON_FAULTS for kind in kinds)
    faults = []
    for _ in range(rng.randint(1, _MAX_FAULTS)):
        kind = rng.choice(kinds)
        down_for = rng.uniform(*_DURATIONS[kind]) if kind in _DURATIONS else 0.0
        faults.append(
            FaultPlan(
                kind,
                round(rng.uniform(0.0, _FAULT_WINDOW_SECONDS), 2),
                rng.randrange(1 << 16),
                round(down_for, 2),
            )
        )
    return RunPlan(
        seed=seed,
        service=service,
        operation=rng.choice(OPERATIONS),
        rows=rng.choice((2_000, 20_000, 100_000)),
        map_tasks=rng.randint(2, 12),
        reducers=rng.randint(1, 16),
        replicas=rng.choice((1, 2)) if has_daemons else 1,
        straggler=rng.random() < 0.3,
        faults=tuple(sorted(faults, key=lambda fault: fault.at)),
    )


@dataclass(frozen=True, slots=True)
class FaultRecord:
    """A fault as it happened: its kind, the phase the job was in, whom it hit ("" if it
    found no target, a Python worker between tasks say)."""

    kind: str
    phase: str
    target: str


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """What a run found. ``result``: "exact", "wrong" (rows differ from Spark's), or
    "failed: <error>" (the job failed, and so did the user's remedy, ``recover``)."""

    plan: RunPlan
    result: str
    seconds: float
    files_left: int
    crashed_daemons: tuple[str, ...]
    faults: tuple[FaultRecord, ...]

    @property
    def sound(self) -> bool:
        return self.result == "exact" and not self.files_left and not self.crashed_daemons


@dataclass
class ChaosSummary:
    """The runs so far, as benchmarks/results/chaos.json keeps them."""

    runs: int = 0
    first_seed: int | None = None
    last_seed: int | None = None
    exact: int = 0
    wrong_results: int = 0
    failed_runs: int = 0
    files_left: int = 0
    daemon_crashes: int = 0
    seconds: float = 0.0
    faults: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    by_service: Counter[str] = field(default_factory=Counter)
    failures: list[dict[str, Any]] = field(default_factory=list)

    def add(self, outcome: RunOutcome) -> None:
        self.runs += 1
        if self.first_seed is None:
            self.first_seed = outcome.plan.seed
        self.last_seed = outcome.plan.seed
        self.seconds += outcome.seconds
        self.by_service[outcome.plan.service] += 1
        self.exact += outcome.result == "exact"
        self.wrong_results += outcome.result == "wrong"
        self.failed_runs += outcome.result.startswith("failed")
        self.files_left += outcome.files_left
        self.daemon_crashes += len(outcome.crashed_daemons)
        for fault in outcome.faults:
            self.faults[fault.kind][fault.phase if fault.target else "no target"] += 1
        if not outcome.sound:
            self.failures.append(
                {
                    "seed": outcome.plan.seed,
                    "service": outcome.plan.service,
                    "operation": outcome.plan.operation,
                    "result": outcome.result,
                    "files_left": outcome.files_left,
                    "crashed_daemons": list(outcome.crashed_daemons),
                    "faults": [
                        f"{fault.kind} {fault.target or '(none)'} during {fault.phase}"
                        for fault in outcome.faults
                    ],
                }
            )

    def to_json(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "first_seed": self.first_seed,
            "last_seed": self.last_seed,
            "exact": self.exact,
            "wrong_results": self.wrong_results,
            "failed_runs": self.failed_runs,
            "files_left": self.files_left,
            "daemon_crashes": self.daemon_crashes,
            "seconds": round(self.seconds, 1),
            "runs_by_service": dict(self.by_service),
            "faults": {kind: dict(phases) for kind, phases in sorted(self.faults.items())},
            "failure_seeds": [failure["seed"] for failure in self.failures],
            "failures": self.failures,
        }

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> ChaosSummary:
        """The summary :meth:`to_json` gave, to go on adding runs to."""
        summary = cls(
            runs=document["runs"],
            first_seed=document["first_seed"],
            last_seed=document["last_seed"],
            exact=document["exact"],
            wrong_results=document["wrong_results"],
            failed_runs=document["failed_runs"],
            files_left=document["files_left"],
            daemon_crashes=document["daemon_crashes"],
            seconds=document["seconds"],
            by_service=Counter(document["runs_by_service"]),
            failures=list(document["failures"]),
        )
        for kind, phases in document["faults"].items():
            summary.faults[kind].update(phases)
        return summary
