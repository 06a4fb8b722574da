"""Applications kept apart on real daemons. Drivers hold a client's credential, which only
registers applications; each registration gets the application a credential of its own, which
its driver and executors present. With it an application shuffles as before, and touches no
other application's partition: application B cannot fetch, push into, commit or release
application A's partitions, on the worker or through the coordinator; each refusal is a
PermissionDeniedError naming both, counted and logged. An expired application credential is
refused, and so is the credential of an application that ended; no other team's client may
register a running application's id (which would get it that application's credential)."""

from __future__ import annotations

import dataclasses
import functools
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import grpc
import pytest

from external_shuffle.client.descriptor import ExternalShuffleDescriptor
from external_shuffle.client.master import ExternalShuffleMaster
from external_shuffle.local_cluster import LocalCluster
from external_shuffle.options import APPLICATION_CREDENTIAL
from external_shuffle.wire.channels import translate_rpc_error
from external_shuffle.wire.credentials import Role, application_token, operator_token
from external_shuffle.wire.messages import key_of
from external_shuffle.wire.stubs import pb, pb_grpc
from shuffle_api import (
    AuthenticationError,
    Configuration,
    IntermediateResultPartitionID,
    PermissionDeniedError,
    ResultPartitionID,
    ShuffleDescriptor,
    ShuffleError,
    SubpartitionRange,
)
from shuffle_api.ids import new_id
from shuffle_api.testing import ConformanceHarness, ShuffleScenario, make_batches
from tests.reliability.external_cluster import scrape
from tests.reliability.raw_worker import (
    SUBPARTITIONS,
    build_partition,
    new_partition,
    push_requests,
)

ROWS = 3_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("tenants"), workers=1, metrics=True) as running:
        yield running


@pytest.fixture(scope="module")
def team_config(cluster: LocalCluster) -> Configuration:
    """A team's drivers' configuration: a client's credential, not the cluster's secret."""
    secret = cluster.token_file.read_text().strip()
    credential_file = cluster.directory / "team-client-credential"
    credential_file.write_text(
        operator_token(secret, Role.CLIENT, "team", int(time.time()) + 3_600)
    )
    return Configuration.load(
        cluster.client_config(
            **{
                "external-shuffle.auth.token-file": str(credential_file),
                "external-shuffle.client.read-from-store": False,
            }
        ),
        environ={},
    )


@contextmanager
def _application(config: Configuration) -> Iterator[ShuffleScenario]:
    """An application whose producer and consumer are configured as its driver configures
    its executors (with the application's credential)."""
    with ShuffleScenario.open(ConformanceHarness(config)) as scenario:
        master = scenario.master
        assert isinstance(master, ExternalShuffleMaster)
        executors = config.with_values(master.environment_configuration())
        assert executors.get(APPLICATION_CREDENTIAL).startswith(
            f"pyshuffle:application:{master.application_id}:"
        )
        with (
            scenario.environment(executors) as producer,
            scenario.environment(executors) as consumer,
        ):
            yield dataclasses.replace(scenario, producer=producer, consumer=consumer)


def _credential(scenario: ShuffleScenario) -> list[tuple[str, str]]:
    master = scenario.master
    assert isinstance(master, ExternalShuffleMaster)
    token = master.environment_configuration()[APPLICATION_CREDENTIAL.key]
    return [("authorization", f"Bearer {token}")]


def _refusal(call: Callable[[], object], what: str) -> ShuffleError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return translate_rpc_error(caught.value, what)


def _rows(scenario: ShuffleScenario, descriptors: list[ShuffleDescriptor]) -> list[int]:
    table = scenario.read(scenario.consumer, descriptors, SubpartitionRange(0, 1))
    return sorted(table.column("row").to_pylist())


def test_an_application_reaches_its_own_partitions_and_no_other(
    cluster: LocalCluster, team_config: Configuration
) -> None:
    before = scrape(cluster, "worker-0")
    with _application(team_config) as first, _application(team_config) as second:
        descriptors, _ = first.produce(
            make_batches(ROWS, batch_rows=500), partitions=2, subpartitions=2
        )
        assert _rows(first, descriptors) == list(range(ROWS))
        first_id = first.master.application_id  # type: ignore[attr-defined]
        second_id = second.master.application_id  # type: ignore[attr-defined]
        mine = descriptors[0].result_partition_id
        both = rf"application '{second_id}' may not .* of application {first_id}"

        # Through the client, as B's reducers would read it: the worker's data port, keyed
        # by B's credential, then gRPC.
        posing = dataclasses.replace(second, result_id=first.result_id)
        with pytest.raises(PermissionDeniedError, match=both):
            _rows(posing, descriptors)
        with grpc.insecure_channel(cluster.worker_target(0)) as channel:
            refusal = _refusal(
                lambda: list(
                    pb_grpc.WorkerStub(channel).FetchData(
                        pb.FetchDataRequest(
                            partition=key_of(mine), first_subpartition=0, last_subpartition=1
                        ),
                        metadata=_credential(second),
                        timeout=30,
                    )
                ),
                "FetchData",
            )
        assert type(refusal) is PermissionDeniedError, refusal

        # Raw calls with B's credential.
        intruder = _credential(second)
        with grpc.insecure_channel(cluster.worker_target(0)) as channel:
            worker = pb_grpc.WorkerStub(channel)
            built = build_partition(partition=mine)
            chunks = built.chunks()
            refusals = [
                _refusal(
                    lambda: worker.PushData(
                        push_requests(key_of(mine), chunks, range(len(chunks))),
                        metadata=intruder,
                        timeout=30,
                    ),
                    "PushData",
                ),
                _refusal(
                    lambda: worker.CommitPartition(
                        pb.CommitPartitionRequest(
                            partition=key_of(mine),
                            index=built.index,
                            manifest=built.manifest,
                            application_id=second_id,
                        ),
                        metadata=intruder,
                        timeout=30,
                    ),
                    "CommitPartition",
                ),
                _refusal(
                    lambda: worker.ReleasePartitions(
                        pb.WorkerReleasePartitionsRequest(partitions=[key_of(mine)]),
                        metadata=intruder,
                        timeout=30,
                    ),
                    "ReleasePartitions",
                ),
            ]
            # Merging A's partition into one the coordinator placed for B.
            theirs = new_partition()
            with grpc.insecure_channel(cluster.coordinator_address) as placing:
                placed = pb_grpc.CoordinatorStub(placing).RegisterPartition(
                    pb.RegisterPartitionRequest(
                        application_id=second_id,
                        partition=key_of(theirs),
                        number_of_subpartitions=2,
                    ),
                    metadata=intruder,
                    timeout=30,
                )
            refusals.append(
                _refusal(
                    lambda: worker.MergePartitions(
                        pb.MergePartitionsRequest(
                            merged=key_of(theirs),
                            sources=[key_of(mine)],
                            number_of_subpartitions=2,
                            application_id=second_id,
                            placement=placed.placement,
                        ),
                        metadata=intruder,
                        timeout=30,
                    ),
                    "MergePartitions",
                )
            )
        with grpc.insecure_channel(cluster.coordinator_address) as channel:
            coordinator = pb_grpc.CoordinatorStub(channel)

            def release(claimed: str) -> object:
                return coordinator.ReleasePartitions(
                    pb.ReleasePartitionsRequest(application_id=claimed, partitions=[key_of(mine)]),
                    metadata=intruder,
                    timeout=30,
                )

            # As itself, or claiming to be A.
            for claimed in (second_id, first_id):
                refusals.append(_refusal(functools.partial(release, claimed), "ReleasePartitions"))
        for refusal in refusals:
            assert type(refusal) is PermissionDeniedError, refusal
            assert second_id in str(refusal) and first_id in str(refusal), refusal
        # Nothing of A's changed: every row is still there for A.
        assert _rows(first, descriptors) == list(range(ROWS))
    after = scrape(cluster, "worker-0")
    # A read over the data port, its handshake keyed by A's credential.
    requests = "pyshuffle_data_port_requests_total"
    assert after[requests] > before.get(requests, 0)
    methods = (
        "DataPort.Fetch",
        "FetchData",
        "PushData",
        "CommitPartition",
        "MergePartitions",
        "ReleasePartitions",
    )
    for method in methods:
        label = f'pyshuffle_auth_failures_total{{method="{method}"}}'
        assert after.get(label, 0) > before.get(label, 0), method
    log = (cluster.directory / "worker-0.log").read_text(errors="replace")
    refused = [line for line in log.splitlines() if "may not fetch" in line]
    assert len(refused) >= 2  # on the data port and over gRPC
    assert all(first_id in line and second_id in line for line in refused)


def test_a_partition_placed_for_one_application_is_written_by_it_alone(
    cluster: LocalCluster, team_config: Configuration
) -> None:
    """B, knowing the id of a partition the coordinator placed for A and A has not pushed
    yet, can neither push nor commit it (without a placement, with its own placement of
    another partition, or after asking the coordinator for one, alone or among partitions of
    its own): A then pushes, commits and reads every row, and its driver sees the partition
    available."""
    with (
        _application(team_config) as first,
        _application(team_config) as second,
        grpc.insecure_channel(cluster.coordinator_address) as coordinator_channel,
        grpc.insecure_channel(cluster.worker_target(0)) as worker_channel,
    ):
        coordinator = pb_grpc.CoordinatorStub(coordinator_channel)
        worker = pb_grpc.WorkerStub(worker_channel)
        first_id = first.master.application_id  # type: ignore[attr-defined]
        second_id = second.master.application_id  # type: ignore[attr-defined]
        owner, intruder = _credential(first), _credential(second)

        def request(
            application_id: str, partition: ResultPartitionID
        ) -> pb.RegisterPartitionRequest:
            return pb.RegisterPartitionRequest(
                application_id=application_id,
                job_id="job",
                partition=key_of(partition),
                number_of_subpartitions=SUBPARTITIONS,
            )

        def place(application_id: str, partition: ResultPartitionID) -> bytes:
            response = coordinator.RegisterPartition(
                request(application_id, partition),
                metadata=owner if application_id == first_id else intruder,
                timeout=10,
            )
            assert len(response.location.replicas) == 1  # the cluster's one worker
            return bytes(response.placement)

        for application_id in (first_id, second_id):
            coordinator.RegisterJob(
                pb.RegisterJobRequest(application_id=application_id, job_id="job"),
                metadata=owner if application_id == first_id else intruder,
                timeout=10,
            )
        mine = ResultPartitionID(
            IntermediateResultPartitionID(first.result_id, 0), "attempt-" + new_id()
        )
        placement = place(first_id, mine)
        built = build_partition(partition=mine)
        chunks = built.chunks()
        others = place(second_id, new_partition())
        assert placement and others and placement != others

        def push(metadata: list[tuple[str, str]], signed: bytes) -> object:
            requests = push_requests(built.key, chunks, range(len(chunks)), signed)
            return worker.PushData(requests, metadata=metadata, timeout=30)

        def commit(metadata: list[tuple[str, str]], signed: bytes) -> object:
            request = pb.CommitPartitionRequest(
                partition=built.key, index=built.index, manifest=built.manifest, placement=signed
            )
            return worker.CommitPartition(request, metadata=metadata, timeout=30)

        def merge(metadata: list[tuple[str, str]], signed: bytes) -> object:
            request = pb.MergePartitionsRequest(
                merged=built.key, number_of_subpartitions=SUBPARTITIONS, placement=signed
            )
            return worker.MergePartitions(request, metadata=metadata, timeout=30)

        refusals = [
            _refusal(functools.partial(call, intruder, signed), call.__name__)
            for call in (push, commit, merge)
            for signed in (b"", others, placement[:-1] + bytes([placement[-1] ^ 1]))
        ]
        refusals.append(_refusal(functools.partial(place, second_id, mine), "RegisterPartition"))
        # Nor among partitions of its own, registered at once.
        theirs = new_partition()
        refusals.append(
            _refusal(
                lambda: coordinator.RegisterPartitions(
                    pb.RegisterPartitionsRequest(
                        requests=[request(second_id, theirs), request(second_id, mine)]
                    ),
                    metadata=intruder,
                    timeout=10,
                ),
                "RegisterPartitions",
            )
        )
        for refusal in refusals:
            assert type(refusal) is PermissionDeniedError, refusal
            assert second_id in str(refusal), refusal
        placed_for_no_one = "no coordinator placed it for application"
        assert sum(placed_for_no_one in str(refusal) for refusal in refusals) == 9

        push(owner, placement)
        commit(owner, placement)
        status = coordinator.GetPartitionStatus(
            pb.GetPartitionStatusRequest(application_id=first_id, job_id="job"),
            metadata=owner,
            timeout=10,
        )
        assert [entry.available for entry in status.partitions] == [True]
        descriptor = ExternalShuffleDescriptor.placed(
            pb.RegisterPartitionResponse(location=status.partitions[0].location)
        )
        table = first.read(first.consumer, [descriptor], SubpartitionRange(0, SUBPARTITIONS - 1))
        assert sorted(table.column("row").to_pylist()) == built.rows


def test_a_client_credential_only_registers_and_an_expired_application_is_refused(
    cluster: LocalCluster,
) -> None:
    secret = cluster.token_file.read_text().strip()
    expired = application_token(secret, "app-gone", int(time.time()) - 1)
    client_token = operator_token(secret, Role.CLIENT, "team", int(time.time()) + 60)
    built = build_partition()
    chunks = built.chunks()
    with grpc.insecure_channel(cluster.worker_target(0)) as channel:
        worker = pb_grpc.WorkerStub(channel)

        def push(token: str) -> ShuffleError:
            return _refusal(
                lambda: worker.PushData(
                    push_requests(built.key, chunks, range(len(chunks))),
                    metadata=[("authorization", f"Bearer {token}")],
                    timeout=30,
                ),
                "PushData",
            )

        denied = push(client_token)
        assert type(denied) is PermissionDeniedError
        assert "needs an application's credential" in str(denied)
        gone = push(expired)
        assert type(gone) is AuthenticationError
        assert "application credential of 'app-gone' expired" in str(gone)


def test_no_client_takes_another_teams_application_and_an_ended_ones_credential_is_refused(
    cluster: LocalCluster, team_config: Configuration
) -> None:
    secret = cluster.token_file.read_text().strip()
    other_team = operator_token(secret, Role.CLIENT, "other-team", int(time.time()) + 60)
    with _application(team_config) as running:
        application_id = running.master.application_id  # type: ignore[attr-defined]
        credential = _credential(running)
        with grpc.insecure_channel(cluster.coordinator_address) as channel:
            coordinator = pb_grpc.CoordinatorStub(channel)
            # Registering a running application's id would get its credential.
            taken = _refusal(
                lambda: coordinator.RegisterApplication(
                    pb.RegisterApplicationRequest(application_id=application_id),
                    metadata=[("authorization", f"Bearer {other_team}")],
                    timeout=10,
                ),
                "RegisterApplication",
            )
            assert type(taken) is PermissionDeniedError, taken
            assert "other-team" in str(taken) and application_id in str(taken)
    # The application ended (its driver unregistered it): its credential holds no more.
    with grpc.insecure_channel(cluster.coordinator_address) as channel:
        coordinator = pb_grpc.CoordinatorStub(channel)
        for call in (
            lambda: coordinator.ApplicationHeartbeat(
                pb.ApplicationHeartbeatRequest(application_id=application_id),
                metadata=credential,
                timeout=10,
            ),
            lambda: coordinator.RegisterApplication(
                pb.RegisterApplicationRequest(application_id=application_id),
                metadata=credential,
                timeout=10,
            ),
        ):
            ended = _refusal(call, "after the end")
            assert type(ended) is AuthenticationError, ended
            assert "ended" in str(ended)
    # The worker hears of the end with its next heartbeat.
    built = build_partition()
    with grpc.insecure_channel(cluster.worker_target(0)) as channel:
        worker = pb_grpc.WorkerStub(channel)
        deadline = time.monotonic() + 15
        while True:
            try:
                worker.GetPartitionStatus(
                    pb.WorkerPartitionStatusRequest(partitions=[built.key]),
                    metadata=credential,
                    timeout=10,
                )
            except grpc.RpcError as error:
                refused = translate_rpc_error(error, "GetPartitionStatus")
                break
            assert time.monotonic() < deadline, "the worker still takes the credential"
            time.sleep(0.2)
    assert type(refused) is AuthenticationError, refused
    assert "ended" in str(refused)


def test_an_application_names_no_worker_and_no_client_names_anothers_applications(
    cluster: LocalCluster, team_config: Configuration
) -> None:
    secret = cluster.token_file.read_text().strip()
    other_team = operator_token(secret, Role.CLIENT, "other-team", int(time.time()) + 60)
    with (
        _application(team_config) as running,
        grpc.insecure_channel(cluster.coordinator_address) as channel,
    ):
        coordinator = pb_grpc.CoordinatorStub(channel)
        application_id = running.master.application_id  # type: ignore[attr-defined]
        assert application_id.startswith("team.app-")
        # A worker of its own making, which the coordinator would call with the secret: it
        # is tracked where the application says, and never called before it registers.
        with socket.create_server(("127.0.0.1", 0)) as made_up_port:
            made_up_port.settimeout(1.0)
            made_up = pb.WorkerInfo(
                worker_id="worker-made-up", host="127.0.0.1", port=made_up_port.getsockname()[1]
            )
            intruder = _credential(running)
            coordinator.RegisterJob(
                pb.RegisterJobRequest(application_id=application_id, job_id="job-x"),
                metadata=intruder,
                timeout=10,
            )
            coordinator.RegisterPartition(
                pb.RegisterPartitionRequest(
                    application_id=application_id,
                    job_id="job-x",
                    partition=key_of(build_partition().partition),
                    number_of_subpartitions=2,
                    placed_on=[made_up],
                ),
                metadata=intruder,
                timeout=10,
            )
            status = coordinator.GetPartitionStatus(
                pb.GetPartitionStatusRequest(application_id=application_id, job_id="job-x"),
                metadata=intruder,
                timeout=10,
            )
            assert [entry.available for entry in status.partitions] == [False]
            with pytest.raises(TimeoutError):
                made_up_port.accept()

        # A client registers ids named after it only.
        def register(name: str) -> object:
            return coordinator.RegisterApplication(
                pb.RegisterApplicationRequest(application_id=name),
                metadata=[("authorization", f"Bearer {other_team}")],
                timeout=10,
            )

        for name in (application_id, "app-anything", "other-team.prod.app-" + "0" * 32):
            taken = _refusal(functools.partial(register, name), "RegisterApplication")
            assert type(taken) is PermissionDeniedError, taken


def test_restarts_keep_each_partition_its_applications(
    cluster: LocalCluster, team_config: Configuration
) -> None:
    """A restarted worker and a restarted coordinator still know whose each partition is: its
    application reads it, another cannot release it."""
    with _application(team_config) as first, _application(team_config) as second:
        descriptors, _ = first.produce(
            make_batches(ROWS, batch_rows=500), partitions=2, subpartitions=2
        )
        first_id = first.master.application_id  # type: ignore[attr-defined]
        cluster.kill_worker(0)
        cluster.start_worker(0)
        cluster.wait_for_workers({cluster.worker_target(0)})
        assert _rows(first, descriptors) == list(range(ROWS))
        cluster.stop_coordinator()
        cluster.start_coordinator()
        cluster.wait_for_workers({cluster.worker_target(0)})
        with grpc.insecure_channel(cluster.coordinator_address) as channel:
            refused = _refusal(
                lambda: pb_grpc.CoordinatorStub(channel).ReleasePartitions(
                    pb.ReleasePartitionsRequest(
                        application_id=second.master.application_id,  # type: ignore[attr-defined]
                        partitions=[key_of(d.result_partition_id) for d in descriptors],
                    ),
                    metadata=_credential(second),
                    timeout=10,
                ),
                "ReleasePartitions",
            )
        assert type(refused) is PermissionDeniedError, refused
        assert first_id in str(refused)
        assert _rows(first, descriptors) == list(range(ROWS))
