"""PySpark on ``local-cluster[2,1,1024]``: two executor JVMs, each with its own store, as two
hosts would have; reducers read the other executor's partitions over its data port. Then the
default service on an object store both executors share (moto's S3 server standing in).

Each service's scenarios run as the steps of one application in a process of its own
(:mod:`tests.integration.cluster_jobs`): one SparkContext per process, and this run's is a
``local[2]`` one.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.cluster_applications import Outcomes, run_application, step
from tests.integration.cluster_jobs import CORE_OPERATIONS, DATA_PORT_OPERATIONS

# Each service's application runs all its steps (cluster_jobs.PLANS) on four JVMs: on CI's two
# busy cores one took up to ten minutes, and a module fixture's setup counts in its first test.
pytestmark = pytest.mark.timeout(1500)


@pytest.fixture(scope="module")
def netty_like_application(tmp_path_factory: pytest.TempPathFactory) -> Outcomes:
    """The default service with a store per executor."""
    return run_application("netty_like", tmp_path_factory.mktemp("netty_like"))


@pytest.fixture(scope="module")
def external_shuffle_application(tmp_path_factory: pytest.TempPathFactory) -> Outcomes:
    """The external service (two worker daemons), read only through its workers."""
    return run_application("external_shuffle", tmp_path_factory.mktemp("external_shuffle"))


def _operations(request: pytest.FixtureRequest, service: str) -> dict[str, Any]:
    outcomes: Outcomes = request.getfixturevalue(f"{service}_application")
    return step(outcomes, "operations")


@pytest.fixture(params=["netty_like", "external_shuffle"])
def operations(request: pytest.FixtureRequest) -> dict[str, Any]:
    return _operations(request, request.param)


@pytest.mark.parametrize(
    ("service", "operation"),
    [
        *(("netty_like", operation) for operation in DATA_PORT_OPERATIONS),
        *(("external_shuffle", operation) for operation in CORE_OPERATIONS),
    ],
)
def test_operations_across_two_executors_equal_spark(
    request: pytest.FixtureRequest, service: str, operation: str
) -> None:
    assert _operations(request, service)["equal"][operation] is True


def test_close_leaves_no_file_on_any_store(operations: dict[str, Any]) -> None:
    assert operations["files_before_close"] > 0
    assert operations["files_after_close"] == []


def test_an_executor_killed_during_the_map_stage_costs_nothing(
    netty_like_application: Outcomes,
) -> None:
    outcome = step(netty_like_application, "kill_during_map")
    assert len(outcome["killed"]) == 1
    assert outcome["equal"] is True
    assert outcome["files_after_close"] == []


def test_an_executor_killed_during_the_reduce_stage_is_recovered_inside_the_action(
    netty_like_application: Outcomes,
) -> None:
    outcome = step(netty_like_application, "kill_during_reduce")
    assert len(outcome["killed"]) == 1
    # No error, no call of the user's: Spark reran the lost map tasks inside the action.
    assert outcome["action_error"] == ""
    assert outcome["equal"] is True
    # Only the producers that lived on the killed executor ran again, and the statistics
    # say so.
    runs = outcome["runs"]
    assert 0 < sum(count > 1 for count in runs.values()) < len(runs)
    assert outcome["map_tasks_rerun"] == sum(count - 1 for count in runs.values())
    assert outcome["files_after_close"] == []


def test_a_worker_killed_during_the_reduce_stage_costs_nothing_by_default(
    external_shuffle_application: Outcomes,
) -> None:
    # Two replicas, the external service's default: the reducers read the other one.
    outcome = step(external_shuffle_application, "kill_during_reduce")
    assert len(outcome["killed"]) == 1
    assert outcome["action_error"] == ""
    assert outcome["equal"] is True
    assert set(outcome["runs"].values()) == {1}
    assert outcome["map_tasks_rerun"] == 0
    assert not [path for path in outcome["files_after_close"] if "worker-1-store" in path]


def test_a_worker_killed_during_the_reduce_stage_with_one_replica_is_recovered_by_recover(
    external_shuffle_application: Outcomes,
) -> None:
    # With one replica nothing Spark sees is lost, so the action fails naming the partition;
    # recover() reruns only the producers whose partitions were lost.
    outcome = step(external_shuffle_application, "kill_during_reduce_one_replica")
    assert "PartitionNotFoundError" in outcome["action_error"]
    assert outcome["equal"] is True
    runs = outcome["runs"]
    assert 0 < sum(count > 1 for count in runs.values()) < len(runs)
    # The killed worker's store stays until it comes back (it then deletes what nobody
    # tracks); the live worker's is empty.
    assert not [path for path in outcome["files_after_close"] if "worker-1-store" in path]


@pytest.mark.parametrize(
    "label", ["object_store_kill_during_map", "object_store_kill_during_reduce"]
)
def test_an_executor_killed_with_its_partitions_on_an_object_store_reruns_nothing(
    netty_like_application: Outcomes, label: str
) -> None:
    """Partitions on a store every host sees outlive their executor: Spark keeps no shuffle
    for them, and no map task runs twice (on the executors' own disks, the same kill during
    the reduce stage reruns most of them: the test above)."""
    outcome = step(netty_like_application, label)
    assert len(outcome["killed"]) == 1
    assert outcome.get("action_error", "") == ""
    assert outcome["equal"] is True
    assert outcome["held_by_spark"] is False
    assert set(outcome["runs"].values()) == {1}
    assert outcome["map_tasks_rerun"] == 0
    assert outcome["files_before_close"] > 0
    assert outcome["files_after_close"] == []
