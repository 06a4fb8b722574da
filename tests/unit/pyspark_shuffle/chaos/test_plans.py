"""Chaos plans come from their seed alone, draw daemon faults only for a service with daemons
and only the faults the host can carry out, and the summary counts what went wrong by kind,
keeping the seeds to run again."""

from __future__ import annotations

from pyspark_shuffle.chaos.plans import (
    CONNECTION_FAULT,
    DAEMON_FAULTS,
    EXECUTOR_FAULTS,
    OPERATIONS,
    STORE_FAULT,
    ChaosSummary,
    FaultRecord,
    RunOutcome,
    fault_kinds,
    plan_run,
)

SERVICES = ("netty_like", "external_shuffle")
KINDS = {
    "netty_like": fault_kinds(False, connections_droppable=True, stores_fillable=True),
    "external_shuffle": fault_kinds(True, connections_droppable=True, stores_fillable=True),
}
LASTING = {"daemon-kill", "daemon-term", "daemon-stall", "executor-stall", STORE_FAULT}


def test_a_seed_gives_the_same_plan_every_time_and_seeds_differ() -> None:
    plans = [plan_run(seed, KINDS) for seed in range(200)]
    assert plans == [plan_run(seed, KINDS) for seed in range(200)]
    assert len(set(plans)) == 200
    assert {plan.service for plan in plans} == set(SERVICES)
    assert {plan.operation for plan in plans} == set(OPERATIONS)
    assert any(plan.straggler for plan in plans) and not all(plan.straggler for plan in plans)


def test_each_plan_has_one_to_three_faults_in_time_order_daemon_ones_where_daemons_run() -> None:
    kinds: set[str] = set()
    for seed in range(300):
        plan = plan_run(seed, KINDS)
        assert 1 <= len(plan.faults) <= 3
        assert [fault.at for fault in plan.faults] == sorted(fault.at for fault in plan.faults)
        for fault in plan.faults:
            kinds.add(fault.kind)
            if plan.service == "netty_like":
                assert fault.kind in (*EXECUTOR_FAULTS, STORE_FAULT)
            if fault.kind in ("daemon-kill", "daemon-term"):
                assert 0.5 <= fault.down_for <= 3.0  # a supervisor brings it back
            elif fault.kind in LASTING:
                assert 0.5 <= fault.down_for <= 6.0
            else:
                assert fault.down_for == 0.0
        assert plan.replicas == 1 or plan.service == "external_shuffle"
    assert kinds == {*EXECUTOR_FAULTS, *DAEMON_FAULTS, CONNECTION_FAULT, STORE_FAULT}


def test_a_host_that_cannot_drop_connections_or_fill_stores_draws_neither() -> None:
    plain = {
        service: fault_kinds(
            service == "external_shuffle", connections_droppable=False, stores_fillable=False
        )
        for service in SERVICES
    }
    drawn = {fault.kind for seed in range(300) for fault in plan_run(seed, plain).faults}
    assert drawn == {*EXECUTOR_FAULTS, *DAEMON_FAULTS}


def test_the_summary_counts_each_kind_of_trouble_and_keeps_the_seeds() -> None:
    summary = ChaosSummary()
    faults = (FaultRecord("executor-kill", "map", "executor 1"),)
    outcomes = [
        RunOutcome(plan_run(1, KINDS), "exact", 5.0, 0, (), faults),
        RunOutcome(plan_run(2, KINDS), "wrong", 6.0, 0, (), faults),
        RunOutcome(plan_run(3, KINDS), "failed: TransportError: x", 7.0, 2, (), ()),
        RunOutcome(
            plan_run(4, KINDS),
            "exact",
            8.0,
            0,
            ("worker-1",),
            (FaultRecord("python-worker-kill", "reduce", ""),),
        ),
    ]
    for outcome in outcomes:
        summary.add(outcome)
    result = summary.to_json()
    assert (result["runs"], result["exact"], result["wrong_results"]) == (4, 2, 1)
    assert (result["failed_runs"], result["files_left"], result["daemon_crashes"]) == (1, 2, 1)
    assert result["seconds"] == 26.0
    assert result["failure_seeds"] == [2, 3, 4]
    assert result["faults"] == {
        "executor-kill": {"map": 2},
        "python-worker-kill": {"no target": 1},
    }
    assert [outcome.sound for outcome in outcomes] == [True, False, False, False]


def test_a_summary_taken_up_again_goes_on_counting_as_if_never_stopped() -> None:
    faults = (FaultRecord("daemon-stall", "map", "worker-0"),)
    outcomes = [
        RunOutcome(plan_run(seed, KINDS), result, 3.0, left, (), faults)
        for seed, result, left in (
            (7, "exact", 0),
            (8, "wrong", 0),
            (9, "exact", 1),
            (10, "exact", 0),
        )
    ]
    whole, first_half = ChaosSummary(), ChaosSummary()
    for outcome in outcomes:
        whole.add(outcome)
    for outcome in outcomes[:2]:
        first_half.add(outcome)
    taken_up = ChaosSummary.from_json(first_half.to_json())
    assert taken_up.to_json() == first_half.to_json()
    for outcome in outcomes[2:]:
        taken_up.add(outcome)
    assert taken_up.to_json() == whole.to_json()
    assert (whole.first_seed, whole.last_seed) == (7, 10)
