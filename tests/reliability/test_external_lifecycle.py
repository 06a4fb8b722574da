"""The external shuffle service across the lives of its daemons and clients: worker restarts,
crashes, replication, expired and unregistered applications and jobs, a graceful drain on
SIGTERM, and the Prometheus endpoint. Real daemon processes on 127.0.0.1 (LocalCluster)."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from external_shuffle.local_cluster import LocalCluster
from shuffle_api import (
    PartitionStatistics,
    ResultPartitionType,
)
from shuffle_api.errors import ShuffleError
from shuffle_api.ids import new_id
from shuffle_api.testing import (
    RecordingJobContext,
    ShuffleScenario,
)
from shuffle_api.testing.harness import in_background, route
from shuffle_runtime.format import partition_directory
from shuffle_runtime.format.manifest import DATA_FILE
from shuffle_runtime.store import Store
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
    on_any_store,
    partition_files,
    placed_on,
    replicas,
    rows_of,
    scenario_on,
    scrape,
    worker_index,
)

# --- one cluster for the tests that leave every daemon running -----------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # A restart well within the worker timeout, even on a busy machine.
    settings = {"external-shuffle.coordinator.worker-timeout": 15.0}
    with LocalCluster(
        tmp_path_factory.mktemp("lifecycle"), workers=2, settings=settings, metrics=True
    ) as running:
        yield running


def test_restarted_worker_serves_the_partitions_committed_before(cluster: LocalCluster) -> None:
    with scenario_on(cluster) as scenario:
        descriptors, _ = scenario.produce(
            batches(), partitions=PARTITIONS, subpartitions=SUBPARTITIONS
        )
        assert any(placed_on(cluster, d) == {0} for d in descriptors), "worker 0 holds some"
        assert cluster.stop_worker(0) == 0
        cluster.start_worker(0)
        table = scenario.read(scenario.consumer, descriptors, ALL)
        assert rows_of(table) == list(range(ROWS))
        metrics = scenario.master.partitions_with_metrics(scenario.job.job_id).result()
        assert sorted(m.shuffle_descriptor.result_partition_id for m in metrics) == ids(descriptors)
        assert all(m.available for m in metrics)
        assert scenario.job.lost == []


def test_unregistering_a_job_deletes_its_partitions_but_persistent_ones_wait_for_release(
    cluster: LocalCluster,
) -> None:
    with scenario_on(cluster) as scenario:
        blocking, _ = scenario.produce(batches(), partitions=2, subpartitions=SUBPARTITIONS)
        scenario.result_id = "result-" + new_id()
        persistent, _ = scenario.produce(
            batches(),
            partitions=2,
            subpartitions=SUBPARTITIONS,
            partition_type=ResultPartitionType.BLOCKING_PERSISTENT,
        )
        for descriptor in [*blocking, *persistent]:
            assert on_any_store(cluster, descriptor.result_partition_id)

        scenario.master.unregister_job(scenario.job.job_id)
        for descriptor in blocking:
            assert not on_any_store(cluster, descriptor.result_partition_id)
        for descriptor in persistent:
            assert on_any_store(cluster, descriptor.result_partition_id)
        table = scenario.read(
            scenario.consumer,
            persistent,
            ALL,
            partition_type=ResultPartitionType.BLOCKING_PERSISTENT,
        )
        assert rows_of(table) == list(range(ROWS))

        for descriptor in persistent:
            scenario.master.release_partition_externally(descriptor)
            assert not on_any_store(cluster, descriptor.result_partition_id)
        application_id = external(scenario.master).application_id
    # The coordinator logs each event of the application once, never a partition.
    lines = [
        line
        for line in (cluster.directory / "coordinator.log").read_text().splitlines()
        if f"application {application_id} " in line
    ]
    assert [json.loads(line)["message"] for line in lines] == [
        f"application {application_id} registered",
        f"application {application_id} ended job {scenario.job.job_id}: 2 partitions released",
        f"application {application_id} ended: 4 partitions released here since it registered",
    ]


def test_at_debug_the_daemons_log_each_partition_and_at_start_their_version(
    tmp_path: Path,
) -> None:
    settings = {"external-shuffle.daemon.log-level": "debug"}
    with LocalCluster(tmp_path / "cluster", workers=1, settings=settings) as cluster:
        with scenario_on(cluster) as scenario:
            produced, _ = scenario.produce(batches(), partitions=2, subpartitions=SUBPARTITIONS)
            for descriptor in produced:
                scenario.master.release_partition_externally(descriptor)
        logs = {
            name: [json.loads(line) for line in (cluster.directory / f"{name}.log").open()]
            for name in ("coordinator", "worker-0")
        }
    partitions = [str(descriptor.result_partition_id) for descriptor in produced]
    for name, role in (("coordinator", "coordinator"), ("worker-0", "worker")):
        first = logs[name][0]
        assert first["message"].startswith("pyshuffle ") and first["message"].endswith(" starting")
        assert first["role"] == role
        assert first["config_file"] == str(cluster.directory / f"{name}.toml")
    messages = {name: [entry["message"] for entry in log] for name, log in logs.items()}
    for partition in partitions:
        assert any(m.startswith(f"placed {partition} on worker-") for m in messages["coordinator"])
        assert any(m.startswith(f"committed {partition}: ") for m in messages["worker-0"])
        assert f"released {partition}" in messages["worker-0"]


def test_client_environment_holds_nothing_locally_after_writing(cluster: LocalCluster) -> None:
    with scenario_on(cluster) as scenario:
        descriptors, _ = scenario.produce(
            batches(), partitions=PARTITIONS, subpartitions=SUBPARTITIONS
        )
        assert scenario.producer.partitions_occupying_local_resources() == frozenset()
        assert all(d.stores_local_resources_on() is None for d in descriptors)
        # So the producer can go away at once: its partitions are still read in full.
        scenario.producer.close()
        table = scenario.read(scenario.consumer, descriptors, ALL)
        assert rows_of(table) == list(range(ROWS))
        assert scenario.consumer.partitions_occupying_local_resources() == frozenset()


def worker_total(cluster: LocalCluster, sample: str) -> float:
    return sum(
        scrape(cluster, f"worker-{i}").get(sample, 0.0) for i in range(len(cluster.worker_ports))
    )


def test_prometheus_endpoints_count_bytes_pushed_and_fetched(cluster: LocalCluster) -> None:
    pushed_before = worker_total(cluster, "pyshuffle_bytes_in_total")
    fetched_before = worker_total(cluster, "pyshuffle_bytes_out_total")
    with scenario_on(cluster) as scenario:
        descriptors, statistics = scenario.produce(
            batches(), partitions=PARTITIONS, subpartitions=SUBPARTITIONS
        )
        pushed = worker_total(cluster, "pyshuffle_bytes_in_total") - pushed_before
        run_bytes = sum(sum(s.bytes_per_subpartition) for s in statistics)
        assert pushed >= run_bytes > 0
        stored = worker_total(cluster, "pyshuffle_stored_bytes")
        assert stored >= pushed
        table = scenario.read(scenario.consumer, descriptors, ALL)
        assert rows_of(table) == list(range(ROWS))
        fetched = worker_total(cluster, "pyshuffle_bytes_out_total") - fetched_before
        assert fetched == run_bytes
        coordinator = scrape(cluster, "coordinator")
        assert coordinator["pyshuffle_applications"] >= 1
        assert coordinator["pyshuffle_workers_alive"] == len(cluster.worker_ports)


# --- crashes: a cluster whose coordinator notices a silent worker quickly ------------------------


@pytest.fixture(scope="module")
def crash_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    settings = {
        "external-shuffle.coordinator.worker-timeout": 3.0,
        "external-shuffle.worker.heartbeat-interval": 0.25,
    }
    with LocalCluster(tmp_path_factory.mktemp("crash"), workers=2, settings=settings) as running:
        yield running


def test_killed_worker_loses_exactly_its_partitions_and_deletes_them_when_back(
    crash_cluster: LocalCluster,
) -> None:
    cluster = crash_cluster
    # No background heartbeats: this test calls master.heartbeat() itself.
    with scenario_on(cluster, **{"external-shuffle.client.heartbeat-interval": 600.0}) as first:
        second = ShuffleScenario(
            first.harness,
            first.master,
            first.producer,
            first.consumer,
            RecordingJobContext("job-" + new_id()),
            first.secret,
        )
        first.master.register_job(second.job)
        try:
            written = {
                scenario.job.job_id: scenario.produce(
                    batches(), partitions=PARTITIONS, subpartitions=SUBPARTITIONS
                )[0]
                for scenario in (first, second)
            }
            doomed = {
                job: ids([d for d in descriptors if placed_on(cluster, d) == {0}])
                for job, descriptors in written.items()
            }
            assert all(doomed.values()), "each job has partitions on worker 0"
            assert partition_files(cluster, 0)
            cluster.kill_worker(0)
            try:
                cluster.wait_for_workers({cluster.worker_target(0)}, alive=False)

                # The second job asks for its partitions: worker 0's are unavailable.
                metrics = first.master.partitions_with_metrics(second.job.job_id).result()
                unavailable = sorted(
                    m.shuffle_descriptor.result_partition_id for m in metrics if not m.available
                )
                assert unavailable == doomed[second.job.job_id]
                available = [m for m in metrics if m.available]
                assert len(available) == PARTITIONS - len(unavailable)
                assert all(isinstance(m.statistics, PartitionStatistics) for m in available)
                assert sorted(second.job.lost) == doomed[second.job.job_id]

                # The heartbeat tells the first job about its own, and nobody twice.
                external(first.master).heartbeat()
                assert sorted(first.job.lost) == doomed[first.job.job_id]
                assert sorted(second.job.lost) == doomed[second.job.job_id]
            finally:
                cluster.start_worker(0)
            # Back, the worker learns its leftovers belong to nobody and deletes them.
            eventually(lambda: not partition_files(cluster, 0), "worker 0's store is empty")

            # What lived on worker 1 is still read in full.
            survivors = [d for d in written[first.job.job_id] if placed_on(cluster, d) == {1}]
            table = first.read(first.consumer, survivors, ALL)
            source = batches()
            expected = sorted(
                row
                for d in survivors
                for batch in source[
                    d.result_partition_id.partition_id.partition_index :: PARTITIONS
                ]
                for row in batch.column("row").to_pylist()
            )
            assert survivors
            assert rows_of(table) == expected
        finally:
            first.master.unregister_job(second.job.job_id)


def test_replicated_partitions_are_read_in_full_after_a_worker_is_killed(
    crash_cluster: LocalCluster,
) -> None:
    cluster = crash_cluster
    with scenario_on(cluster, **{"external-shuffle.replication-factor": 2}) as scenario:
        descriptors, _ = scenario.produce(
            batches(), partitions=PARTITIONS, subpartitions=SUBPARTITIONS
        )
        assert all(placed_on(cluster, d) == {0, 1} for d in descriptors)
        # Kill the first replica of the first partition: its read has to fail over.
        victim = worker_index(cluster, replicas(descriptors[0])[0])
        cluster.kill_worker(victim)
        try:
            table = scenario.read(scenario.consumer, descriptors, ALL)
            assert rows_of(table) == list(range(ROWS))
        finally:
            cluster.start_worker(victim)


# --- application expiry -------------------------------------------------------------------------


def test_silent_application_expires_and_its_partitions_are_deleted(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # Long enough that producing outlasts no heartbeat on a loaded machine: `silent` sends
    # its last one just before it produces.
    settings = {"external-shuffle.coordinator.application-timeout": 5.0}
    with (
        LocalCluster(tmp_path_factory.mktemp("expiry"), workers=2, settings=settings) as cluster,
        scenario_on(cluster, **{"external-shuffle.client.heartbeat-interval": 0.25}) as alive,
        scenario_on(cluster, **{"external-shuffle.client.heartbeat-interval": 600.0}) as silent,
    ):
        kept, _ = alive.produce(batches(), partitions=2, subpartitions=SUBPARTITIONS)
        external(silent.master).heartbeat()  # its last one: alive while it registers its partitions
        doomed, _ = silent.produce(batches(), partitions=2, subpartitions=SUBPARTITIONS)
        assert all(on_any_store(cluster, d.result_partition_id) for d in [*kept, *doomed])

        eventually(
            lambda: not any(on_any_store(cluster, d.result_partition_id) for d in doomed),
            "the silent application's partitions are deleted",
        )
        time.sleep(0.5)  # a few more heartbeats of the live one
        assert all(on_any_store(cluster, d.result_partition_id) for d in kept)
        assert rows_of(alive.read(alive.consumer, kept, ALL)) == list(range(ROWS))
        # The silent master hears its application expired: every partition it had is lost.
        external(silent.master).heartbeat()
        assert sorted(silent.job.lost) == ids(doomed)
        assert alive.job.lost == []
        expired = (
            f"application {external(silent.master).application_id} expired after 5.0 s without"
            " heartbeats: 2 partitions deleted"
        )
        assert expired in (cluster.directory / "coordinator.log").read_text()


# --- SIGTERM while a push is in flight ----------------------------------------------------------


def test_sigterm_lets_the_push_in_flight_commit_and_exits_cleanly(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    settings = {"external-shuffle.daemon.shutdown-grace": 30.0}
    data = batches(8_000)
    with (
        LocalCluster(tmp_path_factory.mktemp("drain"), workers=2, settings=settings) as cluster,
        scenario_on(cluster, **{"external-shuffle.client.chunk-size": "4k"}) as scenario,
    ):
        descriptor = scenario.partition_descriptor(0, partitions=1, subpartitions=SUBPARTITIONS)
        shuffle_descriptor, writer = scenario.new_writer(descriptor)
        [target] = placed_on(cluster, shuffle_descriptor)
        partition = shuffle_descriptor.result_partition_id
        store = Store(str(cluster.worker_store(target)))
        data_file = Path(partition_directory(store, partition)) / DATA_FILE
        resume = threading.Event()

        def produce() -> PartitionStatistics:
            with writer:
                for number, batch in enumerate(data):
                    writer.write(batch, route(batch, SUBPARTITIONS))
                    if number == 5:  # past a spill: the push stream is open
                        assert resume.wait(60)
                return writer.finish()

        producing = in_background(produce)
        try:
            eventually(
                lambda: data_file.exists() and data_file.stat().st_size > 0, "the push is underway"
            )
            stopping = in_background(lambda: cluster.stop_worker(target))
            # The coordinator hears the worker drains, and places new partitions elsewhere.
            eventually(
                lambda: any(
                    entry.load.decommissioning and entry.worker.port == cluster.worker_ports[target]
                    for entry in list_workers(cluster)
                ),
                "the worker reports it drains",
            )
            for index in range(1, 4):
                placed = scenario.register(
                    scenario.partition_descriptor(index, partitions=4, subpartitions=SUBPARTITIONS)
                )
                assert target not in placed_on(cluster, placed)
            assert not stopping.done(), "the worker waits for the push in flight"
        finally:
            resume.set()  # the producer goes on (and ends) whatever happened
        statistics = producing.result(timeout=60)
        assert isinstance(statistics, PartitionStatistics)
        assert sum(statistics.rows_per_subpartition) == 8_000
        assert stopping.result(timeout=60) == 0
        # Committed on the stopped worker's store: a restarted worker serves it.
        cluster.start_worker(target)
        table = scenario.read(scenario.consumer, [shuffle_descriptor], ALL)
        assert rows_of(table) == list(range(8_000))


@pytest.mark.parametrize(
    "setting", ["external-shuffle.coordinator.status-port", "external-shuffle.daemon.metrics-port"]
)
def test_a_daemon_that_cannot_serve_a_port_exits_at_start_naming_it(
    tmp_path: Path, setting: str
) -> None:
    # Both ports open after the coordinator's gRPC server started: its threads once kept the
    # process alive, answering no call, until whoever started it gave up.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with (
            pytest.raises(ShuffleError, match="coordinator exited at start") as failure,
            LocalCluster(tmp_path / "cluster", workers=1, settings={setting: port}),
        ):
            pass
    assert f"127.0.0.1:{port}" in str(failure.value)
    assert "Address already in use" in str(failure.value)


def test_sigint_drains_a_worker_as_sigterm_does(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "cluster", workers=1) as cluster:
        os.kill(cluster.worker_pid(0), signal.SIGINT)
        eventually(lambda: not cluster.worker_running(0), "the worker exits")
        assert cluster.stop_worker(0) == 0
        log = (cluster.directory / "worker-0.log").read_text()
        assert "draining after SIGINT" in log
        assert '"stopped"' in log


def test_a_worker_back_from_an_outage_has_its_new_partitions_available_at_once(
    crash_cluster: LocalCluster,
) -> None:
    """The coordinator's channel to a worker it found down backs off between reconnects; once
    the worker is back, partitions committed on it must read as available, not as lost
    because that channel would still fail a call at once."""
    cluster = crash_cluster
    with scenario_on(cluster, **{"external-shuffle.client.heartbeat-interval": 600.0}) as scenario:
        before, _ = scenario.produce(batches(), partitions=PARTITIONS, subpartitions=SUBPARTITIONS)
        assert any(placed_on(cluster, d) == {0} for d in before), "worker 0 holds some"
        cluster.kill_worker(0)
        try:
            # Asked before the worker timeout, the coordinator calls the dead worker.
            metrics = scenario.master.partitions_with_metrics(scenario.job.job_id).result()
            assert not all(m.available for m in metrics)
            cluster.wait_for_workers({cluster.worker_target(0)}, alive=False)
            time.sleep(4.0)  # reconnects that fail grow the channel's backoff
        finally:
            cluster.start_worker(0)
        cluster.wait_for_workers({cluster.worker_target(0)})
        lost = set(scenario.job.lost)
        after, _ = scenario.produce(batches(), partitions=PARTITIONS, subpartitions=SUBPARTITIONS)
        assert any(placed_on(cluster, d) == {0} for d in after), "worker 0 holds some again"
        metrics = scenario.master.partitions_with_metrics(scenario.job.job_id).result()
        available = {m.shuffle_descriptor.result_partition_id for m in metrics if m.available}
        assert set(ids(after)) <= available
        assert set(scenario.job.lost) == lost
