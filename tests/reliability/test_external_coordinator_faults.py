"""Coordinators that die: killed, stopped and restarted during a job, alone or beside another.
Nothing committed is deleted, writes ride through the outage, reads return every row, and the
workers' stores are empty once the application is done. Real daemon processes on 127.0.0.1."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from external_shuffle.local_cluster import LocalCluster
from external_shuffle.wire.messages import partition_of
from external_shuffle.wire.stubs import pb
from shuffle_api import ResultPartitionID, ShuffleDescriptor, UnknownShuffleDescriptor, new_id
from shuffle_api.testing import ShuffleScenario
from shuffle_api.testing.harness import in_background, route
from tests.eventually import eventually
from tests.reliability.external_cluster import (
    ALL,
    PARTITIONS,
    ROWS,
    SUBPARTITIONS,
    batches,
    external,
    ids,
    list_workers,
    on_store,
    partition_files,
    placed_on,
    rows_of,
    scenario_on,
)

SETTINGS = {"external-shuffle.worker.heartbeat-interval": 0.25}


def stored(cluster: LocalCluster) -> list[Path]:
    return [
        path
        for index in range(len(cluster.worker_ports))
        for path in partition_files(cluster, index)
    ]


def nothing_stored(cluster: LocalCluster) -> None:
    eventually(lambda: not stored(cluster), "every worker's store is empty")


@pytest.fixture
def one_coordinator(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path, workers=2, settings=SETTINGS) as cluster:
        yield cluster


@pytest.fixture
def two_coordinators(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path, workers=2, coordinators=2, settings=SETTINGS) as cluster:
        yield cluster


@pytest.mark.parametrize("kill", [True, False], ids=["kill-9", "sigterm"])
def test_a_restarted_coordinator_deletes_nothing_and_the_job_reads_everything(
    one_coordinator: LocalCluster, kill: bool
) -> None:
    cluster = one_coordinator
    # No background heartbeats: the test says when the master hears of the restart.
    with scenario_on(cluster, **{"external-shuffle.client.heartbeat-interval": 600.0}) as scenario:
        written, _ = scenario.produce(batches(), partitions=PARTITIONS, subpartitions=SUBPARTITIONS)
        files = stored(cluster)
        if kill:
            cluster.kill_coordinator()
        else:
            assert cluster.stop_coordinator() == 0
        cluster.start_coordinator()
        cluster.wait_for_workers({cluster.worker_target(i) for i in range(2)})
        external(scenario.master).heartbeat()  # unknown there: registers everything again

        assert stored(cluster) == files
        metrics = scenario.master.partitions_with_metrics(scenario.job.job_id).result()
        assert all(m.available for m in metrics)
        assert ids([m.shuffle_descriptor for m in metrics]) == ids(written)
        assert scenario.job.lost == []
        assert rows_of(scenario.read(scenario.consumer, written, ALL)) == list(range(ROWS))
    nothing_stored(cluster)


def test_a_partition_committed_after_its_coordinator_restarted_is_found_where_it_is(
    one_coordinator: LocalCluster,
) -> None:
    """Placed, then the coordinator restarts and the workers register again, then committed
    (a map task that waited): the worker's next heartbeat tells the coordinator, so the
    driver's claim finds the copy where it is rather than placing it anew on the emptier
    worker, reads get every row, and nothing is left once the application is done."""
    cluster = one_coordinator
    with scenario_on(cluster, **{"external-shuffle.client.heartbeat-interval": 600.0}) as scenario:
        descriptor = scenario.partition_descriptor(0, partitions=1, subpartitions=SUBPARTITIONS)
        attempt = "attempt-" + new_id()
        partition = ResultPartitionID(descriptor.partition_id, attempt)
        writer = scenario.writer(descriptor, UnknownShuffleDescriptor(partition))  # placed
        cluster.kill_coordinator()
        cluster.start_coordinator()
        cluster.wait_for_workers({cluster.worker_target(i) for i in range(2)})
        with writer:
            for batch in batches():
                writer.write(batch, route(batch, SUBPARTITIONS))
            writer.finish()
        [holder] = [index for index in range(2) if on_store(cluster, index, partition)]
        # The heartbeat that carries the commit also carries the load that counts it.
        eventually(
            lambda: any(entry.load.partitions for entry in list_workers(cluster)),
            "a worker's heartbeat told the coordinator of the commit",
        )
        external(scenario.master).heartbeat()  # registers the application again
        registered = scenario.register(descriptor, attempt)
        assert placed_on(cluster, registered) == {holder}
        assert rows_of(scenario.read(scenario.consumer, [registered], ALL)) == list(range(ROWS))
    nothing_stored(cluster)


def test_a_driver_heard_before_a_worker_that_was_down_loses_none_of_its_partitions(
    tmp_path: Path,
) -> None:
    """The coordinator restarts while a worker is down, and the driver tells it where its
    partitions are before that worker is back: they are not lost but undecided; the stage
    check waits for the worker to register again, finds every partition, and reads every row.
    (Taken for lost, they were deleted as released when the worker came back.)"""
    settings = {**SETTINGS, "external-shuffle.coordinator.worker-timeout": 60.0}
    with (
        LocalCluster(tmp_path, workers=2, settings=settings) as cluster,
        scenario_on(cluster, **{"external-shuffle.client.heartbeat-interval": 600.0}) as scenario,
    ):
        written, _ = scenario.produce(batches(), partitions=PARTITIONS, subpartitions=SUBPARTITIONS)
        assert any(placed_on(cluster, d) == {1} for d in written), "worker 1 holds some"
        files = stored(cluster)
        cluster.kill_worker(1)
        cluster.kill_coordinator()
        cluster.start_coordinator()
        cluster.wait_for_workers({cluster.worker_target(0)})
        external(scenario.master).heartbeat()  # tells it everything before worker 1 is back
        assert scenario.job.lost == []
        check = in_background(
            lambda: scenario.master.partitions_with_metrics(scenario.job.job_id).result()
        )
        time.sleep(1.0)
        assert not check.done(), "the check waits for worker 1"
        cluster.start_worker(1)
        metrics = check.result(timeout=60)
        assert isinstance(metrics, list)
        assert all(m.available for m in metrics)
        assert scenario.job.lost == []
        assert stored(cluster) == files
        assert rows_of(scenario.read(scenario.consumer, written, ALL)) == list(range(ROWS))
    nothing_stored(cluster)


def test_writes_during_a_coordinator_outage_wait_for_it_to_come_back(
    one_coordinator: LocalCluster,
) -> None:
    cluster = one_coordinator
    with scenario_on(cluster) as scenario:
        cluster.kill_coordinator()
        started = threading.Event()

        def produce() -> list[ShuffleDescriptor]:
            started.set()
            descriptors, _ = scenario.produce(
                batches(), partitions=PARTITIONS, subpartitions=SUBPARTITIONS
            )
            return descriptors

        writing = in_background(produce)
        started.wait()
        assert not writing.done()
        cluster.start_coordinator()
        written = writing.result(timeout=60)
        assert isinstance(written, list)
        assert rows_of(scenario.read(scenario.consumer, written, ALL)) == list(range(ROWS))
        assert scenario.job.lost == []
    nothing_stored(cluster)


def test_either_of_two_coordinators_may_die_during_a_job(two_coordinators: LocalCluster) -> None:
    cluster = two_coordinators
    with scenario_on(cluster, **{"external-shuffle.client.heartbeat-interval": 0.2}) as scenario:
        data = batches()
        first, _ = scenario.produce(data, partitions=PARTITIONS, subpartitions=SUBPARTITIONS)
        cluster.kill_coordinator(0)
        second, _ = scenario.produce(data, partitions=PARTITIONS, subpartitions=SUBPARTITIONS)
        cluster.start_coordinator(0)
        cluster.wait_for_workers({cluster.worker_target(i) for i in range(2)})
        # The restarted one learns the application from the master's heartbeats, then the
        # other dies: everything is still known, and read.
        everything = ids([*first, *second])
        eventually(
            lambda: available_at(cluster, 0, scenario) == everything,
            "coordinator 0 knows every partition",
        )
        cluster.kill_coordinator(1)
        metrics = scenario.master.partitions_with_metrics(scenario.job.job_id).result()
        assert ids([m.shuffle_descriptor for m in metrics]) == ids([*first, *second])
        assert all(m.available for m in metrics)
        for written in (first, second):
            assert rows_of(scenario.read(scenario.consumer, written, ALL)) == list(range(ROWS))
        assert scenario.job.lost == []
    nothing_stored(cluster)


def available_at(
    cluster: LocalCluster, coordinator: int, scenario: ShuffleScenario
) -> list[ResultPartitionID]:
    """The scenario's partitions one coordinator knows and finds committed (none while a
    restarted coordinator has not yet heard the application again)."""
    try:
        answer = cluster.coordinator_stub(coordinator).GetPartitionStatus(
            pb.GetPartitionStatusRequest(
                application_id=external(scenario.master).application_id,
                job_id=scenario.job.job_id,
            ),
            timeout=10,
        )
    except grpc.RpcError as error:
        if isinstance(error, grpc.Call) and error.code() == grpc.StatusCode.NOT_FOUND:
            return []
        raise
    return sorted(partition_of(s.location.partition) for s in answer.partitions if s.available)


def test_an_application_one_coordinator_no_longer_hears_lives_while_another_does(
    tmp_path: Path,
) -> None:
    timeout = 4.0  # far above a heartbeat's gap on a loaded machine
    settings = {**SETTINGS, "external-shuffle.coordinator.application-timeout": timeout}
    with LocalCluster(tmp_path, workers=1, coordinators=2, settings=settings) as cluster:
        application = "app-" + new_id()
        for index in (0, 1):
            cluster.coordinator_stub(index).RegisterApplication(
                pb.RegisterApplicationRequest(application_id=application), timeout=10
            )
        # The driver reaches coordinator 1 only, for twice the application timeout.
        deadline = time.monotonic() + 2 * timeout
        while time.monotonic() < deadline:
            cluster.coordinator_stub(1).ApplicationHeartbeat(
                pb.ApplicationHeartbeatRequest(application_id=application), timeout=10
            )
            time.sleep(0.2)
        assert application in _applications(cluster, 0)
        # Then no coordinator hears from it: both expire it.
        eventually(
            lambda: not any(application in _applications(cluster, i) for i in (0, 1)),
            "both coordinators expired the application",
        )


def _applications(cluster: LocalCluster, coordinator: int) -> set[str]:
    answer = cluster.coordinator_stub(coordinator).ListApplications(
        pb.ListApplicationsRequest(), timeout=10
    )
    return {entry.application_id for entry in answer.applications}


def test_a_coordinator_down_is_warned_of_once_and_its_return_is_said(
    two_coordinators: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    with scenario_on(two_coordinators) as scenario:
        master = external(scenario.master)
        down = two_coordinators.coordinator_targets[1]
        two_coordinators.kill_coordinator(1)
        with caplog.at_level(logging.INFO, logger="external_shuffle.client.master"):
            for _ in range(3):
                master.heartbeat()  # the other coordinator answers
            warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
            assert len(warned) == 1 and down in warned[0].getMessage(), warned
            caplog.clear()
            two_coordinators.start_coordinator(1)
            master.heartbeat()
        said = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
        assert f"coordinator {down} answers again" in said, said
