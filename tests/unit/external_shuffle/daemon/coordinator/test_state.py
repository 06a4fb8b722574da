"""The coordinator's state in-process, with a clock the tests move: restarts (a new state that
learns from workers and drivers), expiry, loss, and deletions owed to workers."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from external_shuffle.daemon.coordinator.state import CoordinatorState
from external_shuffle.wire.errors import NotRegisteredError
from external_shuffle.wire.messages import Commit, WorkerAddress, key_of
from external_shuffle.wire.stubs import pb
from scheduling.placement import new_placement_strategy
from shuffle_api import (
    ApplicationIdentity,
    IntermediateResultPartitionID,
    PermissionDeniedError,
    ResultPartitionID,
)

APPLICATION_TIMEOUT = 30.0


WORKER_TIMEOUT = 10.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def new_state(clock: Clock) -> CoordinatorState:
    return CoordinatorState(
        placement=new_placement_strategy("balanced", config_key="placement"),
        worker_timeout=WORKER_TIMEOUT,
        application_timeout=APPLICATION_TIMEOUT,
        clock=clock,
    )


def worker(index: int) -> WorkerAddress:
    return WorkerAddress(f"worker-{index}", "127.0.0.1", 7000 + index, f"/store/{index}", False)


def partition(index: int) -> ResultPartitionID:
    return ResultPartitionID(IntermediateResultPartitionID("result-a", index), f"attempt-{index}")


def register(
    state: CoordinatorState,
    index: int,
    *,
    application: str = "app-1",
    job: str = "job-1",
    placed_on: tuple[WorkerAddress, ...] = (),
) -> tuple[WorkerAddress, ...]:
    request = pb.RegisterPartitionRequest(
        application_id=application,
        job_id=job,
        partition=key_of(partition(index)),
        number_of_subpartitions=2,
        replicas=1,
        placed_on=[address.to_pb() for address in placed_on],
    )
    return state.register_partition(request, partition(index)).replicas


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_a_restarted_coordinator_keeps_what_workers_hold_until_the_driver_claims_it(
    clock: Clock,
) -> None:
    before = new_state(clock)
    for index in (0, 1):
        before.register_worker(worker(index), pb.WorkerLoad(), [])
    before.register_application("app-1")
    before.register_job("app-1", "job-1")
    placed = {index: register(before, index) for index in range(4)}

    # The coordinator restarts: a new state. The workers register with what they hold.
    after = new_state(clock)
    for index in (0, 1):
        held = [partition(p) for p, replicas in placed.items() if replicas[0] == worker(index)]
        assert after.register_worker(worker(index), pb.WorkerLoad(), held) == []
    assert after.partition_count() == 4
    # The driver is told it is unknown, registers again with where its partitions are.
    assert after.application_heartbeat("app-1") is None
    after.register_application("app-1")
    after.register_job("app-1", "job-1")
    for index, replicas in placed.items():
        assert register(after, index, placed_on=replicas) == replicas

    clock.now += APPLICATION_TIMEOUT * 3
    after.application_heartbeat("app-1")
    for index in (0, 1):
        after.worker_heartbeat(f"worker-{index}", pb.WorkerLoad())
    assert after.reap().count == 0, "claimed partitions of a live application are kept"
    placements, askable = after.job_partitions("app-1", "job-1")
    assert {p.partition: p.replicas for p in placements} == {
        partition(index): replicas for index, replicas in placed.items()
    }
    assert set(askable) == {"worker-0", "worker-1"}


def test_held_partitions_nobody_claims_are_deleted_after_the_application_timeout(
    clock: Clock,
) -> None:
    state = new_state(clock)
    state.register_worker(worker(0), pb.WorkerLoad(), [partition(0), partition(1)])
    clock.now += APPLICATION_TIMEOUT / 2
    state.worker_heartbeat("worker-0", pb.WorkerLoad())
    assert state.reap().count == 0
    clock.now += APPLICATION_TIMEOUT
    state.worker_heartbeat("worker-0", pb.WorkerLoad())
    releases = state.reap()
    assert releases.count == 2
    assert releases.per_worker == {worker(0): [partition(0), partition(1)]}


def test_a_partition_placed_for_a_living_application_waits_for_its_claim(clock: Clock) -> None:
    """A map stage may run longer than the application timeout: what its producers placed
    early is the application's, kept until the driver claims it at the stage's end."""
    state = new_state(clock)
    state.register_worker(worker(0), pb.WorkerLoad(), [])
    state.register_application("app-1")
    state.register_job("app-1", "job-1")
    placed = register(state, 0, application="app-1", job="")  # a producer's placement
    for _ in range(4):
        clock.now += APPLICATION_TIMEOUT / 2
        state.application_heartbeat("app-1")
        state.worker_heartbeat("worker-0", pb.WorkerLoad())
        assert state.reap().count == 0
    assert register(state, 0) == placed  # the driver's claim finds it where it was put
    assert state.partitions_per_application() == {"app-1": 1}
    assert state.unregister_application("app-1").per_worker == {worker(0): [partition(0)]}


def test_a_partition_placed_for_an_application_goes_with_it(clock: Clock) -> None:
    state = new_state(clock)
    state.register_worker(worker(0), pb.WorkerLoad(), [])
    for application in ("app-1", "app-2"):
        state.register_application(application)
        state.register_job(application, "job-1")
    register(state, 0, application="app-1", job="")
    with pytest.raises(NotRegisteredError, match="another application"):
        register(state, 0, application="app-2")
    clock.now += APPLICATION_TIMEOUT + 1
    state.worker_heartbeat("worker-0", pb.WorkerLoad())
    assert state.reap().per_worker == {worker(0): [partition(0)]}  # app-1 expired


def test_a_partition_placed_for_an_unknown_application_expires_unclaimed(clock: Clock) -> None:
    # A coordinator that restarted, or one the application never registered with.
    state = new_state(clock)
    state.register_worker(worker(0), pb.WorkerLoad(), [])
    register(state, 0, application="app-9", job="")
    clock.now += APPLICATION_TIMEOUT / 2
    state.worker_heartbeat("worker-0", pb.WorkerLoad())
    assert state.reap().count == 0
    state.register_application("app-9")  # its driver tells it in time: the owner lives
    clock.now += APPLICATION_TIMEOUT / 2 + 1
    state.worker_heartbeat("worker-0", pb.WorkerLoad())
    state.application_heartbeat("app-9")
    assert state.reap().count == 0
    state.unregister_application("app-9")
    register(state, 1, application="app-8", job="")
    clock.now += APPLICATION_TIMEOUT + 1
    state.worker_heartbeat("worker-0", pb.WorkerLoad())
    assert state.reap().per_worker == {worker(0): [partition(1)]}


def test_a_commit_after_the_workers_registration_is_learned_from_its_heartbeat(
    clock: Clock,
) -> None:
    """Restarted after placing a partition and before its commit, with its worker registered
    again: the heartbeat after the commit says where it is, and the driver's claim finds it
    there rather than placing it anew on a worker that never had it."""
    state = new_state(clock)
    full = pb.WorkerLoad(stored_bytes=10**12)  # where a new partition is placed last
    state.register_worker(worker(0), pb.WorkerLoad(), [])
    state.register_worker(worker(1), full, [])
    state.register_application("app-1")
    state.register_job("app-1", "job-1")
    assert state.worker_heartbeat("worker-1", full, [Commit(partition(0), "app-1")]) == []
    for _ in range(3):  # the application's: kept however long its map stage runs
        clock.now += APPLICATION_TIMEOUT / 2
        state.application_heartbeat("app-1")
        state.worker_heartbeat("worker-0", pb.WorkerLoad())
        state.worker_heartbeat("worker-1", full)
        assert state.reap().count == 0
    assert register(state, 0) == (worker(1),)
    assert state.release_partitions("app-1", [partition(0)]).per_worker == {
        worker(1): [partition(0)]
    }


def test_a_commit_of_what_is_released_or_placed_elsewhere_is_deleted(clock: Clock) -> None:
    state = new_state(clock)
    state.register_worker(worker(0), pb.WorkerLoad(), [])
    state.register_worker(worker(1), pb.WorkerLoad(stored_bytes=10**12), [])
    state.register_application("app-1")
    state.register_job("app-1", "job-1")
    assert register(state, 0) == (worker(0),)
    register(state, 1)
    state.release_partitions("app-1", [partition(1)])
    assert state.worker_heartbeat("worker-0", pb.WorkerLoad(), [Commit(partition(0))]) == []
    late = [Commit(partition(0), "app-1"), Commit(partition(1), "app-1")]
    assert state.worker_heartbeat("worker-1", pb.WorkerLoad(), late) == [
        partition(0),
        partition(1),
    ]
    assert state.partition_count() == 1


def test_a_commit_heard_after_its_job_or_application_ended_is_deleted_not_tracked(
    clock: Clock,
) -> None:
    """A heartbeat sent before a release and heard after it: the copy is deleted, and the
    application's end does not count it a second time."""
    state = new_state(clock)
    state.register_worker(worker(0), pb.WorkerLoad(), [])
    state.register_application("app-1")
    state.register_job("app-1", "job-1")
    register(state, 0)
    assert state.unregister_job("app-1", "job-1", keep_persistent=False).count == 1
    late = [Commit(partition(0), "app-1")]
    assert state.worker_heartbeat("worker-0", pb.WorkerLoad(), late) == [partition(0)]
    assert state.partition_count() == 0
    state.register_job("app-1", "job-2")
    register(state, 1, job="job-2")
    assert state.unregister_application("app-1").count == 1
    late = [Commit(partition(1), "app-1")]
    assert state.worker_heartbeat("worker-0", pb.WorkerLoad(), late) == [partition(1)]
    assert state.partition_count() == 0


def test_a_driver_may_tell_a_place_on_a_worker_not_registered_yet(clock: Clock) -> None:
    state = new_state(clock)
    state.register_application("app-1")
    state.register_job("app-1", "job-1")
    assert register(state, 0, placed_on=(worker(5),)) == (worker(5),)
    [placement], askable = state.job_partitions("app-1", "job-1")
    assert placement.replicas == (worker(5),)
    assert askable == {"worker-5": worker(5)}, "an announced worker is asked about its partitions"
    assert state.alive_worker_count() == 0, "and not taken for alive"
    # It registers with the partition: no deletion, the same entry.
    assert state.register_worker(worker(5), pb.WorkerLoad(), [partition(0)]) == []
    assert state.alive_worker_count() == 1
    assert state.partition_count() == 1


def test_a_worker_a_driver_names_is_awaited_for_a_worker_timeout_after_a_restart(
    clock: Clock,
) -> None:
    """After a restart, a driver may tell where its partitions are before their workers
    register again: those workers are awaited (their partitions are not lost yet) until they
    register, or for one worker timeout from the start."""
    state = new_state(clock)
    state.register_worker(worker(0), pb.WorkerLoad(), [])
    state.register_application("app-1")
    state.register_job("app-1", "job-1")
    register(state, 0, placed_on=(worker(1),))
    register(state, 1, placed_on=(worker(2),))
    assert state.awaited_workers() == {"worker-1", "worker-2"}, "registered ones are not"
    state.register_worker(worker(1), pb.WorkerLoad(), [partition(0)])
    assert state.awaited_workers() == {"worker-2"}
    state.declare_dead("worker-1", "no heartbeat")
    assert state.awaited_workers() == {"worker-2"}, "one that registered and died is not"
    clock.now += WORKER_TIMEOUT
    assert state.awaited_workers() == {"worker-2"}
    clock.now += 0.1
    assert state.awaited_workers() == set(), "a worker timeout after the start, it is dead"


def test_partitions_lost_with_a_dead_worker_are_deleted_when_it_comes_back(clock: Clock) -> None:
    state = new_state(clock)
    state.register_worker(worker(0), pb.WorkerLoad(), [])
    state.register_application("app-1")
    state.register_job("app-1", "job-1")
    register(state, 0)
    clock.now += WORKER_TIMEOUT + 1
    state.application_heartbeat("app-1")
    state.reap()
    assert state.application_heartbeat("app-1") == [("job-1", partition(0))]
    # Back with its stale copy (the job reran it elsewhere): told to delete it.
    assert state.register_worker(worker(0), pb.WorkerLoad(), [partition(0)]) == [partition(0)]
    assert state.partition_count() == 0


def test_a_release_a_dead_worker_missed_is_owed_to_it(clock: Clock) -> None:
    state = new_state(clock)
    for index in (0, 1):
        state.register_worker(worker(index), pb.WorkerLoad(), [])
    state.register_application("app-1")
    state.register_job("app-1", "job-1")
    request = pb.RegisterPartitionRequest(
        application_id="app-1", job_id="job-1", partition=key_of(partition(0)), replicas=2
    )
    assert len(state.register_partition(request, partition(0)).replicas) == 2
    clock.now += WORKER_TIMEOUT / 2
    state.worker_heartbeat("worker-1", pb.WorkerLoad())
    clock.now += WORKER_TIMEOUT / 2 + 1
    state.reap()  # worker-0 dead; worker-1 still holds the partition
    releases = state.release_partitions("app-1", [partition(0)])
    assert releases.count == 1
    assert releases.per_worker == {worker(1): [partition(0)]}
    assert state.register_worker(worker(0), pb.WorkerLoad(), [partition(0)]) == [partition(0)]


def test_an_unknown_application_or_job_is_not_registered(clock: Clock) -> None:
    state = new_state(clock)
    state.register_worker(worker(0), pb.WorkerLoad(), [])
    with pytest.raises(NotRegisteredError, match="application 'app-1' is not registered"):
        register(state, 0)
    state.register_application("app-1")
    with pytest.raises(NotRegisteredError, match="job 'job-1' is not registered"):
        register(state, 0)


def test_a_silent_application_expires_and_its_partitions_are_deleted(clock: Clock) -> None:
    state = new_state(clock)
    state.register_worker(worker(0), pb.WorkerLoad(), [])
    for application in ("app-1", "app-2"):
        state.register_application(application)
        state.register_job(application, "job-1")
    register(state, 0, application="app-1")
    register(state, 1, application="app-2")
    clock.now += APPLICATION_TIMEOUT / 2
    state.worker_heartbeat("worker-0", pb.WorkerLoad())
    state.application_heartbeat("app-2")
    clock.now += APPLICATION_TIMEOUT / 2 + 1
    state.worker_heartbeat("worker-0", pb.WorkerLoad())
    assert state.reap().per_worker == {worker(0): [partition(0)]}
    assert state.application_heartbeat("app-1") is None
    assert state.application_heartbeat("app-2") == []


def test_a_partition_released_before_its_worker_registers_is_deleted_when_it_does(
    clock: Clock,
) -> None:
    # Restarted: the driver releases by name what this coordinator does not know yet.
    state = new_state(clock)
    assert state.release_partitions("app-1", [partition(0)]).count == 0
    obsolete = state.register_worker(worker(0), pb.WorkerLoad(), [partition(0), partition(1)])
    assert obsolete == [partition(0)]
    assert state.partition_count() == 1, "what was not released is kept, unclaimed"
    # The memory of such releases lasts the application timeout.
    state.release_partitions("app-1", [partition(2)])
    clock.now += APPLICATION_TIMEOUT + 1
    state.worker_heartbeat("worker-0", pb.WorkerLoad())
    state.reap()
    assert state.register_worker(worker(1), pb.WorkerLoad(), [partition(2)]) == []


def test_a_released_partition_is_deleted_from_a_replica_that_registers_after(
    clock: Clock,
) -> None:
    state = new_state(clock)
    state.register_worker(worker(0), pb.WorkerLoad(), [partition(0)])  # one replica's worker
    releases = state.release_partitions("app-1", [partition(0)])
    assert releases.per_worker == {worker(0): [partition(0)]}
    assert state.register_worker(worker(1), pb.WorkerLoad(), [partition(0)]) == [partition(0)]


def test_an_application_heard_by_another_coordinator_does_not_expire(clock: Clock) -> None:
    here, there = new_state(clock), new_state(clock)
    for state in (here, there):
        state.register_worker(worker(0), pb.WorkerLoad(), [])
        state.register_application("app-1")
        state.register_job("app-1", "job-1")
    register(here, 0)
    clock.now += APPLICATION_TIMEOUT + 1
    there.application_heartbeat("app-1")  # the driver reaches the other coordinator only
    here.worker_heartbeat("worker-0", pb.WorkerLoad())
    assert here.silent_applications() == ["app-1"]
    here.heard_elsewhere(_ages(there))
    assert here.silent_applications() == []
    assert here.reap().count == 0
    # The driver is gone: neither keeps the other's view alive, both expire it.
    clock.now += APPLICATION_TIMEOUT + 1
    here.worker_heartbeat("worker-0", pb.WorkerLoad())
    here.heard_elsewhere(_ages(there))
    there.heard_elsewhere(_ages(here))
    assert here.reap().count == 1
    assert here.application_heartbeat("app-1") is None
    there.reap()
    assert there.application_heartbeat("app-1") is None


def _lifecycle_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    lines = [
        record.getMessage()
        for record in caplog.records
        if record.name == CoordinatorState.__module__ and record.levelno == logging.INFO
    ]
    caplog.clear()
    return lines


def test_an_application_is_logged_once_per_event_not_per_partition(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    state = new_state(Clock())
    state.register_worker(worker(0), pb.WorkerLoad(), [])
    caplog.clear()
    state.register_application("app-1")
    state.register_application("app-1")  # again, as a driver does after a restart here
    state.register_job("app-1", "job-1")
    for index in range(5):
        register(state, index)
    assert _lifecycle_lines(caplog) == ["application app-1 registered"]
    for index in range(2):  # as a driver releases: one by one
        assert state.release_partitions("app-1", [partition(index)]).count == 1
    assert _lifecycle_lines(caplog) == []
    assert state.unregister_job("app-1", "job-1", keep_persistent=False).count == 3
    assert _lifecycle_lines(caplog) == ["application app-1 ended job job-1: 3 partitions released"]
    state.unregister_application("app-1")
    assert _lifecycle_lines(caplog) == [
        "application app-1 ended: 5 partitions released here since it registered"
    ]


def test_an_expired_application_is_logged_with_the_partitions_deleted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    state = new_state(clock)
    state.register_worker(worker(0), pb.WorkerLoad(), [])
    state.register_application("app-1")
    state.register_job("app-1", "job-1")
    for index in range(3):
        register(state, index)
    caplog.set_level(logging.INFO)
    caplog.clear()
    clock.now += APPLICATION_TIMEOUT + 1
    state.worker_heartbeat("worker-0", pb.WorkerLoad(), [])
    assert state.reap().count == 3
    assert _lifecycle_lines(caplog) == [
        f"application app-1 expired after {APPLICATION_TIMEOUT} s without heartbeats:"
        " 3 partitions deleted"
    ]


def test_a_partition_moved_to_the_tier_is_not_lost_with_its_worker_and_the_tier_is_cleaned(
    clock: Clock,
) -> None:
    state = new_state(clock)
    tiered = dataclasses.replace(worker(0), tier_url="s3://bucket/tier")
    state.register_worker(tiered, pb.WorkerLoad(), [])
    state.register_application("app-1")
    state.register_job("app-1", "job-1")
    register(state, 0)
    register(state, 1)
    state.worker_heartbeat(tiered.worker_id, pb.WorkerLoad(), [Commit(partition(0), on_tier=True)])
    clock.now += WORKER_TIMEOUT + 1
    state.application_heartbeat("app-1")
    state.reap()
    # Only the partition it did not move is lost; the moved one is still placed, on the tier.
    assert state.application_heartbeat("app-1") == [("job-1", partition(1))]
    placements, askable = state.job_partitions("app-1", "job-1")
    assert askable == {}
    assert [(p.partition, p.tier_url) for p in placements] == [(partition(0), tiered.tier_url)]
    releases = state.unregister_job("app-1", "job-1", keep_persistent=False)
    assert releases.per_worker == {}
    assert releases.on_tier == {tiered.tier_url: [partition(0)]}


def test_a_worker_registering_with_moved_partitions_has_them_kept_past_its_loss(
    clock: Clock,
) -> None:
    state = new_state(clock)
    tiered = dataclasses.replace(worker(0), tier_url="s3://bucket/tier")
    state.register_worker(tiered, pb.WorkerLoad(), [partition(0), partition(1)], [partition(0)])
    clock.now += WORKER_TIMEOUT + 1
    state.reap()
    assert state.partition_count() == 1


def _ages(state: CoordinatorState) -> dict[str, float]:
    return {name: age for name, age, _ in state.applications()}


def test_an_application_is_listed_with_who_its_driver_says_it_is(clock: Clock) -> None:
    """Its engine's id, name and user, kept when its driver registers again without them (an
    older driver, or one whose coordinator restarted)."""
    state = new_state(clock)
    spark = ApplicationIdentity("local-1795950000000", "nightly sessions", "etl")
    state.register_application("app-1", spark)
    state.register_application("app-2")
    state.register_application("app-1")
    assert sorted((name, who) for name, _, who in state.applications()) == [
        ("app-1", spark),
        ("app-2", ApplicationIdentity()),
    ]


def test_ended_applications_are_told_in_the_order_they_ended_and_block_their_clients() -> None:
    clock = Clock()
    state = new_state(clock)
    state.register_application("app-a", client="team-a")
    state.register_application("app-a", client="team-a")  # again, by its own client
    with pytest.raises(PermissionDeniedError, match="team-b"):
        state.register_application("app-a", client="team-b")
    for name in ("app-a", "app-b", "app-c"):
        state.register_application(name)
        state.unregister_application(name)
    assert "app-b" in state.ended and "app-d" not in state.ended
    ended, heard = state.ended_after(0)
    assert ended == ["app-a", "app-b", "app-c"]
    assert state.ended_after(heard) == ([], heard)
    state.register_application("app-d")
    clock.now += APPLICATION_TIMEOUT + 1
    state.reap()
    assert state.ended_after(heard)[0] == ["app-d"]  # expired: ended too
    with pytest.raises(PermissionDeniedError, match="ended"):
        state.register_application("app-d", client="team-a")


def test_a_copy_a_worker_holds_for_another_application_is_neither_a_replica_nor_stale() -> None:
    clock = Clock()
    state = new_state(clock)
    state.register_application("app-a")
    state.register_job("app-a", "job-1")
    state.register_worker(worker(0), pb.WorkerLoad(), [])
    assert register(state, 0, application="app-a") == (worker(0),)
    # Another worker shows a copy of the same id, committed for another application.
    assert (
        state.register_worker(worker(1), pb.WorkerLoad(), [partition(0)], held_for=["app-b"]) == []
    )
    [placement] = state.job_partitions("app-a", "job-1")[0]
    assert placement.replicas == (worker(0),)
    assert state.owners([partition(0)]) == {partition(0): "app-a"}


def test_a_decommission_passed_on_from_here_moves_placement_at_once(clock: Clock) -> None:
    state = new_state(clock)
    for index in range(2):
        state.register_worker(worker(index), pb.WorkerLoad(), [])
    state.register_application("app-1")
    state.register_job("app-1", "job-1")
    state.heard_decommission("worker-0", decommissioning=True)  # before its next heartbeat
    assert {register(state, index)[0].worker_id for index in range(4)} == {"worker-1"}
    state.heard_decommission("worker-0", decommissioning=False)
    assert "worker-0" in {register(state, index)[0].worker_id for index in range(4, 8)}
