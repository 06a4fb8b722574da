"""The default service on an object store (moto's S3 server standing in for S3, which is not
reachable here): partitions outlive the process that wrote them, throttling is ridden out, a
lost object is a lost partition, and a job leaves nothing behind."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from netty_like.descriptor import NettyShuffleDescriptor
from netty_like.environment import NettyShuffleEnvironment
from shuffle_api import (
    LOCAL_ONLY_PORT,
    Configuration,
    IntermediateResultPartitionID,
    InvalidOperationError,
    PartitionDescriptor,
    PartitionNotFoundError,
    ResultPartitionDeploymentDescriptor,
    ResultPartitionID,
    ResultPartitionType,
    ShuffleEnvironmentContext,
    ShuffleIOOwner,
    SubpartitionRange,
    new_id,
)
from shuffle_api.testing import ConformanceHarness, ShuffleScenario, make_batches
from shuffle_runtime.format import partition_directory
from shuffle_runtime.store import Store
from tests.integration.cluster_applications import run_application, step
from tests.s3_stand_in import S3StandIn, objects_under


@pytest.fixture
def store_url(s3_stand_in: S3StandIn) -> str:
    bucket = f"shared-{new_id()}"
    s3_stand_in.make_bucket(bucket)
    return f"s3://{bucket}/shuffle"


@pytest.fixture
def scenario(store_url: str) -> Iterator[ShuffleScenario]:
    configuration = Configuration.load({"netty-like.storage.url": store_url}, environ={})
    with ShuffleScenario.open(ConformanceHarness(configuration)) as opened:
        yield opened


def _rows(table: pa.Table) -> list[int]:
    return sorted(table.column("row").to_pylist())


def test_a_partition_on_an_object_store_outlives_its_producer(
    scenario: ShuffleScenario, store_url: str
) -> None:
    batches = make_batches(20_000, batch_rows=2_500)
    descriptors, _ = scenario.produce(batches, partitions=2, subpartitions=4)
    assert all(isinstance(d, NettyShuffleDescriptor) and d.on_shared_store for d in descriptors)
    assert [d.stores_local_resources_on() for d in descriptors] == [None, None]
    assert scenario.producer.partitions_occupying_local_resources() == frozenset()

    scenario.producer.close()  # its process, data port and all, is gone

    whole = scenario.read(scenario.consumer, descriptors, SubpartitionRange(0, 3))
    assert _rows(whole) == list(range(20_000))
    found = scenario.master.partitions_with_metrics(scenario.job.job_id).result()
    assert [entry.available for entry in found] == [True, True]
    assert sum(sum(e.statistics.rows_per_subpartition) for e in found if e.statistics) == 20_000
    assert objects_under(store_url)
    scenario.master.unregister_job(scenario.job.job_id)
    assert objects_under(store_url) == []


def test_throttled_requests_are_ridden_out(
    scenario: ShuffleScenario, s3_stand_in: S3StandIn
) -> None:
    batches = make_batches(8_000, batch_rows=1_000)
    s3_stand_in.reset()
    s3_stand_in.throttle(every=4)
    try:
        descriptors, _ = scenario.produce(batches, partitions=2, subpartitions=3)
        whole = scenario.read(scenario.consumer, descriptors, SubpartitionRange(0, 2))
    finally:
        s3_stand_in.throttle(every=0)
    assert _rows(whole) == list(range(8_000))
    counts = s3_stand_in.counts()
    assert counts.get("THROTTLED", 0) > 0, counts


def test_a_deleted_object_is_a_lost_partition(scenario: ShuffleScenario, store_url: str) -> None:
    descriptors, _ = scenario.produce(make_batches(4_000), partitions=2, subpartitions=2)
    lost = descriptors[1].result_partition_id
    store = Store(store_url)
    store.delete_tree(partition_directory(store, lost))

    with pytest.raises(PartitionNotFoundError) as raised:
        scenario.read(scenario.consumer, descriptors, SubpartitionRange(0, 1))
    assert raised.value.partition_id == lost
    assert store_url in str(raised.value)
    found = scenario.master.partitions_with_metrics(scenario.job.job_id).result()
    assert [entry.available for entry in found] == [True, False]
    assert scenario.job.lost == [lost]


def test_a_stage_check_costs_a_head_a_partition_and_finds_a_deleted_one(
    scenario: ShuffleScenario, s3_stand_in: S3StandIn, store_url: str
) -> None:
    """Availability alone (what an engine asks before each stage): the manifest looked up,
    no GET of it or of the index; a partition whose objects were deleted is lost."""
    descriptors, _ = scenario.produce(make_batches(4_000), partitions=4, subpartitions=2)
    job = scenario.job.job_id
    s3_stand_in.reset()
    found = scenario.master.partitions_with_metrics(job, statistics=False).result()
    assert [entry.available for entry in found] == [True] * 4
    assert s3_stand_in.counts() == {"HEAD": 4}
    lost = descriptors[2].result_partition_id
    store = Store(store_url)
    store.delete_tree(partition_directory(store, lost))
    found = scenario.master.partitions_with_metrics(job, statistics=False).result()
    assert [entry.available for entry in found] == [True, True, False, True]
    assert scenario.job.lost == [lost]


def test_an_attempt_left_half_written_goes_with_its_job(
    scenario: ShuffleScenario, store_url: str
) -> None:
    descriptors, _ = scenario.produce(make_batches(1_000), partitions=1, subpartitions=2)
    # A producer that died while writing another attempt: nothing registered it.
    partition = descriptors[0].result_partition_id
    store = Store(store_url)
    orphan = partition_directory(store, ResultPartitionID(partition.partition_id, "dead"))
    store.put_atomic(store.child(orphan, "data"), b"half of a partition")
    # Released first, as an engine releases what it read before its job ends.
    scenario.master.release_partition_externally(descriptors[0])
    assert len(objects_under(store_url)) == 1

    scenario.master.unregister_job(scenario.job.job_id)
    assert objects_under(store_url) == []


def test_a_reducer_reads_a_block_with_one_get_and_never_lists(
    scenario: ShuffleScenario, s3_stand_in: S3StandIn
) -> None:
    """Per map output, its manifest and index once per process (then cached), and a ranged
    GET per block: no HEAD, no LIST."""
    batches = make_batches(6_000, batch_rows=1_000)
    descriptors, _ = scenario.produce(batches, partitions=4, subpartitions=3)
    s3_stand_in.reset()
    scenario.read(scenario.consumer, descriptors, SubpartitionRange.single(0))
    assert s3_stand_in.counts() == {"GET": 3 * 4}
    s3_stand_in.reset()
    scenario.read(scenario.consumer, descriptors, SubpartitionRange.single(1))
    assert s3_stand_in.counts() == {"GET": 4}


def test_an_executor_on_an_object_store_serves_no_data_port(store_url: str) -> None:
    """Its blocking partitions are read from the store; a pipelined one, which lives in the
    writer's memory, could be read by no other process: refused."""
    configuration = Configuration.load({"netty-like.storage.url": store_url}, environ={})
    context = ShuffleEnvironmentContext(configuration, host="127.0.0.1", executor_pid=os.getpid())
    with NettyShuffleEnvironment(context) as environment:
        assert environment.start() == LOCAL_ONLY_PORT
        partition = PartitionDescriptor(
            "pipelined",
            1,
            IntermediateResultPartitionID("pipelined", 0),
            ResultPartitionType.PIPELINED,
            2,
        )
        producer = environment.producer_descriptor("attempt")
        shuffle_descriptor = environment.describe_unregistered(
            ResultPartitionID(partition.partition_id, "attempt"), producer
        )
        with pytest.raises(InvalidOperationError, match="blocking partitions only"):
            environment.create_result_partition_writers(
                ShuffleIOOwner("map", "attempt"),
                [ResultPartitionDeploymentDescriptor(partition, shuffle_descriptor)],
            )


def test_dynamic_allocation_removes_executors_between_stages_and_nothing_reruns(
    tmp_path: Path,
) -> None:
    """On ``local-cluster`` with Spark's dynamic allocation and no external shuffle service:
    the map stage's output on the object store holds no executor, so it leaves once idle;
    the reduce stage's new one reads every row, and no map task runs again."""
    outcomes = run_application("dynamic_allocation", tmp_path)
    outcome = step(outcomes, "executors_leave_between_stages")
    assert outcome["held_by_spark"] is False
    assert outcome["executors_between_stages"] == 0
    assert outcome["equal"] is True
    assert outcome["executors_after"] > 0
    assert set(outcome["runs"].values()) == {1}
    assert outcome["map_tasks_rerun"] == 0
    assert outcome["files_before_close"] > 0
    assert outcome["files_after_close"] == []
