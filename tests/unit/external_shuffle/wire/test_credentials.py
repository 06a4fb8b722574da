"""Credentials: signed with the cluster's secret, bound to a role, a name and an expiry;
refused when forged, signed with another secret, expired or malformed; each role may call only
its methods, and an application's only for its own application."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from external_shuffle.wire.credentials import (
    CLUSTER_CREDENTIAL,
    Credential,
    CredentialCheck,
    Role,
    operator_token,
)
from shuffle_api import (
    AuthenticationError,
    IntermediateResultPartitionID,
    InvalidIdentifierError,
    PermissionDeniedError,
    ResultPartitionID,
)

SECRET = "the-cluster-secret"
NOW = 1_800_000_000.0
LIST_WORKERS = "/pyshuffle.v1.external_shuffle.Coordinator/ListWorkers"
LIST_APPLICATIONS = "/pyshuffle.v1.external_shuffle.Coordinator/ListApplications"
DECOMMISSION = "/pyshuffle.v1.external_shuffle.Coordinator/DecommissionWorker"
WORKER_DECOMMISSION = "/pyshuffle.v1.external_shuffle.Worker/Decommission"
FETCH = "/pyshuffle.v1.external_shuffle.Worker/FetchData"
REGISTER_WORKER = "/pyshuffle.v1.external_shuffle.Coordinator/RegisterWorker"
REGISTER_APPLICATION = "/pyshuffle.v1.external_shuffle.Coordinator/RegisterApplication"
PUSH = "/pyshuffle.v1.external_shuffle.Worker/PushData"


@pytest.fixture
def now() -> list[float]:
    """The check's clock: a test moves it by setting ``now[0]``."""
    return [NOW]


@pytest.fixture
def check(now: list[float]) -> CredentialCheck:
    return CredentialCheck(SECRET, lambda: now[0])


def test_the_cluster_secret_is_the_cluster_role_and_may_call_anything(
    check: CredentialCheck,
) -> None:
    credential = check.credential_of(SECRET.encode())
    assert credential == Credential(Role.CLUSTER, "cluster", None)
    for method in (LIST_WORKERS, DECOMMISSION, FETCH, REGISTER_WORKER):
        credential.check_may_call(method)


@pytest.mark.parametrize("role", [Role.READER, Role.ADMIN])
def test_an_operator_credential_names_its_holder_until_it_expires(
    check: CredentialCheck, now: list[float], role: Role
) -> None:
    token = operator_token(SECRET, role, "alice", int(NOW) + 60)
    assert check.credential_of(token.encode()) == Credential(role, "alice", int(NOW) + 60)
    now[0] = NOW + 60
    with pytest.raises(AuthenticationError, match=f"{role.value} credential of 'alice' expired"):
        check.credential_of(token.encode())


def test_a_reader_lists_an_admin_also_decommissions_neither_touches_data(
    check: CredentialCheck,
) -> None:
    reader = check.credential_of(operator_token(SECRET, Role.READER, "r", int(NOW) + 60).encode())
    admin = check.credential_of(operator_token(SECRET, Role.ADMIN, "a", int(NOW) + 60).encode())
    for credential in (reader, admin):
        credential.check_may_call(LIST_WORKERS)
        credential.check_may_call(LIST_APPLICATIONS)
        with pytest.raises(PermissionDeniedError, match="needs an application's credential"):
            credential.check_may_call(FETCH)
        with pytest.raises(PermissionDeniedError, match="needs the cluster's secret"):
            credential.check_may_call(REGISTER_WORKER)
    admin.check_may_call(DECOMMISSION)
    with pytest.raises(PermissionDeniedError, match=r"reader 'r'.*needs an admin credential"):
        reader.check_may_call(DECOMMISSION)
    # Through a coordinator only: it passes it on to the worker with the cluster's secret.
    with pytest.raises(PermissionDeniedError, match=r"admin 'a'.*needs the cluster's secret"):
        admin.check_may_call(WORKER_DECOMMISSION)


def test_forged_foreign_and_malformed_tokens_are_refused_alike(check: CredentialCheck) -> None:
    good = operator_token(SECRET, Role.READER, "alice", int(NOW) + 60)
    payload, _, signature = good.rpartition(":")
    refused = [
        b"",
        b"another-secret",
        operator_token("another-secret", Role.ADMIN, "alice", int(NOW) + 60).encode(),
        # The role or the expiry changed under the same signature.
        f"{payload.replace('reader', 'admin')}:{signature}".encode(),
        f"{payload[:-1]}9:{signature}".encode(),
        f"{good}:extra".encode(),
        good.encode()[:-1],
        b"pyshuffle:reader:alice:soon:" + signature.encode(),
        b"pyshuffle:" + "\u00e9".encode() + b":x:1:y",
        b"pyshuffle:" + b"x" * 600,
        # Signed with the secret itself, not with the key derived from it for credentials.
        f"{payload}:{_signed(SECRET.encode(), payload)}".encode(),
    ]
    for token in refused:
        with pytest.raises(AuthenticationError, match=r"^wrong token$"):
            check.credential_of(token)


def test_no_credential_of_the_cluster_role_nor_for_a_bad_name_is_issued() -> None:
    with pytest.raises(InvalidIdentifierError, match="admin, reader, client"):
        operator_token(SECRET, Role.CLUSTER, "alice", int(NOW))
    with pytest.raises(InvalidIdentifierError):
        operator_token(SECRET, Role.READER, "a:b", int(NOW))
    # Signed for the cluster role by hand (with the secret), it is still refused.
    payload = f"pyshuffle:cluster:alice:{int(NOW) + 60}"
    key = hmac.new(SECRET.encode(), b"pyshuffle operator credential v1", hashlib.sha256).digest()
    signature = _signed(key, payload)
    check = CredentialCheck(SECRET, lambda: NOW)
    with pytest.raises(AuthenticationError, match=r"^wrong token$"):
        check.credential_of(f"{payload}:{signature}".encode())


def _signed(key: bytes, payload: str) -> str:
    digest = hmac.new(key, payload.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def test_a_client_only_registers_and_an_application_acts_for_itself_only(
    check: CredentialCheck,
) -> None:
    client = check.credential_of(
        operator_token(SECRET, Role.CLIENT, "team-a", int(NOW) + 60).encode()
    )
    client.check_may_call(REGISTER_APPLICATION)
    for method in (FETCH, PUSH, LIST_WORKERS, DECOMMISSION):
        with pytest.raises(PermissionDeniedError, match="client 'team-a'"):
            client.check_may_call(method)
    issued = check.application_token("app-a", 60)
    assert issued.startswith("pyshuffle:application:app-a:")
    application = check.credential_of(issued.encode())
    assert application == Credential(Role.APPLICATION, "app-a", int(NOW) + 60)
    for method in (REGISTER_APPLICATION, FETCH, PUSH):
        application.check_may_call(method)
    for method in (LIST_WORKERS, DECOMMISSION, REGISTER_WORKER):
        with pytest.raises(PermissionDeniedError, match="application 'app-a'"):
            application.check_may_call(method)
    application.check_application("app-a", "fetch partition p of")
    for other in ("app-b", ""):
        with pytest.raises(
            PermissionDeniedError,
            match=rf"application 'app-a' may not fetch partition p of (application {other}|no)",
        ):
            application.check_application(other, "fetch partition p of")
    CLUSTER_CREDENTIAL.check_application("app-b", "fetch partition p of")
    # A client's name prefixes its applications' ids: no '.', which would let one client's
    # ids pass for another's.
    with pytest.raises(InvalidIdentifierError, match=r"no '\.'"):
        operator_token(SECRET, Role.CLIENT, "team.prod", int(NOW) + 60)
    # An application's credential is the coordinator's to issue, not an operator's.
    with pytest.raises(InvalidIdentifierError):
        operator_token(SECRET, Role.APPLICATION, "app-a", int(NOW) + 60)


def _partition(result_id: str, attempt: str = "attempt-1") -> ResultPartitionID:
    return ResultPartitionID(IntermediateResultPartitionID(result_id, 0), attempt)


def test_a_placement_holds_for_its_partition_and_application_only(check: CredentialCheck) -> None:
    partition = _partition("result-a")
    mine = Credential(Role.APPLICATION, "app-a", int(NOW) + 60)
    placement = check.placement(partition, "app-a")
    check.check_placement(mine, partition, placement, "push into")
    # Any secret's placement is the same (any coordinator signs it), another secret's is not.
    assert CredentialCheck(SECRET).placement(partition, "app-a") == placement
    assert CredentialCheck("another-secret").placement(partition, "app-a") != placement
    refused = [
        (mine, _partition("result-a", "attempt-2"), placement),  # another attempt
        (mine, _partition("result-b"), placement),  # another partition
        (Credential(Role.APPLICATION, "app-b", int(NOW) + 60), partition, placement),
        (mine, partition, b""),
        (mine, partition, placement[:-1]),
        (mine, partition, CredentialCheck("another-secret").placement(partition, "app-a")),
    ]
    for caller, placed, presented in refused:
        with pytest.raises(PermissionDeniedError, match="no coordinator placed it"):
            check.check_placement(caller, placed, presented, "push into")
    # The cluster's secret is trusted with every partition.
    check.check_placement(CLUSTER_CREDENTIAL, partition, b"", "push into")
