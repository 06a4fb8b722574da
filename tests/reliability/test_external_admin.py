"""``pyshuffle admin`` as an operator runs it against a real cluster: workers with their state,
partitions and disk; applications with their partitions (as tables or JSON); decommissioning a
worker, after which new partitions go elsewhere and its own stay readable, and cancelling that."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from external_shuffle.client.descriptor import ExternalShuffleDescriptor
from external_shuffle.client.master import ExternalShuffleMaster
from external_shuffle.local_cluster import LocalCluster
from external_shuffle.wire.channels import translate_rpc_error
from external_shuffle.wire.credentials import Role, grpc_method, operator_token
from external_shuffle.wire.messages import WorkerAddress
from external_shuffle.wire.stubs import pb, pb_grpc
from shuffle_api import (
    ApplicationIdentity,
    Configuration,
    PermissionDeniedError,
    ShuffleMasterContext,
)
from shuffle_api.ids import new_id
from tests.eventually import eventually
from tests.port_forward import port_forward
from tests.pyshuffle_command import WITHOUT_PYSHUFFLE_VARIABLES, pyshuffle
from tests.refused_port import refused_port
from tests.reliability.external_cluster import (
    ALL,
    PARTITIONS,
    ROWS,
    SUBPARTITIONS,
    batches,
    external,
    rows_of,
    scenario_on,
    scrape,
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("admin"), workers=2, metrics=True) as running:
        yield running


def admin(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    config = str(cluster.client_config_file())
    return pyshuffle("admin", "--config", config, *args, env=WITHOUT_PYSHUFFLE_VARIABLES)


def _rows(output: str) -> dict[str, list[str]]:
    """The table's rows by their first cell (cells are two or more spaces apart)."""
    rows = [re.split(r"\s{2,}", line) for line in output.splitlines()[1:]]
    return {row[0]: row for row in rows}


def _partitions_per_worker(cluster: LocalCluster) -> list[int]:
    listed = admin(cluster, "workers")
    assert listed.returncode == 0, listed.stderr
    return sorted(int(row[4]) for row in _rows(listed.stdout).values())


def test_workers_and_applications_are_listed_with_their_partitions(
    cluster: LocalCluster,
) -> None:
    with scenario_on(cluster) as scenario:
        scenario.produce(batches(), partitions=PARTITIONS, subpartitions=SUBPARTITIONS)
        # Workers report what they hold on their next heartbeat; placement is balanced.
        eventually(
            lambda: _partitions_per_worker(cluster) == [PARTITIONS // 2, PARTITIONS // 2],
            "each worker listed with half of the partitions",
        )
        workers = admin(cluster, "workers")
        applications = admin(cluster, "applications")
        application_id = external(scenario.master).application_id
    assert workers.stdout.split()[:3] == ["worker", "address", "state"]
    rows = _rows(workers.stdout)
    assert {row[1] for row in rows.values()} == {cluster.worker_target(i) for i in range(2)}
    assert {row[2] for row in rows.values()} == {"alive"}
    assert all(row[6] != "-" for row in rows.values())  # free bytes of a local store
    assert applications.returncode == 0, applications.stderr
    # Partitions, then bytes held (test_external_quota.py counts them).
    assert _rows(applications.stdout)[application_id][-2] == str(PARTITIONS)


def test_a_decommissioned_worker_takes_no_new_partitions_and_keeps_serving_its_own(
    cluster: LocalCluster,
) -> None:
    with scenario_on(cluster, **{"external-shuffle.replication-factor": 1}) as scenario:
        before, _ = scenario.produce(batches(), partitions=PARTITIONS, subpartitions=SUBPARTITIONS)
        target = cluster.worker_target(0)
        done = admin(cluster, "decommission", target)
        assert done.returncode == 0, done.stderr
        assert f"{target} is decommissioning" in done.stdout
        assert _rows(admin(cluster, "workers").stdout)[_worker_id(cluster, 0)][2] == (
            "decommissioning"
        )
        first_result, scenario.result_id = scenario.result_id, "result-" + new_id()
        after, _ = scenario.produce(batches(), partitions=PARTITIONS, subpartitions=SUBPARTITIONS)
        placed = {replica.target for d in after for replica in _replicas(d)}
        assert placed == {cluster.worker_target(1)}
        scenario.result_id = first_result
        assert rows_of(scenario.read(scenario.consumer, before, ALL)) == list(range(ROWS))


def _worker_id(cluster: LocalCluster, index: int) -> str:
    rows = _rows(admin(cluster, "workers").stdout)
    [worker_id] = [key for key, row in rows.items() if row[1] == cluster.worker_target(index)]
    return worker_id


def _replicas(descriptor: object) -> tuple[WorkerAddress, ...]:
    assert isinstance(descriptor, ExternalShuffleDescriptor)
    return descriptor.replicas


def test_an_unknown_worker_is_a_clear_error(cluster: LocalCluster) -> None:
    done = admin(cluster, "decommission", "worker-nobody")
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "no worker 'worker-nobody' is known" in done.stderr
    for index in range(2):  # each known worker named once
        assert done.stderr.count(_worker_id(cluster, index)) == 1


def test_the_listings_as_json_carry_plain_numbers(cluster: LocalCluster) -> None:
    with scenario_on(cluster) as scenario:
        scenario.produce(batches(), partitions=PARTITIONS, subpartitions=SUBPARTITIONS)
        application_id = external(scenario.master).application_id
        eventually(
            lambda: sum(w["partitions"] for w in _json(cluster, "workers")) >= PARTITIONS,
            "the workers' partitions heard by the coordinator",
        )
        workers = _json(cluster, "workers")
        applications = _json(cluster, "applications")
    assert {worker["target"] for worker in workers} == {cluster.worker_target(i) for i in range(2)}
    for worker in workers:
        assert set(worker) == {
            "worker_id",
            "target",
            "state",
            "seconds_since_heartbeat",
            "partitions",
            "stored_bytes",
            "free_bytes",
        }
        assert worker["state"] in ("alive", "decommissioning")
        assert isinstance(worker["stored_bytes"], int)
        assert isinstance(worker["free_bytes"], int) and worker["free_bytes"] > 0  # local stores
        assert 0 <= worker["seconds_since_heartbeat"] < 10
    assert sum(worker["stored_bytes"] for worker in workers) > 0
    [application] = [a for a in applications if a["application_id"] == application_id]
    assert application["partitions"] == PARTITIONS


def _json(cluster: LocalCluster, listing: str) -> list[dict[str, Any]]:
    """``admin LISTING --json``: one JSON document on stdout, the listing under its name."""
    listed = admin(cluster, listing, "--json")
    assert listed.returncode == 0, listed.stderr
    document = json.loads(listed.stdout)
    assert list(document) == [listing]
    records: list[dict[str, Any]] = document[listing]
    return records


def _state(cluster: LocalCluster, index: int) -> object:
    [state] = [
        worker["state"]
        for worker in _json(cluster, "workers")
        if worker["target"] == cluster.worker_target(index)
    ]
    return state


def test_a_cancelled_decommission_takes_new_partitions_again(cluster: LocalCluster) -> None:
    target = cluster.worker_target(1)
    done = admin(cluster, "decommission", target)
    assert done.returncode == 0, done.stderr
    assert _state(cluster, 1) == "decommissioning"
    cancelled = admin(cluster, "cancel-decommission", target)
    assert cancelled.returncode == 0, cancelled.stderr
    assert f"{target} takes new partitions again" in cancelled.stdout
    assert _state(cluster, 1) == "alive"  # the command returns once the coordinator knows
    with scenario_on(cluster, **{"external-shuffle.replication-factor": 1}) as scenario:
        placed, _ = scenario.produce(batches(), partitions=PARTITIONS, subpartitions=SUBPARTITIONS)
    assert target in {replica.target for d in placed for replica in _replicas(d)}


def _credential(cluster: LocalCluster, role: str) -> str:
    issued = admin(cluster, "credential", "--role", role, "--name", f"{role}-op", "--days", "1")
    assert issued.returncode == 0, issued.stderr
    return issued.stdout.strip()


def _operator_config(
    cluster: LocalCluster, directory: Path, token: str, coordinator: str | None = None
) -> str:
    """A config an operator holds: the coordinator's address (``coordinator``: another route to
    it) and their own credential."""
    directory.mkdir()
    token_file = directory / "token"
    token_file.write_text(token)
    config = directory / "operator.toml"
    config.write_text(
        f'"external-shuffle.coordinator.address" = "{coordinator or cluster.coordinator_address}"\n'
        f'"external-shuffle.auth.token-file" = "{token_file}"\n'
    )
    return str(config)


def _operator(config: str, *args: str) -> subprocess.CompletedProcess[str]:
    return pyshuffle("admin", "--config", config, *args, env=WITHOUT_PYSHUFFLE_VARIABLES)


def _coordinator_refusals(cluster: LocalCluster) -> float:
    method = grpc_method("Coordinator", "DecommissionWorker")
    return scrape(cluster, "coordinator").get(
        f'pyshuffle_auth_failures_total{{method="{method}"}}', 0
    )


def test_a_reader_credential_lists_but_cannot_decommission_and_an_admin_one_can(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    reader = _operator_config(cluster, tmp_path / "reader", _credential(cluster, "reader"))
    listed = _operator(reader, "workers")
    assert listed.returncode == 0, listed.stderr
    assert {row[1] for row in _rows(listed.stdout).values()} == {
        cluster.worker_target(i) for i in range(2)
    }
    assert _operator(reader, "applications", "--json").returncode == 0
    target = cluster.worker_target(1)
    refusals = _coordinator_refusals(cluster)
    refused = _operator(reader, "decommission", target)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "PermissionDeniedError" in refused.stderr
    assert "reader 'reader-op': it needs an admin credential" in refused.stderr
    assert _coordinator_refusals(cluster) == refusals + 1
    assert f"refused {grpc_method('Coordinator', 'DecommissionWorker')}" in (
        (cluster.directory / "coordinator.log").read_text()
    )
    assert _rows(listed.stdout)[_worker_id(cluster, 1)][2] == "alive"
    assert _rows(admin(cluster, "workers").stdout)[_worker_id(cluster, 1)][2] == "alive"

    operator = _operator_config(cluster, tmp_path / "admin", _credential(cluster, "admin"))
    done = _operator(operator, "decommission", target)
    assert done.returncode == 0, done.stderr
    assert _rows(admin(cluster, "workers").stdout)[_worker_id(cluster, 1)][2] == "decommissioning"
    assert _operator(operator, "cancel-decommission", target).returncode == 0
    assert _rows(admin(cluster, "workers").stdout)[_worker_id(cluster, 1)][2] == "alive"


def test_operator_credentials_touch_no_data_and_expire(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    secret = cluster.token_file.read_text().strip()
    channel = grpc.insecure_channel(cluster.worker_target(0))
    try:
        worker = pb_grpc.WorkerStub(channel)
        for role in (Role.ADMIN, Role.READER):
            token = operator_token(secret, role, "someone", int(time.time()) + 60)
            with pytest.raises(grpc.RpcError) as caught:
                worker.GetPartitionStatus(
                    pb.WorkerPartitionStatusRequest(),
                    metadata=[("authorization", f"Bearer {token}")],
                    timeout=10,
                )
            error = translate_rpc_error(caught.value, "GetPartitionStatus")
            assert type(error) is PermissionDeniedError, error
            assert "needs an application's credential" in str(error)
    finally:
        channel.close()
    expired = operator_token(secret, Role.ADMIN, "former", int(time.time()) - 1)
    refused = _operator(_operator_config(cluster, tmp_path / "expired", expired), "workers")
    assert refused.returncode == 1
    assert "AuthenticationError" in refused.stderr
    assert "admin credential of 'former' expired" in refused.stderr
    # A credential cannot sign another: only the cluster's secret does.
    issued = _operator(
        _operator_config(cluster, tmp_path / "chain", _credential(cluster, "admin")),
        "credential",
        "--role",
        "admin",
        "--name",
        "next",
    )
    assert issued.returncode == 1 and "signed with the cluster's secret" in issued.stderr


def test_an_application_is_listed_with_who_its_engine_says_it_is(cluster: LocalCluster) -> None:
    """Spark's id, name and user of an application (cut to 256 characters each), in the
    table and the JSON; "-" where a client did not say."""
    identity = ApplicationIdentity("local-1795950000000", "nightly " + "x" * 300, "etl")
    config = Configuration.load(cluster.client_config(), environ={})
    master = ExternalShuffleMaster(ShuffleMasterContext(config, application=identity))
    try:
        master.start()
        [listed] = [
            a
            for a in _json(cluster, "applications")
            if a["application_id"] == master.application_id
        ]
        table = _rows(admin(cluster, "applications").stdout)[master.application_id]
    finally:
        master.close()
    assert (listed["engine_id"], listed["name"], listed["user"]) == (
        "local-1795950000000",
        ("nightly " + "x" * 300)[:256],
        "etl",
    )
    assert table[1:4] == ["local-1795950000000", listed["name"], "etl"]


def test_decommission_goes_through_a_coordinator_only(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    # As through `kubectl port-forward` to one coordinator: the operator's only route, and an
    # admin credential is refused by the workers themselves.
    worker_id = _worker_id(cluster, 0)
    token = _credential(cluster, "admin")
    with pytest.raises(PermissionDeniedError, match="the cluster's secret"):
        _direct_decommission(cluster.worker_target(0), token)
    with port_forward(cluster.coordinator_targets[0]) as port:
        operator = _operator_config(cluster, tmp_path / "op", token, f"127.0.0.1:{port}")
        done = _operator(operator, "decommission", worker_id)
        assert done.returncode == 0, done.stderr
        assert _rows(_operator(operator, "workers").stdout)[worker_id][2] == "decommissioning"
        # Every worker of this cluster shares the host's name: it names none alone.
        several = _operator(operator, "cancel-decommission", socket.gethostname())
        assert several.returncode == 1
        assert "names several workers" in several.stderr and worker_id in several.stderr
        assert _operator(operator, "cancel-decommission", worker_id).returncode == 0
    assert _rows(admin(cluster, "workers").stdout)[worker_id][2] == "alive"
    coordinator_log = (cluster.directory / "coordinator.log").read_text()
    assert "decommissioning a worker, asked by admin 'admin-op'" in coordinator_log
    assert "cancelling the decommission of a worker, asked by admin 'admin-op'" in coordinator_log
    assert "no new partitions (asked by the cluster's secret)" in (
        (cluster.directory / "worker-0.log").read_text()
    )


def _direct_decommission(target: str, token: str) -> None:
    with grpc.insecure_channel(target) as channel:
        try:
            pb_grpc.WorkerStub(channel).Decommission(
                pb.DecommissionRequest(),
                metadata=[("authorization", f"Bearer {token}")],
                timeout=10,
            )
        except grpc.RpcError as error:
            raise translate_rpc_error(error, f"decommissioning {target}") from error


def test_admin_runs_beside_a_daemon_whose_variables_it_shares(cluster: LocalCluster) -> None:
    # As `kubectl exec` into a daemon's container: its PYSHUFFLE_* variables set daemon keys.
    listed = pyshuffle(
        "admin",
        "--config",
        str(cluster.client_config_file()),
        "workers",
        env={**WITHOUT_PYSHUFFLE_VARIABLES, "PYSHUFFLE_EXTERNAL_SHUFFLE_WORKER_PORT": "9098"},
    )
    assert listed.returncode == 0, listed.stderr


def test_a_misspelled_key_is_refused_at_once_with_a_hint(tmp_path: Path) -> None:
    config = tmp_path / "client.toml"
    config.write_text('"external-shuffle.coordinator.adress" = "127.0.0.1:1"\n')
    refused = pyshuffle(
        "admin", "--config", str(config), "workers", env=WITHOUT_PYSHUFFLE_VARIABLES
    )
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "did you mean 'external-shuffle.coordinator.address'?" in refused.stderr


def test_a_coordinator_that_does_not_answer_is_named_within_seconds(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    with refused_port() as port:
        address = f"127.0.0.1:{port}"
        operator = _operator_config(
            cluster, tmp_path / "op", cluster.token_file.read_text(), address
        )
        started = time.monotonic()
        failed = _operator(operator, "workers")
    assert failed.returncode == 1 and "Traceback" not in failed.stderr
    assert f"listing workers on coordinators {address}" in failed.stderr
    assert "gave up after retrying for 3.0 s" in failed.stderr
    assert time.monotonic() - started < 30  # not the 60 s a job's calls retry for
