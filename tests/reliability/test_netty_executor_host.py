"""An executor's partition host, with real processes: a stand-in executor process (its life
bounds the host's), writers in this process that hand their partitions over and go away, and
the master asking the host what it holds."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from netty_like import NettyShuffleEnvironment
from netty_like.host_process import process_start_time
from shuffle_api import (
    Configuration,
    InputGateDeploymentDescriptor,
    IntermediateResultPartitionID,
    PartitionDescriptor,
    ResultPartitionDeploymentDescriptor,
    ResultPartitionID,
    ResultPartitionType,
    ShuffleDescriptor,
    ShuffleEnvironmentContext,
    ShuffleIOOwner,
    ShuffleMaster,
    ShuffleMasterContext,
    SubpartitionRange,
    UnknownShuffleDescriptor,
    load_shuffle_service_factory,
)
from shuffle_api.testing import RecordingJobContext, make_batches
from shuffle_api.testing.harness import route

RESULT = "hosted"
RENDEZVOUS = Path(tempfile.gettempdir()) / f"pyshuffle-hosts-{os.getuid()}"
IDLE_SECONDS = 0.5


@pytest.fixture
def executor() -> Iterator[subprocess.Popen[bytes]]:
    """A process standing in for an executor's JVM."""
    process = subprocess.Popen(["sleep", "300"])
    yield process
    process.kill()
    process.wait()


def _files(store: Path) -> list[Path]:
    return [path for path in store.rglob("*")]


def _rendezvous_pids(pattern: str) -> list[int]:
    """The pids the rendezvous files matching pattern name; a file that another test's host
    removes between the listing and the read is skipped."""
    pids = []
    for path in RENDEZVOUS.glob(pattern):
        with contextlib.suppress(OSError, ValueError):
            pids.append(int(json.loads(path.read_text())["pid"]))
    return pids


def _hosts(executor_pid: int) -> set[int]:
    """The running hosts of this executor, as its processes find them (their rendezvous
    files): other test runs' hosts on this machine are not counted."""
    return {pid for pid in _rendezvous_pids(f"{executor_pid}-*.json") if _alive(pid)}


def _alive(pid: int) -> bool:
    return process_start_time(pid) is not None


def _write(
    environment: NettyShuffleEnvironment,
    master: ShuffleMaster,
    job: str,
    index: int,
    *,
    pause: float = 0.0,
) -> ShuffleDescriptor:
    """Write partition ``index``, then register it, as the PySpark glue does: the producer is
    known once its writer has handed the partition over."""
    descriptor = PartitionDescriptor(
        RESULT,
        2,
        IntermediateResultPartitionID(RESULT, index),
        ResultPartitionType.BLOCKING,
        2,
    )
    attempt = f"attempt-{index}"
    placeholder = UnknownShuffleDescriptor(ResultPartitionID(descriptor.partition_id, attempt))
    [writer] = environment.create_result_partition_writers(
        ShuffleIOOwner("map", attempt),
        [ResultPartitionDeploymentDescriptor(descriptor, placeholder)],
    )
    with writer:
        for batch in make_batches(5_000):
            writer.write(batch, route(batch, 2))
        time.sleep(pause)
        writer.finish()
    return master.register_partition_with_producer(
        job, descriptor, environment.producer_descriptor(attempt)
    ).result()


@dataclass
class _Application:
    """A master and its job, and the application's environments on the stand-in executor."""

    store: Path
    config: Configuration
    master_context: ShuffleMasterContext
    master: ShuffleMaster
    job: RecordingJobContext
    executor_pid: int

    def environment(self, name: str) -> NettyShuffleEnvironment:
        made = load_shuffle_service_factory(self.config).create_shuffle_environment(
            ShuffleEnvironmentContext(
                self.config,
                resource_id=name,
                host="127.0.0.1",
                secret=self.master_context.secret,
                executor_pid=self.executor_pid,
            )
        )
        assert isinstance(made, NettyShuffleEnvironment)
        made.start()
        return made


@pytest.fixture
def application(tmp_path: Path, executor: subprocess.Popen[bytes]) -> _Application:
    store = tmp_path / "executor-store"
    # Reads go to the host, never to the files: as from another executor. Connections with
    # nothing to do are closed after half a second, so the tests meet that.
    config = Configuration.load(
        {
            "netty-like.storage.url": str(store),
            "netty-like.read-from-shared-store": False,
            "netty-like.data-port.idle-timeout": IDLE_SECONDS,
        },
        environ={},
    )
    master_context = ShuffleMasterContext(config)
    master = load_shuffle_service_factory(config).create_shuffle_master(master_context)
    job = RecordingJobContext("job")
    master.register_job(job)
    return _Application(store, config, master_context, master, job, executor.pid)


def _wait_until(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_partitions_outlive_their_writer_and_go_with_the_executor(
    application: _Application, executor: subprocess.Popen[bytes]
) -> None:
    master, store = application.master, application.store
    first, second = application.environment("worker-1"), application.environment("worker-2")
    descriptors = [_write(first, master, "job", 0), _write(second, master, "job", 1)]
    [host] = _hosts(application.executor_pid)  # both writers found the same host
    assert first.producer_descriptor("x").data_port == second.producer_descriptor("x").data_port
    assert first.partitions_occupying_local_resources() == frozenset()
    first.close()
    second.close()  # the writers are gone; the host serves what they wrote

    reader = application.environment("worker-3")
    [gate] = reader.create_input_gates(
        ShuffleIOOwner("reduce", "reduce-0"),
        [
            InputGateDeploymentDescriptor(
                RESULT, ResultPartitionType.BLOCKING, SubpartitionRange(0, 1), tuple(descriptors)
            )
        ],
    )
    with gate:
        assert sum(batch.num_rows for batch in gate) == 10_000
    reader.close()
    metrics = master.partitions_with_metrics("job").result()
    assert [m.available for m in metrics] == [True, True]
    assert [m.statistics.total_rows for m in metrics if m.statistics] == [5_000, 5_000]
    assert _files(store)

    executor.kill()
    _wait_until(lambda: not _alive(host) and not _files(store))
    assert not _alive(host), "the host outlived its executor"
    assert _files(store) == [], "the host left its executor's partitions behind"
    metrics = master.partitions_with_metrics("job").result()
    assert [m.available for m in metrics] == [False, False]
    assert sorted(application.job.lost) == sorted(d.result_partition_id for d in descriptors)
    master.close()


def test_a_process_of_the_executor_reads_its_partitions_from_the_store_not_the_host(
    tmp_path: Path, executor: subprocess.Popen[bytes]
) -> None:
    """The driver keeps its own store (Spark gives each executor, and the driver, a local
    directory of its own), so descriptors name another store than the executor's: a reader
    on the executor that wrote a partition reads its files all the same, not through the
    host's data port (one round trip and a copy through the host per block)."""
    store = tmp_path / "executor-store"
    config = Configuration.load({"netty-like.storage.url": str(store)}, environ={})
    driver_config = config.with_values({"netty-like.storage.url": str(tmp_path / "driver")})
    master_context = ShuffleMasterContext(driver_config)
    master = load_shuffle_service_factory(driver_config).create_shuffle_master(master_context)
    job = RecordingJobContext("job")
    master.register_job(job)
    application = _Application(store, config, master_context, master, job, executor.pid)
    with application.environment("writer") as writer_environment:
        written = _write(writer_environment, master, "job", 0)
    [host] = _hosts(executor.pid)
    os.kill(host, signal.SIGKILL)  # no data port serves the partition any more
    _wait_until(lambda: not _alive(host))

    with application.environment("reader") as reader:
        [gate] = reader.create_input_gates(
            ShuffleIOOwner("reduce", "reduce-0"),
            [
                InputGateDeploymentDescriptor(
                    RESULT, ResultPartitionType.BLOCKING, SubpartitionRange(0, 1), (written,)
                )
            ],
        )
        with gate:
            assert sum(batch.num_rows for batch in gate) == 5_000
    master.close()


def test_the_master_releases_on_the_host_and_shuts_it_down(
    application: _Application, executor: subprocess.Popen[bytes]
) -> None:
    master, store = application.master, application.store
    with application.environment("worker") as writer_environment:
        kept = _write(writer_environment, master, "job", 0)
        released = _write(writer_environment, master, "job", 1)
    [host] = _hosts(application.executor_pid)
    master.release_partition_externally(released)
    remaining = {path.name for path in _files(store)}
    assert kept.result_partition_id.producer_attempt_id in remaining
    assert released.result_partition_id.producer_attempt_id not in remaining
    master.close()  # the job's partitions released, then the host told to exit
    _wait_until(lambda: not _alive(host))
    assert not _alive(host)
    assert _files(store) == []
    assert executor.poll() is None and os.path.exists(f"/proc/{executor.pid}")
    # Nothing names the exited host any more.
    assert host not in _rendezvous_pids("*.json")


def test_a_writer_whose_host_died_starts_another_and_the_lost_partition_reads_lost(
    application: _Application,
) -> None:
    master = application.master
    with application.environment("worker") as writer_environment:
        lost = _write(writer_environment, master, "job", 0)
        [first_host] = _hosts(application.executor_pid)
        os.kill(first_host, signal.SIGKILL)
        _wait_until(lambda: not _alive(first_host))
        kept = _write(writer_environment, master, "job", 1)  # a new host takes it
        [second_host] = _hosts(application.executor_pid)
        assert second_host != first_host
        assert kept.data_port != lost.data_port  # type: ignore[attr-defined]
        metrics = {
            m.shuffle_descriptor.result_partition_id: m.available
            for m in master.partitions_with_metrics("job").result()
        }
        assert metrics == {lost.result_partition_id: False, kept.result_partition_id: True}
        assert application.job.lost == [lost.result_partition_id]
    master.close()
    _wait_until(lambda: not _alive(second_host))
    assert not _alive(second_host)


def test_a_write_outlasting_the_idle_timeout_still_commits(application: _Application) -> None:
    # The host closes the writer's quiet control connection between WRITING and COMMITTED.
    with application.environment("worker") as writer_environment:
        slow = _write(writer_environment, application.master, "job", 0, pause=3 * IDLE_SECONDS)
    [metrics] = application.master.partitions_with_metrics("job").result()
    assert metrics.shuffle_descriptor == slow
    assert metrics.available
    application.master.close()
