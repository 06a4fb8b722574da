"""Registrations sent at once: a driver that registers a stage's map outputs makes a few
``RegisterPartitions`` calls, each placing what waits, where ``RegisterPartition`` would place
each alone; one the coordinator refuses fails alone. Real daemon processes on 127.0.0.1
(LocalCluster) and real gRPC."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future

import grpc
import pytest

from external_shuffle.local_cluster import LocalCluster
from external_shuffle.wire.channels import translate_rpc_error
from external_shuffle.wire.messages import MAX_REGISTRATIONS_A_CALL, key_of
from external_shuffle.wire.stubs import pb, pb_grpc
from shuffle_api import DataTooLargeError, ShuffleDescriptor, ShuffleError
from shuffle_api.testing import ShuffleScenario
from tests.reliability.external_cluster import ids, replicas, scenario_on
from tests.reliability.raw_worker import new_partition

# Past one call's limit: the master sends them in two calls at least.
PARTITIONS = MAX_REGISTRATIONS_A_CALL + 500


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("registration"), workers=2) as running:
        yield running


def register_at_once(
    scenario: ShuffleScenario, count: int, job_ids: dict[int, str] | None = None
) -> list[Future[ShuffleDescriptor]]:
    """Partitions 0..count-1, attempt ``attempt-<i>``, all submitted before any is waited
    for (as a driver registers a map stage's outputs); ``job_ids`` names another job for some."""
    return [
        scenario.master.register_partition_with_producer(
            (job_ids or {}).get(index, scenario.job.job_id),
            scenario.partition_descriptor(index, partitions=count, subpartitions=1),
            scenario.producer.producer_descriptor(f"attempt-{index}"),
        )
        for index in range(count)
    ]


def test_partitions_registered_at_once_are_placed_each_as_it_would_be_alone(
    cluster: LocalCluster,
) -> None:
    with scenario_on(cluster, **{"external-shuffle.replication-factor": 2}) as scenario:
        placed = [answer.result(timeout=60) for answer in register_at_once(scenario, PARTITIONS)]
        assert [p.producer_attempt_id for p in ids(placed)] == [
            f"attempt-{index}" for index in range(PARTITIONS)
        ]
        assert all(len({replica.worker_id for replica in replicas(d)}) == 2 for d in placed)
        held = Counter(replica.worker_id for d in placed for replica in replicas(d))
        assert sorted(held.values()) == [PARTITIONS, PARTITIONS]
        # Registering is idempotent: one alone now gets the place it got among the others.
        for index in range(0, PARTITIONS, 97):
            alone = scenario.register(
                scenario.partition_descriptor(index, partitions=PARTITIONS, subpartitions=1),
                f"attempt-{index}",
            )
            assert replicas(alone) == replicas(placed[index])


def test_a_registration_refused_among_others_fails_alone_and_the_others_are_placed(
    cluster: LocalCluster,
) -> None:
    refused = {7, 150}
    with scenario_on(cluster) as scenario:
        answers = register_at_once(scenario, 300, dict.fromkeys(refused, "job-never-registered"))
        for index, answer in enumerate(answers):
            if index in refused:
                with pytest.raises(ShuffleError, match="job-never-registered"):
                    answer.result(timeout=60)
            else:
                assert answer.result(timeout=60).result_partition_id.producer_attempt_id == (
                    f"attempt-{index}"
                )


def _request() -> pb.RegisterPartitionRequest:
    return pb.RegisterPartitionRequest(
        partition=key_of(new_partition()), number_of_subpartitions=2, replicas=1
    )


def test_the_coordinator_answers_registrations_in_their_order_and_bounds_a_call(
    cluster: LocalCluster,
) -> None:
    credential = [("authorization", "Bearer " + cluster.token_file.read_text().strip())]
    with grpc.insecure_channel(cluster.coordinator_address) as channel:
        coordinator = pb_grpc.CoordinatorStub(channel)
        requests = [_request() for _ in range(5)]
        answers = coordinator.RegisterPartitions(
            pb.RegisterPartitionsRequest(requests=requests), metadata=credential, timeout=10
        ).responses
        assert [answer.location.partition for answer in answers] == [
            request.partition for request in requests
        ]
        for request, answer in zip(requests, answers, strict=True):
            alone = coordinator.RegisterPartition(request, metadata=credential, timeout=10)
            assert alone.location == answer.location

        too_many = [_request() for _ in range(MAX_REGISTRATIONS_A_CALL + 1)]
        with pytest.raises(grpc.RpcError) as caught:
            coordinator.RegisterPartitions(
                pb.RegisterPartitionsRequest(requests=too_many), metadata=credential, timeout=10
            )
        error = translate_rpc_error(caught.value, "RegisterPartitions")
        assert type(error) is DataTooLargeError
        assert str(MAX_REGISTRATIONS_A_CALL) in str(error)
